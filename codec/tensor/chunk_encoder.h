// Picks the codec for one chunk: the smallest of the codecs that apply.
#pragma once

#include "codec/tensor/chunk_codec.h"

namespace ckptfs {

struct ChunkEncoding {
  ChunkCodec codec = ChunkCodec::kRaw;
  size_t stored_size = 0;  // bytes at the output buffer's start
};

// Encodes `data` (whole elements of `dtype`; kU8 for verbatim bytes) into
// `out` with the smallest applicable codec:
//   all-zero bytes            -> kZeros
//   f32/f16/bf16              -> kBytePlaneZstd, or kZstd when byte planes
//                                barely compress (then LZ may do better)
//   anything else             -> kZstd
//   with `base` (same length) -> also kBytePlaneXorZstd (floats) or
//                                kZstdWithBase (anything else), if smaller
//   nothing smaller than raw  -> kRaw
// REQUIRES: base is empty or data.size() long.
// Thread safety: uses only `scratch` and `out`; reentrant.
Result<ChunkEncoding> EncodeChunkBest(ByteSpan data, DType dtype, int zstd_level, ByteSpan base,
                                      CodecScratch& scratch, ScratchBuffer* out);

// True if every byte of `data` is zero.
bool IsAllZero(ByteSpan data);

}  // namespace ckptfs
