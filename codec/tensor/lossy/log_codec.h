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
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"

namespace ckptfs::lossy {

// The grid {m_j * 2^e}: per octave the levels m_0 = 1, m_j = m_{j-1} * ratio
// (binary64 products, so every machine builds the same table) while < 2.
// Index q stands for m_(q mod K) * 2^floor(q / K), K = levels per octave.
// Immutable. Thread safety: const methods are safe.
class LogGrid {
 public:
  // REQUIRES nothing: a ratio outside (1, 2] or one needing more than
  // kMaxLogLevels levels per octave is InvalidArgument.
  static Result<LogGrid> FromRatio(double ratio);
  // The ratio the encoder uses for a per-element relative bound: half a
  // step is then 0.95 * max_rel, the rest a margin for rounding the grid
  // point to the element type. Capped at 2.
  static double RatioFor(double max_rel);

  double ratio() const { return ratio_; }
  uint32_t per_octave() const { return per_octave_; }
  // The index of the grid point nearest to x (ties to the lower point).
  // REQUIRES: x finite and > 0.
  int64_t Index(double x) const;
  // The grid point of index q (0 or +Inf far outside the double range).
  double Value(int64_t q) const;
  // Exactly static_cast<float>(Value(q)), without a division or ldexp when
  // the result is a normal float: scaling by 2^e commutes with rounding to
  // float there, so it is the float of the level's mantissa with e added to
  // its exponent field. The decoder's per-element path.
  float FloatValue(int64_t q) const;

 private:
  double ratio_ = 2.0;
  uint32_t per_octave_ = 1;
  std::vector<double> mantissa_;  // m_0..m_{K-1}, ascending in [1, 2), then 2.0 (the next octave's m_0)
  // For a speed-up only (results equal a binary search): bucket b covers
  // mantissas [1 + b/B, 1 + (b+1)/B) and holds the last level <= 1 + b/B.
  // B >= 2K, so a bucket holds at most one level boundary.
  std::vector<uint32_t> bucket_level_;
  std::vector<uint32_t> mantissa_f32_bits_;  // bits of (float) m_j, j < K (exponent field 127, or 128 for 2.0f)
  double inv_per_octave_ = 1.0;              // 1 / K, for an estimate of floor(q / K) that is then corrected
  uint32_t bucket_shift_ = 52;  // 52 - log2(B): mantissa bits >> shift = bucket
};

inline float LogGrid::FloatValue(int64_t q) const {
  constexpr int64_t kFastRange = int64_t{1} << 30;  // q * (1/K) is then within far less than 1 of q / K
  if (q > -kFastRange && q < kFastRange) {
    const int64_t k = per_octave_;
    // Truncation is within one of floor(q / K); the loops correct it
    // (std::floor would be a libm call on the baseline instruction set).
    int64_t e = static_cast<int64_t>(static_cast<double>(q) * inv_per_octave_);
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
// EncodeOptions::reconstruction_out.
// REQUIRES: max_rel > 0, base empty or values.size(), n < 2^32.
Result<std::optional<EncodedChunk>> EncodeLogChunk(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                   Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out);

// Decodes the body of a log-mode stream (everything after the header, the
// checksum already removed and verified). `base` is empty unless h is a
// delta frame, then out.size() bytes.
Status DecodeLogBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                     Scratch::Buffers& s);

}  // namespace ckptfs::lossy
