#include "codec/tensor/lossy/level_gain.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

namespace {

constexpr size_t kLanes = 8;

// The sums' element step: an element stored exactly adds +0 (its r and d
// taken as 0), so the scalar and the vector loop add the same terms in the
// same order per lane.
struct LaneSums {
  double rr[kLanes] = {}, dr[kLanes] = {}, dd[kLanes] = {};
  void Add(size_t lane, float r, float x_hat, float b, uint32_t exact_from) {
    uint32_t r_bits;
    std::memcpy(&r_bits, &r, 4);
    const bool keep = (r_bits & 0x7FFFFFFFu) < exact_from;
    const double rd = keep ? static_cast<double>(r) : 0.0;
    const double d = keep ? static_cast<double>(x_hat) - static_cast<double>(b) : 0.0;
    rr[lane] += rd * rd;
    dr[lane] += d * rd;
    dd[lane] += d * d;
  }
};

float LoadF32(const std::byte* p, size_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

#if defined(__x86_64__)
// Blocks of 8 elements by AVX2, lanes 0-3 and 4-7 in two vectors each; the
// same products and adds as LaneSums::Add. Returns the elements done.
__attribute__((target("avx2"))) size_t SumBlocksAvx2(const float* r, const std::byte* recon, const std::byte* base,
                                                      size_t n, uint32_t exact_from, LaneSums* sums) {
  __m256d rr0 = _mm256_loadu_pd(sums->rr), rr1 = _mm256_loadu_pd(sums->rr + 4);
  __m256d dr0 = _mm256_loadu_pd(sums->dr), dr1 = _mm256_loadu_pd(sums->dr + 4);
  __m256d dd0 = _mm256_loadu_pd(sums->dd), dd1 = _mm256_loadu_pd(sums->dd + 4);
  const __m256i limit = _mm256_set1_epi32(static_cast<int>(exact_from));  // <= 0x7F800000: a signed compare serves
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 rv = _mm256_loadu_ps(r + i);
    const __m256i keep = _mm256_cmpgt_epi32(limit, _mm256_and_si256(_mm256_castps_si256(rv), magnitude));
    const __m256 kept_r = _mm256_and_ps(rv, _mm256_castsi256_ps(keep));
    const __m256 x = _mm256_and_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(recon) + i), _mm256_castsi256_ps(keep));
    const __m256 b = base == nullptr ? _mm256_setzero_ps()
                                     : _mm256_and_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(base) + i),
                                                     _mm256_castsi256_ps(keep));
    const __m256d r_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(kept_r)), r_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(kept_r, 1));
    const __m256d d_lo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
    const __m256d d_hi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
    rr0 = _mm256_add_pd(rr0, _mm256_mul_pd(r_lo, r_lo));
    rr1 = _mm256_add_pd(rr1, _mm256_mul_pd(r_hi, r_hi));
    dr0 = _mm256_add_pd(dr0, _mm256_mul_pd(d_lo, r_lo));
    dr1 = _mm256_add_pd(dr1, _mm256_mul_pd(d_hi, r_hi));
    dd0 = _mm256_add_pd(dd0, _mm256_mul_pd(d_lo, d_lo));
    dd1 = _mm256_add_pd(dd1, _mm256_mul_pd(d_hi, d_hi));
  }
  _mm256_storeu_pd(sums->rr, rr0), _mm256_storeu_pd(sums->rr + 4, rr1);
  _mm256_storeu_pd(sums->dr, dr0), _mm256_storeu_pd(sums->dr + 4, dr1);
  _mm256_storeu_pd(sums->dd, dd0), _mm256_storeu_pd(sums->dd + 4, dd1);
  return i;
}
#endif

}  // namespace

GainSums GainSums::Of(std::span<const float> residual, ByteSpan recon, ByteSpan base, uint32_t exact_from,
                      SimdLevel max_simd) {
  LaneSums lanes;
  const size_t n = residual.size();
  const std::byte* bp = base.empty() ? nullptr : base.data();
  size_t i = 0;
#if defined(__x86_64__)
  // A masked-out element is +0 in both paths (x_hat and b as 0, so d = +0).
  if (max_simd >= SimdLevel::kAvx2 && CpuHasSimd(SimdLevel::kAvx2))
    i = SumBlocksAvx2(residual.data(), recon.data(), bp, n, exact_from, &lanes);
#endif
  for (; i < n; ++i)
    lanes.Add(i % kLanes, residual[i], LoadF32(recon.data(), i), bp ? LoadF32(bp, i) : 0.0f, exact_from);
  GainSums sums;
  for (size_t l = 0; l < kLanes; ++l) sums.rr += lanes.rr[l], sums.dr += lanes.dr[l], sums.dd += lanes.dd[l];
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
