#include "codec/tensor/chunk_encoder.h"

#include <cstring>
#include <utility>

namespace ckptfs {
namespace {

// When byte planes save less than this fraction of the chunk, plain zstd is
// tried too: such data is not a smooth float distribution and may hold
// repeats that only LZ matching finds.
constexpr double kTryZstdAboveRatio = 0.97;

// Encodes with `codec` into `candidate` and keeps it in `best` if smaller.
Status Compete(ChunkCodec codec, ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
               ScratchBuffer* best, ChunkEncoding* best_encoding, bool* have_best) {
  Result<size_t> n = FindChunkCodec(codec)->Encode(data, ctx, scratch, &scratch.candidate);
  if (!n.ok()) return n.status();
  if (!*have_best || *n < best_encoding->stored_size) {
    std::swap(*best, scratch.candidate);
    *best_encoding = ChunkEncoding{codec, *n};
    *have_best = true;
  }
  return Status::Ok();
}

}  // namespace

bool IsAllZero(ByteSpan data) {
  // OR-reduce 64 bytes at a time (vectorized) with an early exit per block.
  const std::byte* p = data.data();
  size_t n = data.size();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t acc = 0;
    for (size_t j = 0; j < 64; j += 8) {
      uint64_t w;
      std::memcpy(&w, p + i + j, 8);
      acc |= w;
    }
    if (acc != 0) return false;
  }
  for (; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

Result<ChunkEncoding> EncodeChunkBest(ByteSpan data, DType dtype, int zstd_level, ByteSpan base,
                                      CodecScratch& scratch, ScratchBuffer* out) {
  if (IsAllZero(data)) return ChunkEncoding{ChunkCodec::kZeros, 0};
  ChunkContext ctx{dtype, zstd_level, {}};
  ChunkEncoding best;
  bool have_best = false;
  if (IsCodecFloat(dtype)) {
    RETURN_IF_ERROR(Compete(ChunkCodec::kBytePlaneZstd, data, ctx, scratch, out, &best, &have_best));
    if (static_cast<double>(best.stored_size) > kTryZstdAboveRatio * static_cast<double>(data.size()))
      RETURN_IF_ERROR(Compete(ChunkCodec::kZstd, data, ctx, scratch, out, &best, &have_best));
  } else {
    RETURN_IF_ERROR(Compete(ChunkCodec::kZstd, data, ctx, scratch, out, &best, &have_best));
  }
  if (!base.empty()) {
    // Floats XOR against the base; anything else finds its base's bytes as
    // matches (a pickle with a few numbers changed, an unchanged RNG state).
    ChunkContext delta{dtype, zstd_level, base};
    const ChunkCodec codec = IsCodecFloat(dtype) ? ChunkCodec::kBytePlaneXorZstd : ChunkCodec::kZstdWithBase;
    RETURN_IF_ERROR(Compete(codec, data, delta, scratch, out, &best, &have_best));
  }
  if (best.stored_size >= data.size()) {
    RETURN_IF_ERROR(FindChunkCodec(ChunkCodec::kRaw)->Encode(data, ctx, scratch, out).status());
    best = ChunkEncoding{ChunkCodec::kRaw, data.size()};
  }
  return best;
}

}  // namespace ckptfs
