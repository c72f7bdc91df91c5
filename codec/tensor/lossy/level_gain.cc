#include "codec/tensor/lossy/level_gain.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

namespace ckptfs::lossy {

GainSums GainSums::Of(std::span<const float> residual, ByteSpan recon, ByteSpan base, uint32_t exact_from) {
  constexpr size_t kLanes = 8;
  double rr[kLanes] = {}, dr[kLanes] = {}, dd[kLanes] = {};
  const size_t n = residual.size();
  const std::byte* rp = recon.data();
  const std::byte* bp = base.empty() ? nullptr : base.data();
  for (size_t i = 0; i < n; ++i) {
    const float r = residual[i];
    uint32_t r_bits;
    std::memcpy(&r_bits, &r, 4);
    if ((r_bits & 0x7FFFFFFFu) >= exact_from) continue;
    float x_hat, b = 0.0f;
    std::memcpy(&x_hat, rp + 4 * i, 4);
    if (bp != nullptr) std::memcpy(&b, bp + 4 * i, 4);
    const double rd = r, d = static_cast<double>(x_hat) - b;
    rr[i % kLanes] += rd * rd;
    dr[i % kLanes] += d * rd;
    dd[i % kLanes] += d * d;
  }
  GainSums sums;
  for (size_t l = 0; l < kLanes; ++l) sums.rr += rr[l], sums.dr += dr[l], sums.dd += dd[l];
  return sums;
}

double UnbiasingGain(const GainSums& s, double cap_sq) {
  if (!(s.dr > 0) || !(s.dd > 0)) return 1.0;
  const double unbiased = s.rr / s.dr;
  auto error_sq = [&](double g) { return g * g * s.dd - 2 * g * s.dr + s.rr; };
  double g = unbiased;
  if (error_sq(g) > cap_sq) {
    // The larger root of error_sq(g) = cap_sq; the error falls until dr / dd.
    const double disc = s.dr * s.dr - s.dd * (s.rr - cap_sq);
    if (!(disc >= 0)) return 1.0;
    g = std::min(unbiased, (s.dr + std::sqrt(disc)) / s.dd);
  }
  return std::isfinite(g) && g > 1.0 ? g : 1.0;
}

std::optional<QuantizeTable> ScaledLevels(const QuantizeTable& table, double g) {
  QuantizeTable scaled = table;
  for (uint32_t j = 0; j < scaled.num_levels; ++j) {
    scaled.levels[j] = static_cast<float>(static_cast<double>(table.levels[j]) * g);
    if (!std::isfinite(scaled.levels[j])) return std::nullopt;
  }
  return scaled;
}

}  // namespace ckptfs::lossy
