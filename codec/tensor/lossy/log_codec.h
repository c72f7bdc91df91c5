// The log-domain mode of the lossy stream (LOSSY.md section 9), for update
// denominators such as Adam's exp_avg_sq: each positive element becomes the
// index of the nearest point of a geometric grid (a uniform grid in log2 v),
// which bounds every element's *relative* error. Exact zeros stay exact
// zeros; negative, -0, NaN and Inf elements are stored bit for bit. In a
// delta frame each index is coded as its difference from the index of the
// base's reconstructed element (closed loop): a slowly moving second moment
// gives mostly zero differences, which zstd collapses.
#pragma once

#include <bit>
#include <cmath>

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/simd_level.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/base_slices.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"

namespace ckptfs::lossy {

// How a value between two levels picks one. kValue, the nearer in value, is
// the format's: a decoder predicts a delta frame's indices from its base's
// elements that way. kLog, the nearer in log (x^2 against the product of
// the two), is the encoder's choice for the elements it codes: rounding in
// value picks the lower level for every x in (sqrt(l h), (l + h) / 2), so
// a second moment came back smaller on average (e^-0.06 on a grid of
// ratio 2, the steps after a restore that much longer); in log the
// rounding is unbiased for values spread over the cell.
enum class LogRounding { kValue, kLog };

// The grid {m_j * 2^e}: per octave the levels m_0 = 1, m_j = m_{j-1} * ratio
// (binary64 products, so every machine builds the same table) while < 2.
// Index q stands for m_(q mod K) * 2^floor(q / K), K = levels per octave.
// Immutable. Thread safety: const methods are safe.
class LogGrid {
 public:
  // REQUIRES nothing: a ratio outside (1, 2] or one needing more than
  // kMaxLogLevels levels per octave is InvalidArgument.
  static Result<LogGrid> FromRatio(double ratio, LogRounding rounding = LogRounding::kValue);
  // The ratio the encoder uses for a per-element bound of max_rel (every
  // element within a factor 1 + max_rel of its value, either way) with
  // kLog rounding: an element at the geometric midpoint of two levels is a
  // factor sqrt(ratio) from both, set to 1 + 0.95 * max_rel (the rest a
  // margin for rounding the grid point to the element type). Capped at 2.
  static double RatioFor(double max_rel);

  double ratio() const { return ratio_; }
  LogRounding rounding() const { return rounding_; }
  uint32_t per_octave() const { return per_octave_; }
  // The index of the grid point nearest to x by the grid's rounding (ties
  // to the lower point). REQUIRES: x a finite float > 0.
  int64_t Index(double x) const;
  // The grid point of index q (0 or +Inf far outside the double range).
  double Value(int64_t q) const;
  // Index(x) and FloatValue(Index(x)) at once, computed from the float's
  // bits without a detour through q / K for a normal x (the encoder's and
  // the delta decoder's per-element path). Equal to the two calls.
  // REQUIRES: x finite and > 0.
  struct Point {
    int64_t q;
    float value;
  };
  [[gnu::always_inline]] Point Locate(float x) const;
  // Index(x) alone by the same path. REQUIRES: x finite and > 0.
  [[gnu::always_inline]] int64_t FloatIndex(float x) const { return Locate(x).q; }
  // Exactly static_cast<float>(Value(q)), without a division or ldexp when
  // the result is a normal float: scaling by 2^e commutes with rounding to
  // float there, so it is the float of the level's mantissa with e added to
  // its exponent field. The decoder's per-element path.
  float FloatValue(int64_t q) const;

 private:
  // Whether m in [m_j, m_j+1) rounds up: m_j+1 - m < m - m_j (both exact,
  // operands in [1, 2]) in kValue, m * m > m_j * m_j+1 (m has at most 24
  // significant bits, so m * m is exact; the product is products_[j]) in kLog.
  bool RoundsUp(double m, uint32_t j) const {
    return rounding_ == LogRounding::kLog ? m * m > products_[j] : mantissa_[j + 1] - m < m - mantissa_[j];
  }

  double ratio_ = 2.0;
  LogRounding rounding_ = LogRounding::kValue;
  uint32_t per_octave_ = 1;
  std::vector<double> mantissa_;  // m_0..m_{K-1}, ascending in [1, 2), then 2.0 (the next octave's m_0)
  std::vector<double> products_;  // m_j * m_j+1 for j < K (kLog's thresholds, squared)
  // For a speed-up only (results equal a binary search): bucket b covers
  // mantissas [1 + b/B, 1 + (b+1)/B) and holds the last level <= 1 + b/B.
  // B >= 2K, so a bucket holds at most one level boundary.
  std::vector<uint32_t> bucket_level_;
  std::vector<uint32_t> mantissa_f32_bits_;  // bits of (float) m_j, j < K (exponent field 127, or 128 for 2.0f)
  double inv_per_octave_ = 1.0;              // 1 / K, for an estimate of floor(q / K) that is then corrected
  int64_t fast_offset_ = int64_t{1} << 30;   // the least multiple of K >= 2^30 (keeps FloatValue's q positive)
  uint32_t bucket_shift_ = 52;  // 52 - log2(B): mantissa bits >> shift = bucket
  // The same for a binary32 fraction (23 bits): B <= 2^17, so >= 6.
  uint32_t float_bucket_shift_ = 23;
};

[[gnu::always_inline]] inline LogGrid::Point LogGrid::Locate(float x) const {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t field = bits >> 23;  // x > 0: the sign bit is clear
  if (field == 0) {  // subnormal: the general path
    const int64_t q = Index(x);
    return {q, FloatValue(q)};
  }
  // x = m * 2^e exactly, m in [1, 2) (m as a double: the fraction widened).
  const int64_t e = static_cast<int64_t>(field) - 127;
  const uint32_t fraction = bits & 0x7FFFFFu;
  const double m = std::bit_cast<double>((uint64_t{fraction} << 29) | (uint64_t{1023} << 52));
  uint32_t j = bucket_level_[fraction >> float_bucket_shift_];
  // A bucket holds at most one level boundary: one branch-free step (the
  // loop never runs; mantissa_[K] = 2 > m ends it at K - 1).
  j += mantissa_[j + 1] <= m ? 1 : 0;
  while (mantissa_[j + 1] <= m) ++j;
  const bool up = RoundsUp(m, j);
  const int64_t k = per_octave_;
  const int64_t q = e * k + j + (up ? 1 : 0);
  // The level's own (octave, level) pair: one up from the last level is the
  // next octave's first. A normal result is the level's float bits with e
  // added to the exponent field (as in FloatValue).
  int64_t level_e = e;
  uint32_t level_j = j + (up ? 1 : 0);
  if (level_j == per_octave_) level_j = 0, ++level_e;
  if (level_e >= -126 && level_e <= 126) {
    const int32_t f = static_cast<int32_t>(mantissa_f32_bits_[level_j]) + static_cast<int32_t>(level_e) * (1 << 23);
    return {q, std::bit_cast<float>(static_cast<uint32_t>(f))};
  }
  return {q, FloatValue(q)};
}

inline float LogGrid::FloatValue(int64_t q) const {
  constexpr int64_t kFastRange = int64_t{1} << 30;  // q * (1/K) is then within far less than 1 of q / K
  if (q > -kFastRange && q < kFastRange) {
    const int64_t k = per_octave_;
    // Truncation of the positive q + offset (a multiple of K) is within one
    // of floor, and almost always equal; the loops correct it (std::floor
    // would be a libm call on the baseline instruction set).
    const int64_t shifted = q + fast_offset_;
    int64_t e = static_cast<int64_t>(static_cast<double>(shifted) * inv_per_octave_) - fast_offset_ / k;
    int64_t j = q - e * k;
    while (j < 0) --e, j += k;
    while (j >= k) ++e, j -= k;
    // Normal result: the exponent field 127 (or 128 for a level that rounds
    // to 2.0f) plus e stays within [1, 254].
    if (e >= -126 && e <= 126) {
      const int32_t field = static_cast<int32_t>(mantissa_f32_bits_[static_cast<size_t>(j)]) + static_cast<int32_t>(e) * (1 << 23);
      return std::bit_cast<float>(static_cast<uint32_t>(field));
    }
  }
  return static_cast<float>(Value(q));
}

// Encodes a chunk in log mode with |w_hat - w| <= max_rel * |w| for every
// element. Returns nullopt when the stream would not be smaller than the
// raw values (the caller stores the chunk losslessly). `recon_out` as in
// EncodeOptions::reconstruction_out. max_simd caps the vector paths
// (kScalar = the scalar reference); the output is the same at every level,
// which the tests compare.
// REQUIRES: max_rel > 0, base empty or values.size(), n < 2^32.
Result<std::optional<EncodedChunk>> EncodeLogChunk(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                   Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out,
                                                   SimdLevel max_simd = SimdLevel::kAvx512);

// Decodes the body of a log-mode stream (everything after the header, the
// checksum already removed and verified). `base` is empty unless h is a
// delta frame, then out.size() bytes; or, for an f32 delta frame, the base
// comes from `base_slices` (base empty), filled a slice at a time. max_simd
// caps the vector path (the output is the same at every level). With
// `hash`, the output is written, patched and hashed in slices
// (DecodeInSlices) while each is in cache.
Status DecodeLogBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                     Scratch::Buffers& s, SimdLevel max_simd = SimdLevel::kAvx512, Checksum64Stream* hash = nullptr,
                     const BaseSlices* base_slices = nullptr, const SliceFinish* finish = nullptr);

}  // namespace ckptfs::lossy
