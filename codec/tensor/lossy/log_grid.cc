// The log mode's grid (log_codec.h, LOSSY.md section 9): the levels of an
// octave for a ratio, and the index of a value and the value of an index,
// which the encoder's passes and the decoder share.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/stream.h"

namespace ckptfs::lossy {

double LogGrid::RatioFor(double max_rel) {
  // Between levels l and rho*l, rounded in log, the element farthest from
  // its level is at the geometric midpoint x = l*sqrt(rho), a factor
  // sqrt(rho) from both: that is set to 1 + t, t = 0.95*max_rel (the rest is
  // margin for rounding to the element type), so rho = (1 + t)^2.
  const double t = 0.95 * max_rel;
  return std::min(2.0, (1.0 + t) * (1.0 + t));
}

Result<LogGrid> LogGrid::FromRatio(double ratio, LogRounding rounding) {
  if (!(ratio > 1.0 && ratio <= 2.0))
    return Status::InvalidArgument("log grid: ratio " + std::to_string(ratio) + ", want in (1, 2]");
  LogGrid g;
  g.ratio_ = ratio;
  g.rounding_ = rounding;
  g.mantissa_.push_back(1.0);
  for (double next = ratio; next < 2.0; next = next * ratio) {
    if (g.mantissa_.size() >= kMaxLogLevels)
      return Status::InvalidArgument("log grid: ratio " + std::to_string(ratio) + " needs over 2^16 levels per octave");
    g.mantissa_.push_back(next);
  }
  g.per_octave_ = static_cast<uint32_t>(g.mantissa_.size());
  g.inv_per_octave_ = 1.0 / static_cast<double>(g.per_octave_);
  const int64_t k = g.per_octave_;
  g.fast_offset_ = ((int64_t{1} << 30) + k - 1) / k * k;
  for (double m : g.mantissa_) g.mantissa_f32_bits_.push_back(std::bit_cast<uint32_t>(static_cast<float>(m)));
  g.mantissa_.push_back(2.0);
  for (uint32_t j = 0; j < g.per_octave_; ++j) g.products_.push_back(g.mantissa_[j] * g.mantissa_[j + 1]);
  uint32_t log2_buckets = 1;
  while ((1u << log2_buckets) < 2 * g.per_octave_) ++log2_buckets;
  g.bucket_shift_ = 52 - log2_buckets;
  g.float_bucket_shift_ = 23 - log2_buckets;  // log2_buckets <= 17 (K <= 2^16)
  g.bucket_level_.resize(size_t{1} << log2_buckets);
  uint32_t j = 0;
  for (size_t b = 0; b < g.bucket_level_.size(); ++b) {
    const double lower = 1.0 + std::ldexp(static_cast<double>(b), -static_cast<int>(log2_buckets));  // exact
    while (j + 1 < g.per_octave_ && g.mantissa_[j + 1] <= lower) ++j;
    g.bucket_level_[b] = j;
  }
  return g;
}

int64_t LogGrid::Index(double x) const {
  // x is a positive finite float, so a normal double: split its bits exactly
  // into x = m * 2^e with m in [1, 2).
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const int64_t e = static_cast<int64_t>(bits >> 52) - 1023;
  const uint64_t fraction = bits & ((uint64_t{1} << 52) - 1);
  const double m = std::bit_cast<double>(fraction | (uint64_t{1023} << 52));
  // j = the last level <= m (the bucket's level, or at most one further).
  uint32_t j = bucket_level_[fraction >> bucket_shift_];
  while (j + 1 < per_octave_ && mantissa_[j + 1] <= m) ++j;
  const int64_t q = e * per_octave_ + j;
  return RoundsUp(m, j) ? q + 1 : q;
}

double LogGrid::Value(int64_t q) const {
  const int64_t k = per_octave_;
  const int64_t e = q >= 0 ? q / k : -((-q + k - 1) / k);  // floor(q / k)
  const double m = mantissa_[static_cast<size_t>(q - e * k)];
  if (e >= -1022 && e <= 1023) return m * std::bit_cast<double>(static_cast<uint64_t>(e + 1023) << 52);  // exact
  return std::ldexp(m, static_cast<int>(std::clamp<int64_t>(e, -4000, 4000)));  // beyond the float range anyway
}

}  // namespace ckptfs::lossy
