// ChunkCodec::kLossy: a chunk stored as a lossy stream (LOSSY.md), with the
// error the encoder achieved recorded in the chunk's parameters area so that
// inspect can report it without decoding anything.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/chunk_codec.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {

// Where a step-predicted chunk's prediction reads its inputs, and the
// predictor (codec/tensor/lossy/step_predictor.h; FORMAT.md "Step
// prediction"). Offsets are logical: m and v in this blob's file, m_base and
// v_base in the base's; each range holds as many elements as the chunk.
struct StepPrediction {
  lossy::StepPredictor predictor;
  lossy::ElementType state_type = lossy::ElementType::kF32;  // of m, v, m_base, v_base
  bool has_step = false;       // m is read (else p = scale * w_base and no range is read)
  bool has_v = false;          // v and v_base are read (else u = m)
  bool has_base_step = false;  // m_base (and v_base) are read
  // m is a higher-precision copy of these weights in this file (bf16
  // weights and their fp32 master copy): its range may cover step-predicted
  // chunks, and the prediction reads no base (scale 0, no v, no base step),
  // so a key frame may hold it too (FORMAT.md "Step prediction").
  bool copy = false;
  // A copy whose m is in the blob's ref object (another file's blob,
  // FORMAT.md "Index header"), not in this file: weights that a sibling
  // file holds too (DeepSpeed's flat fp32 partitions of the model file's
  // weights; codec/optimizer/ref_copies.h). Requires `copy`; m_offset is
  // logical in the ref's file.
  bool ref = false;
  uint64_t m_offset = 0, v_offset = 0;
  uint64_t m_base_offset = 0, v_base_offset = 0;
};

// A first-moment chunk coded in step space (FORMAT.md "Step space"): the
// stream holds x = m / s with s = sqrt(v) + eps, v this blob's reconstructed
// second moment at v_offset (as many f32 elements as the chunk's), and m is
// x_hat * s. An error budget on x is one on Adam's step m / (sqrt(v) + eps)
// instead of on m: an element with a small second moment moves its weight as
// far as one with a large one. f32 m and v only.
struct StepSpace {
  uint64_t v_offset = 0;
  float eps = 0;
};

// A step-space chunk whose prediction has a low-rank term
// (codec/tensor/lossy/low_rank.h; FORMAT.md "Low-rank term"): the chunk is a
// block of rows of `columns` elements, and its stored bytes start with the
// factor block of `rank` components (`block_bytes` long; the stream follows).
struct LowRankTerm {
  uint32_t columns = 0;
  uint32_t rank = 0;
  uint64_t block_bytes = 0;
};

// A subtractive dither of a first moment's prediction (codec/tensor/lossy/
// dither.h, FORMAT.md "Dither"): the grid step and the seed of the
// pseudo-random offsets.
struct DitherTerm {
  double step = 0.0;
  uint64_t seed = 0;
};

// A log-mode chunk coded as a delta frame against a row-column base
// (codec/tensor/lossy/row_column_base.h; FORMAT.md "Row-column base")
// instead of a base version: the chunk is rows of `columns` f32 elements,
// and its stored bytes start with the base's block (`block_bytes` long; the
// stream follows).
struct RowColumnTerm {
  uint32_t columns = 0;
  uint64_t block_bytes = 0;
};

// The parameters area of a kLossy chunk (FORMAT.md "Codec 16"), little-endian:
// 224 bytes (version 8, chunks against a row-column base), 208 (version 7,
// dithered chunks), 192 (version 6, chunks with a low-rank term), 160
// (version 5, step-space chunks), 144 (version 4, predicted chunks), 72
// (version 3) or 64 (versions 1 and 2).
struct LossyChunkParams {
  // Version 4 appends the step prediction (144 bytes) and is written only
  // for predicted chunks; the others are written as version 3, which
  // appended the source digest (72 bytes). Versions 1 and 2 are 64 bytes and
  // still decode, without a digest. Version 2 added the stream mode, the
  // measured update (budget schedule) and the bound the chunk was encoded
  // to; version 1 holds zeros there (mode from bits, nothing recorded).
  // Version 5 appends the step space (160 bytes), written only for
  // step-space chunks; its bytes 72-143 are version 4's prediction, all zero
  // when the chunk is not predicted.
  // Version 6 appends the low-rank term (192 bytes), written only for
  // chunks that have one; it requires the step space and the prediction.
  // Version 7 appends the dither (208 bytes), written only for dithered
  // chunks, which need the step space and the prediction too; its bytes
  // 160-191 are version 6's term, all zero when the chunk has none.
  // Version 8 is version 3's fields, zeros where versions 4-7 put their
  // terms, and the row-column term (224 bytes), written only for chunks
  // coded against a row-column base; they read no base version.
  static constexpr size_t kEncodedSizeV8 = 224;
  static constexpr size_t kEncodedSizeV7 = 208;
  static constexpr size_t kEncodedSizeV6 = 192;
  static constexpr size_t kEncodedSizeV5 = 160;
  static constexpr size_t kEncodedSizeV4 = 144;
  static constexpr size_t kEncodedSize = 72;
  static constexpr size_t kEncodedSizeV2 = 64;
  static constexpr uint8_t kVersion = 3;
  static constexpr uint8_t kVersionPredicted = 4;
  static constexpr uint8_t kVersionStepSpace = 5;
  static constexpr uint8_t kVersionLowRank = 6;
  static constexpr uint8_t kVersionDither = 7;
  static constexpr uint8_t kVersionRowColumn = 8;
  static constexpr uint8_t kFlagDelta = 1;      // the stream reads the base at base_offset
  static constexpr uint8_t kFlagPredicted = 2;  // ... plus the step prediction (version 4)
  static constexpr uint8_t kFlagStepSpace = 4;  // the stream holds m / s (version 5)
  static constexpr uint8_t kFlagLowRank = 8;    // the prediction has a low-rank term (version 6)
  static constexpr uint8_t kFlagDither = 16;    // the prediction has a dither (version 7)
  static constexpr uint8_t kFlagRowColumn = 32; // the stream's base is a row-column base (version 8)

  uint8_t flags = 0;
  uint8_t bits = 0;           // symbol width, 0 = lossless mode
  uint8_t mode = 0;           // the stream's mode: 0 lossless, 1 quantized, 2 log, 3 trellis
  double max_rel = 0.0;       // log mode: achieved max |w_hat - w| / |w| over its quantized elements
  double err2_sum = 0.0;      // sum over finite elements of (w_hat - w)^2
  double ref2_sum = 0.0;      // sum over finite elements of w^2
  double max_abs = 0.0;       // max |w_hat - w| over finite elements
  uint64_t pruned = 0;
  uint64_t quantized = 0;
  uint64_t exact = 0;
  float update_rel = 0.0f;     // measured ||w - base|| / ||w|| the budget schedule saw (0 = none)
  double budget_rel_l2 = 0.0;  // modes 0/1/3: the rel_l2 budget it was encoded to (0 = not recorded)
  // XXH3-64 of the chunk's original bytes, the values the encoder was given
  // (0 = not recorded). The next version's encoder compares it with its
  // own values: equal means this range did not change (a frozen layer), and
  // the budget schedule then leaves its budget alone (LOSSY.md §8).
  uint64_t source_digest = 0;
  // Set exactly when flags has kFlagPredicted (which requires kFlagDelta):
  // the stream is a delta frame against the prediction, not the base bytes.
  std::optional<StepPrediction> prediction;
  // Set exactly when flags has kFlagStepSpace.
  std::optional<StepSpace> step_space;
  // Set exactly when flags has kFlagLowRank (which requires the other three).
  std::optional<LowRankTerm> low_rank;
  // Set exactly when flags has kFlagDither (which requires kFlagDelta,
  // kFlagPredicted and kFlagStepSpace).
  std::optional<DitherTerm> dither;
  // Set exactly when flags has kFlagRowColumn (log mode; no other term, and
  // not kFlagDelta: the stream's base is the block's, not a base version's).
  std::optional<RowColumnTerm> row_column;

  bool delta() const { return (flags & kFlagDelta) != 0; }
  bool predicted() const { return (flags & kFlagPredicted) != 0; }
  // A copy of a master in the same file (StepPrediction::copy).
  bool copy() const { return prediction && prediction->copy; }
  // A copy of weights in the blob's ref object (StepPrediction::ref).
  bool ref_copy() const { return prediction && prediction->ref; }
  // Whether decoding reads the base version: a delta frame, except a copy's.
  bool reads_base() const { return delta() && !copy(); }
  void EncodeTo(ByteWriter& w) const;
  // Rejects a wrong size or version, reserved bits, negative or non-finite sums.
  // Accepts versions 1 and 2 (64 bytes), 3 (72 bytes), 4 (144 bytes), 5 (160 bytes), 6 (192 bytes), 7 (208
  // bytes) and 8 (224 bytes).
  static Result<LossyChunkParams> DecodeFrom(ByteSpan bytes);

 private:
  static Result<LossyChunkParams> DecodeUpToVersion7(ByteSpan bytes);
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
  // The quantized and log modes hash the output slice by slice as they write it.
  Status DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch, MutableByteSpan out,
                         std::optional<uint64_t>* checksum) const override;
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
// The same without the vector kernels (same sums; tests compare the two).
ErrorSums MeasureErrorPortable(DType dtype, ByteSpan a, ByteSpan b);
// MeasureError(dtype, a, b) and MeasureError(dtype, a, c) in one pass over
// `a` (the same sums bit for bit; weighing a prediction against the base
// read the values twice). REQUIRES: b and c of a's size.
std::pair<ErrorSums, ErrorSums> MeasureErrorPair(DType dtype, ByteSpan a, ByteSpan b, ByteSpan c);

}  // namespace ckptfs
