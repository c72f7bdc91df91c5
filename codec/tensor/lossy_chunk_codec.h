// ChunkCodec::kLossy: a chunk stored as a lossy stream (LOSSY.md), with the
// error the encoder achieved recorded in the chunk's parameters area so that
// inspect can report it without decoding anything.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/chunk_codec.h"

namespace ckptfs {

// The parameters area of a kLossy chunk (FORMAT.md "Codec 16"), 64 bytes LE.
struct LossyChunkParams {
  static constexpr size_t kEncodedSize = 64;
  static constexpr uint8_t kVersion = 1;
  // Version 2 (written only for log-mode streams) adds `mode` and `max_rel`.
  static constexpr uint8_t kVersionLog = 2;
  static constexpr uint8_t kFlagDelta = 1;  // the stream reads the base at base_offset

  uint8_t flags = 0;
  uint8_t bits = 0;           // symbol width, 0 = lossless mode
  uint8_t mode = 0;           // the stream's mode: 0 lossless, 1 quantized, 2 log (version 2 only)
  double max_rel = 0.0;       // log mode: max |w_hat - w| / |w| over its quantized elements (version 2 only)
  double err2_sum = 0.0;      // sum over finite elements of (w_hat - w)^2
  double ref2_sum = 0.0;      // sum over finite elements of w^2
  double max_abs = 0.0;       // max |w_hat - w| over finite elements
  uint64_t pruned = 0;
  uint64_t quantized = 0;
  uint64_t exact = 0;

  bool delta() const { return (flags & kFlagDelta) != 0; }
  void EncodeTo(ByteWriter& w) const;
  // Rejects a wrong size or version, reserved bits, negative or non-finite sums.
  static Result<LossyChunkParams> DecodeFrom(ByteSpan bytes);
};

// The registered kLossy codec: decodes only. Encoding needs a budget and goes
// through lossy::EncodeChunk (EncodeBlob does that); Encode is Unsupported.
// Thread safety: immutable; Decode uses the scratch's lossy buffers.
class LossyChunkCodec final : public ChunkCodecImpl {
 public:
  LossyChunkCodec() : ChunkCodecImpl(ChunkCodec::kLossy) {}
  bool Accepts(DType dtype, bool has_base) const override;

 protected:
  size_t MaxEncodedSize(size_t raw_size, const ChunkContext&) const override { return raw_size; }
  Result<size_t> DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                          std::byte* out) const override;
  Status DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                  MutableByteSpan out) const override;
  bool TakesParams() const override { return true; }
};

// Sum of (b - a)^2 and of a^2 over the finite elements of `a`, and the max
// |b - a| there: the error of reconstruction `b` of `a` (both n elements of
// the codec float `dtype`). REQUIRES: a.size() == b.size(), IsCodecFloat(dtype).
struct ErrorSums {
  double err2 = 0.0;
  double ref2 = 0.0;
  double max_abs = 0.0;
};
ErrorSums MeasureError(DType dtype, ByteSpan a, ByteSpan b);

}  // namespace ckptfs
