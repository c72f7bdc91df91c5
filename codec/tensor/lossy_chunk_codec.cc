#include "codec/tensor/lossy_chunk_codec.h"

#include <fmt/format.h>

#include <bit>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/low_rank.h"

namespace ckptfs {
namespace {

double LoadF64(ByteReader& r) { return std::bit_cast<double>(r.U64()); }

}  // namespace

void LossyChunkParams::EncodeTo(ByteWriter& w) const {
  if (row_column) {
    // Version 3's fields under version 8's number and flag, zeros to 208.
    LossyChunkParams head = *this;
    head.row_column.reset();
    head.flags &= static_cast<uint8_t>(~kFlagRowColumn);
    std::vector<std::byte> bytes;
    ByteWriter hw(&bytes);
    head.EncodeTo(hw);
    bytes[0] = std::byte{kVersionRowColumn};
    bytes[1] |= std::byte{kFlagRowColumn};
    bytes.resize(kEncodedSizeV7, std::byte{0});
    w.Bytes(bytes);
    w.U32(row_column->columns);
    w.U32(0);
    w.U64(row_column->block_bytes);
    return;
  }
  w.U8(dither       ? kVersionDither
       : low_rank   ? kVersionLowRank
       : step_space ? kVersionStepSpace
       : prediction ? kVersionPredicted
                    : kVersion);
  w.U8(static_cast<uint8_t>((flags & ~(kFlagPredicted | kFlagStepSpace | kFlagLowRank | kFlagDither)) |
                            (prediction ? kFlagPredicted : 0) | (step_space ? kFlagStepSpace : 0) |
                            (low_rank ? kFlagLowRank : 0) | (dither ? kFlagDither : 0)));
  w.U8(bits);
  w.U8(mode);
  w.U32(std::bit_cast<uint32_t>(update_rel));
  w.U64(std::bit_cast<uint64_t>(err2_sum));
  w.U64(std::bit_cast<uint64_t>(ref2_sum));
  w.U64(std::bit_cast<uint64_t>(max_abs));
  w.U64(pruned);
  w.U64(quantized);
  w.U64(exact);
  // Offset 56: modes 0/1 the rel_l2 budget it was encoded to, log mode its
  // achieved per-element relative error.
  w.U64(std::bit_cast<uint64_t>(mode == 2 ? max_rel : budget_rel_l2));
  w.U64(source_digest);
  if (!prediction && !step_space) return;
  if (prediction) {
    const StepPrediction& s = *prediction;
    w.U8(static_cast<uint8_t>(s.state_type));
    w.U8((s.has_v ? 1 : 0) | (s.has_base_step ? 2 : 0) | (s.has_step ? 4 : 0) | (s.copy ? 8 : 0) | (s.ref ? 16 : 0) |
         (s.predictor.f32_steps ? 32 : 0));
    for (int i = 0; i < 6; ++i) w.U8(0);
    w.U64(s.m_offset);
    w.U64(s.has_v ? s.v_offset : 0);
    w.U64(s.has_base_step ? s.m_base_offset : 0);
    w.U64(s.has_v && s.has_base_step ? s.v_base_offset : 0);
    for (double c : {s.predictor.step, s.predictor.base_step, s.predictor.eps, s.predictor.scale})
      w.U64(std::bit_cast<uint64_t>(c));
  } else {
    for (size_t i = kEncodedSize; i < kEncodedSizeV4; ++i) w.U8(0);
  }
  if (!step_space) return;
  w.U64(step_space->v_offset);
  w.U32(std::bit_cast<uint32_t>(step_space->eps));
  w.U32(0);
  if (!low_rank && !dither) return;
  const LowRankTerm term = low_rank.value_or(LowRankTerm{});
  w.U32(term.columns);
  w.U32(term.rank);
  w.U64(term.block_bytes);
  w.U64(0);
  w.U64(0);
  if (!dither) return;
  w.U64(std::bit_cast<uint64_t>(dither->step));
  w.U64(dither->seed);
}

Result<LossyChunkParams> LossyChunkParams::DecodeFrom(ByteSpan bytes) {
  if (bytes.size() != kEncodedSizeV8) return DecodeUpToVersion7(bytes);
  if (static_cast<uint8_t>(bytes[0]) != kVersionRowColumn)
    return Status::Corruption(fmt::format("lossy params: version {} in {} bytes, want 8", static_cast<int>(bytes[0]),
                                          bytes.size()));
  const uint8_t flags = static_cast<uint8_t>(bytes[1]);
  if ((flags & ~(kFlagRowColumn)) != 0 || (flags & kFlagRowColumn) == 0)
    return Status::Corruption(fmt::format("lossy params: version 8 with flags {}, want the row-column flag alone",
                                          flags));
  if (std::any_of(bytes.begin() + kEncodedSize, bytes.begin() + kEncodedSizeV7,
                  [](std::byte b) { return b != std::byte{0}; }))
    return Status::Corruption("lossy params: version 8 has a non-zero area before its row-column term");
  std::vector<std::byte> head(bytes.begin(), bytes.begin() + kEncodedSize);
  head[0] = std::byte{kVersion};
  head[1] = std::byte{0};
  ASSIGN_OR_RETURN(LossyChunkParams p, DecodeUpToVersion7(head));
  ByteReader r(bytes.subspan(kEncodedSizeV7), "lossy params");
  RowColumnTerm term;
  term.columns = r.U32();
  const uint32_t reserved = r.U32();
  term.block_bytes = r.U64();
  RETURN_IF_ERROR(r.status());
  if (reserved != 0) return Status::Corruption("lossy params: reserved bits set");
  if (p.mode != 2 || term.columns == 0 || term.block_bytes == 0)
    return Status::Corruption(fmt::format("lossy params: row-column term over {} columns in {} bytes in mode {}",
                                          term.columns, term.block_bytes, p.mode));
  p.flags = flags;
  p.row_column = term;
  return p;
}

Result<LossyChunkParams> LossyChunkParams::DecodeUpToVersion7(ByteSpan bytes) {
  if (bytes.size() != kEncodedSizeV7 && bytes.size() != kEncodedSizeV6 && bytes.size() != kEncodedSizeV5 &&
      bytes.size() != kEncodedSizeV4 && bytes.size() != kEncodedSize && bytes.size() != kEncodedSizeV2)
    return Status::Corruption(fmt::format("lossy params: {} bytes, want {}, {}, {}, {}, {} or {}", bytes.size(),
                                          kEncodedSizeV7, kEncodedSizeV6, kEncodedSizeV5, kEncodedSizeV4,
                                          kEncodedSize, kEncodedSizeV2));
  const bool has_dither = bytes.size() == kEncodedSizeV7;
  const bool has_low_rank_area = bytes.size() >= kEncodedSizeV6;
  const bool has_step_space = bytes.size() >= kEncodedSizeV5;
  const bool has_prediction_area = bytes.size() >= kEncodedSizeV4;
  const bool has_digest = bytes.size() >= kEncodedSize;
  ByteReader r(bytes, "lossy params");
  LossyChunkParams p;
  const uint8_t version = r.U8();
  p.flags = r.U8();
  p.bits = r.U8();
  const uint8_t reserved8 = r.U8();
  const uint32_t update_bits = r.U32();
  p.err2_sum = LoadF64(r);
  p.ref2_sum = LoadF64(r);
  p.max_abs = LoadF64(r);
  p.pruned = r.U64();
  p.quantized = r.U64();
  p.exact = r.U64();
  const uint64_t budget_bits = r.U64();
  if (has_digest) p.source_digest = r.U64();
  uint8_t state_type = 0, inputs = 0, reserved_tail = 0;
  StepPrediction step;
  if (has_prediction_area) {
    state_type = r.U8();
    inputs = r.U8();
    for (int i = 0; i < 6; ++i) reserved_tail |= r.U8();
    step.m_offset = r.U64();
    step.v_offset = r.U64();
    step.m_base_offset = r.U64();
    step.v_base_offset = r.U64();
    step.predictor.step = LoadF64(r);
    step.predictor.base_step = LoadF64(r);
    step.predictor.eps = LoadF64(r);
    step.predictor.scale = LoadF64(r);
  }
  StepSpace space;
  uint32_t reserved_space = 0;
  if (has_step_space) {
    space.v_offset = r.U64();
    space.eps = std::bit_cast<float>(r.U32());
    reserved_space = r.U32();
  }
  LowRankTerm low_rank;
  uint64_t reserved_low_rank = 0;
  if (has_low_rank_area) {
    low_rank.columns = r.U32();
    low_rank.rank = r.U32();
    low_rank.block_bytes = r.U64();
    reserved_low_rank = r.U64() | r.U64();
  }
  DitherTerm dither;
  if (has_dither) {
    dither.step = LoadF64(r);
    dither.seed = r.U64();
  }
  RETURN_IF_ERROR(r.status());
  // Version 7's low-rank area is version 6's, all zero without a term.
  const bool has_low_rank = has_dither ? (p.flags & kFlagLowRank) != 0 : has_low_rank_area;
  if (has_dither && !has_low_rank &&
      std::any_of(bytes.begin() + kEncodedSizeV5, bytes.begin() + kEncodedSizeV6, [](std::byte b) { return b != std::byte{0}; }))
    return Status::Corruption("lossy params: version 7 without a low-rank term has a non-zero term area");
  // Version 5's prediction area is version 4's, all zero when the chunk is
  // not predicted.
  const bool has_prediction = has_step_space ? (p.flags & kFlagPredicted) != 0 : has_prediction_area;
  if (has_step_space && !has_prediction &&
      std::any_of(bytes.begin() + kEncodedSize, bytes.begin() + kEncodedSizeV4, [](std::byte b) { return b != std::byte{0}; }))
    return Status::Corruption("lossy params: version 5 without a prediction has a non-zero prediction area");
  // The size tells the version: 64 bytes are versions 1 and 2, 72 bytes 3,
  // 144 bytes 4, 160 bytes 5.
  const bool version_ok = has_dither            ? version == kVersionDither
                          : has_low_rank_area     ? version == kVersionLowRank
                          : has_step_space       ? version == kVersionStepSpace
                          : has_prediction_area ? version == kVersionPredicted
                          : has_digest          ? version == kVersion
                                                : (version == 1 || version == 2);
  if (!version_ok)
    return Status::Corruption(fmt::format(
        "lossy params: version {} in {} bytes, want 7 in {}, 6 in {}, 5 in {}, 4 in {}, 3 in {} or 1-2 in {}",
        version, bytes.size(), kEncodedSizeV7, kEncodedSizeV6, kEncodedSizeV5, kEncodedSizeV4, kEncodedSize,
        kEncodedSizeV2));
  // Version 1 reserved the fields that version 2 fills.
  const uint8_t known_flags = has_dither ? (kFlagDelta | kFlagPredicted | kFlagStepSpace | kFlagLowRank | kFlagDither)
                              : has_low_rank_area   ? (kFlagDelta | kFlagPredicted | kFlagStepSpace | kFlagLowRank)
                              : has_step_space        ? (kFlagDelta | kFlagPredicted | kFlagStepSpace)
                              : has_prediction_area ? (kFlagDelta | kFlagPredicted)
                                                    : kFlagDelta;
  if ((p.flags & ~known_flags) != 0 || (version == 1 && (reserved8 != 0 || update_bits != 0 || budget_bits != 0)) ||
      reserved_tail != 0 || (inputs & ~63u) != 0 || reserved_space != 0 || reserved_low_rank != 0)
    return Status::Corruption("lossy params: reserved bits set");
  if (has_step_space) {
    if ((p.flags & kFlagStepSpace) == 0)
      return Status::Corruption("lossy params: version 5 without the step-space flag");
    if (!std::isfinite(space.eps) || !(space.eps > 0))
      return Status::Corruption(fmt::format("lossy params: step-space eps {}, want finite and > 0", space.eps));
    p.step_space = space;
  }
  if (has_prediction) {
    // A prediction replaces the base of a delta frame: both flags, always.
    if ((p.flags & (kFlagDelta | kFlagPredicted)) != (kFlagDelta | kFlagPredicted))
      return Status::Corruption(fmt::format("lossy params: version 4 with flags {}, want delta and predicted", p.flags));
    if (state_type < 1 || state_type > 3)
      return Status::Corruption(fmt::format("lossy params: step state type {}, want 1..3", state_type));
    step.state_type = static_cast<lossy::ElementType>(state_type);
    step.has_v = (inputs & 1) != 0;
    step.has_base_step = (inputs & 2) != 0;
    step.has_step = (inputs & 4) != 0;
    step.copy = (inputs & 8) != 0;
    step.ref = (inputs & 16) != 0;
    step.predictor.f32_steps = (inputs & 32) != 0;
    if (step.ref && !step.copy) return Status::Corruption("lossy params: a ref prediction that is no copy");
    // Binary32 steps are a step term's arithmetic: a copy has none (u = m).
    if (step.predictor.f32_steps && (!step.has_step || step.copy))
      return Status::Corruption("lossy params: binary32 steps without a step term");
    if (!step.has_step && (step.has_v || step.has_base_step || step.m_offset != 0 || step.predictor.step != 0))
      return Status::Corruption("lossy params: step inputs without the step term");
    if ((!step.has_v && step.v_offset != 0) || (!step.has_base_step && step.m_base_offset != 0) ||
        (!(step.has_v && step.has_base_step) && step.v_base_offset != 0))
      return Status::Corruption("lossy params: offset of an absent step input is not 0");
    const lossy::StepPredictor& c = step.predictor;
    for (double v : {c.step, c.base_step, c.scale})
      if (!std::isfinite(v)) return Status::Corruption(fmt::format("lossy params: step coefficient {} not finite", v));
    if (!std::isfinite(c.eps) || !(c.eps > 0))
      return Status::Corruption(fmt::format("lossy params: step eps {}, want finite and > 0", c.eps));
    if (!step.has_base_step && c.base_step != 0)
      return Status::Corruption("lossy params: base step coefficient without base step inputs");
    // A copy reads this file's m alone: no base, so no scale either.
    if (step.copy && (!step.has_step || step.has_v || step.has_base_step || c.scale != 0 || c.step != 1.0 ||
                      step.state_type != lossy::ElementType::kF32))
      return Status::Corruption("lossy params: a copy prediction other than p = m of an f32 master");
    p.prediction = step;
    // A step-space chunk is a first moment: at most a scaled base, never a
    // step term (which would read this file's first moments in turn).
    if (p.step_space && step.has_step)
      return Status::Corruption("lossy params: a step-space chunk with a step term");
  }
  if (has_low_rank) {
    // A term of a first moment's prediction in step space: all four flags.
    if (!p.prediction || !p.step_space || (p.flags & kFlagLowRank) == 0)
      return Status::Corruption("lossy params: version 6 without the low-rank, step-space and prediction flags");
    if (low_rank.rank < 1 || low_rank.rank > lossy::kMaxLowRank || low_rank.columns == 0 ||
        low_rank.block_bytes == 0)
      return Status::Corruption(fmt::format("lossy params: low-rank term of rank {} over {} columns in {} bytes",
                                            low_rank.rank, low_rank.columns, low_rank.block_bytes));
    p.low_rank = low_rank;
  }
  if (has_dither) {
    // A dither of a first moment's prediction in step space.
    if (!p.prediction || !p.step_space || (p.flags & kFlagDither) == 0)
      return Status::Corruption("lossy params: version 7 without the dither, step-space and prediction flags");
    if (!std::isfinite(dither.step) || !(dither.step > 0))
      return Status::Corruption(fmt::format("lossy params: dither step {}, want finite and > 0", dither.step));
    p.dither = dither;
  }
  p.mode = version == 1 ? (p.bits == 0 ? 0 : 1) : reserved8;
  p.update_rel = std::bit_cast<float>(update_bits);
  if (!std::isfinite(p.update_rel) || p.update_rel < 0)
    return Status::Corruption(fmt::format("lossy params: update_rel {} invalid", p.update_rel));
  if (p.mode == 2) {
    p.max_rel = std::bit_cast<double>(budget_bits);
    if (p.bits < 1 || p.bits > 24) return Status::Corruption(fmt::format("lossy params: log bits {}, want 1..24", p.bits));
  } else if (p.mode <= 1 || p.mode == 3) {
    p.budget_rel_l2 = std::bit_cast<double>(budget_bits);
    if (p.bits > 8) return Status::Corruption(fmt::format("lossy params: bits {}, want <= 8", p.bits));
    if ((p.mode == 0) != (p.bits == 0) || (p.mode == 3 && p.bits != 8))
      return Status::Corruption(fmt::format("lossy params: mode {} with bits {}", p.mode, p.bits));
  } else {
    return Status::Corruption(fmt::format("lossy params: mode {}, want 0 to 3", p.mode));
  }
  for (double v : {p.err2_sum, p.ref2_sum, p.max_abs, p.max_rel, p.budget_rel_l2})
    if (!std::isfinite(v) || v < 0) return Status::Corruption(fmt::format("lossy params: error sum {} invalid", v));
  return p;
}

bool LossyChunkCodec::Accepts(DType dtype, bool) const { return IsCodecFloat(dtype); }

Result<size_t> LossyChunkCodec::DoEncode(ByteSpan, const ChunkContext&, CodecScratch&, std::byte*) const {
  return Status::Unsupported("lossy: encode through lossy::EncodeChunk with a budget");
}

Status LossyChunkCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                 MutableByteSpan out) const {
  return DoDecodeAndHash(stored, ctx, scratch, out, nullptr);
}

Status LossyChunkCodec::DoDecodeAndHash(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                        MutableByteSpan out, std::optional<uint64_t>* checksum) const {
  ASSIGN_OR_RETURN(lossy::ElementType type, lossy::ElementTypeOf(ctx.dtype));
  // The kernels store whole elements: decode into an aligned buffer when a
  // reader's span is not aligned to the element size (then copy).
  const size_t align = lossy::ElementSize(type);
  auto misaligned = [align](const void* p) { return reinterpret_cast<uintptr_t>(p) % align != 0; };
  ByteSpan base = ctx.base;
  if (misaligned(base.data())) {
    std::byte* copy = scratch.xored.Reserve(base.size());
    std::copy(base.begin(), base.end(), copy);
    base = ByteSpan(copy, base.size());
  }
  if (!misaligned(out.data()))
    return lossy::DecodeChunk(type, stored, base, out, &scratch.lossy(), nullptr, checksum, ctx.symbol_contexts,
                              ctx.base_slices, ctx.finish);
  MutableByteSpan aligned(scratch.planes.Reserve(out.size()), out.size());
  RETURN_IF_ERROR(lossy::DecodeChunk(type, stored, base, aligned, &scratch.lossy(), nullptr, checksum,
                                     ctx.symbol_contexts, ctx.base_slices, ctx.finish));
  std::copy(aligned.begin(), aligned.end(), out.begin());
  return Status::Ok();
}

namespace {

float LoadF32(const std::byte* p, size_t i) { return lossy::BitsFloat(LoadLE32(p + 4 * i)); }
float LoadF16(const std::byte* p, size_t i) { return lossy::HalfToFloat(LoadLE16(p + 2 * i)); }
float LoadBF16(const std::byte* p, size_t i) { return lossy::Bf16ToFloat(LoadLE16(p + 2 * i)); }

// MeasureError's sums in four interleaved lanes (the loop is not
// serialized on one accumulator's adds; the sums' rounding differs from one
// running sum's in the last bits only): element i goes to lane i % 4, a
// tail shorter than 4 to lane 0, and the lanes are added in order.
struct ErrorLanes {
  double err2[4] = {}, ref2[4] = {}, max_abs[4] = {};
  void Add(size_t lane, double x, double y) {
    const bool finite = std::isfinite(x);
    const double d = y - x;
    const double ad = std::isfinite(d) ? std::fabs(d) : INFINITY;
    err2[lane] += finite ? d * d : 0.0;
    ref2[lane] += finite ? x * x : 0.0;
    max_abs[lane] = std::max(max_abs[lane], finite ? ad : 0.0);
  }
  ErrorSums Sum() const {
    ErrorSums sums;
    for (size_t l = 0; l < 4; ++l) {
      sums.err2 += err2[l];
      sums.ref2 += ref2[l];
      sums.max_abs = std::max(sums.max_abs, max_abs[l]);
    }
    return sums;
  }
};

// MeasureError for one element type, the type decided once; elements from
// `first` on (the vector kernels leave a tail to it).
template <float (*kLoad)(const std::byte*, size_t)>
ErrorSums MeasureErrorTyped(const std::byte* a, const std::byte* b, size_t n, ErrorLanes lanes = {},
                            size_t first = 0) {
  size_t i = first;
  for (; i + 4 <= n; i += 4)
    for (size_t l = 0; l < 4; ++l) lanes.Add(l, kLoad(a, i + l), kLoad(b, i + l));
  for (; i < n; ++i) lanes.Add(0, kLoad(a, i), kLoad(b, i));
  return lanes.Sum();
}


#if defined(__x86_64__)
// Four elements of f32 or bf16 (bf16 is the top half of an f32) as doubles.
template <bool kBf16>
__attribute__((target("avx2"), always_inline)) inline __m256d LoadFour(const std::byte* p, size_t i) {
  if constexpr (kBf16) {
    const __m128i bits = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 * i));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(bits), 16)));
  } else {
    return _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(p + 4 * i)));
  }
}

// MeasureErrorTyped (f32, bf16) of kCount reconstructions against `a` in
// one pass over it, each with its four lanes in one AVX2 register: the same
// operations on the same elements per lane, so the same sums bit for bit
// as the portable code (it was most of what weighing a step prediction
// cost; weighing one against the base read the values twice).
template <bool kBf16, size_t kCount>
__attribute__((target("avx2"))) std::array<ErrorSums, kCount> MeasureErrorsAvx2(
    const std::byte* a, const std::array<const std::byte*, kCount>& recon, size_t n) {
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d inf = _mm256_set1_pd(INFINITY);
  __m256d err2[kCount], ref2[kCount], max_abs[kCount];
  for (size_t k = 0; k < kCount; ++k) err2[k] = ref2[k] = max_abs[k] = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = LoadFour<kBf16>(a, i);
    const __m256d finite = _mm256_cmp_pd(_mm256_andnot_pd(sign, x), inf, _CMP_LT_OQ);
    const __m256d x2 = _mm256_and_pd(finite, _mm256_mul_pd(x, x));
    for (size_t k = 0; k < kCount; ++k) {
      const __m256d d = _mm256_sub_pd(LoadFour<kBf16>(recon[k], i), x);
      const __m256d abs_d = _mm256_andnot_pd(sign, d);
      const __m256d ad = _mm256_blendv_pd(inf, abs_d, _mm256_cmp_pd(abs_d, inf, _CMP_LT_OQ));  // not finite: Inf
      err2[k] = _mm256_add_pd(err2[k], _mm256_and_pd(finite, _mm256_mul_pd(d, d)));
      ref2[k] = _mm256_add_pd(ref2[k], x2);
      // std::max(m, v) is m < v ? v : m: neither is NaN here.
      const __m256d v = _mm256_and_pd(finite, ad);
      max_abs[k] = _mm256_blendv_pd(max_abs[k], v, _mm256_cmp_pd(max_abs[k], v, _CMP_LT_OQ));
    }
  }
  std::array<ErrorSums, kCount> out;
  for (size_t k = 0; k < kCount; ++k) {
    ErrorLanes lanes;
    _mm256_storeu_pd(lanes.err2, err2[k]);
    _mm256_storeu_pd(lanes.ref2, ref2[k]);
    _mm256_storeu_pd(lanes.max_abs, max_abs[k]);
    out[k] = MeasureErrorTyped<kBf16 ? LoadBF16 : LoadF32>(a, recon[k], n, lanes, i);
  }
  return out;
}
#endif

}  // namespace

ErrorSums MeasureErrorPortable(DType dtype, ByteSpan a, ByteSpan b) {
  const size_t n = a.size() / DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32: return MeasureErrorTyped<LoadF32>(a.data(), b.data(), n);
    case DType::kF16: return MeasureErrorTyped<LoadF16>(a.data(), b.data(), n);
    default: return MeasureErrorTyped<LoadBF16>(a.data(), b.data(), n);
  }
}

std::pair<ErrorSums, ErrorSums> MeasureErrorPair(DType dtype, ByteSpan a, ByteSpan b, ByteSpan c) {
#if defined(__x86_64__)
  static const bool avx2 = CpuHasSimd(SimdLevel::kAvx2);
  if ((dtype == DType::kF32 || dtype == DType::kBF16) && avx2) {
    const std::array<const std::byte*, 2> recon = {b.data(), c.data()};
    const std::array<ErrorSums, 2> sums = dtype == DType::kF32
                                              ? MeasureErrorsAvx2<false, 2>(a.data(), recon, a.size() / 4)
                                              : MeasureErrorsAvx2<true, 2>(a.data(), recon, a.size() / 2);
    return {sums[0], sums[1]};
  }
#endif
  return {MeasureErrorPortable(dtype, a, b), MeasureErrorPortable(dtype, a, c)};
}

ErrorSums MeasureError(DType dtype, ByteSpan a, ByteSpan b) {
#if defined(__x86_64__)
  static const bool avx2 = CpuHasSimd(SimdLevel::kAvx2);
  if (dtype == DType::kF32 && avx2) return MeasureErrorsAvx2<false, 1>(a.data(), {b.data()}, a.size() / 4)[0];
  if (dtype == DType::kBF16 && avx2) return MeasureErrorsAvx2<true, 1>(a.data(), {b.data()}, a.size() / 2)[0];
#endif
  return MeasureErrorPortable(dtype, a, b);
}

}  // namespace ckptfs
