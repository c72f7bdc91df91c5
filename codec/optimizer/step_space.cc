#include "codec/optimizer/step_space.h"

#include <bit>
#include <cmath>
#include <limits>

#include "codec/common/simd_level.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

[[gnu::always_inline]] inline float Load(const std::byte* p, size_t i) { return std::bit_cast<float>(LoadLE32(p + 4 * i)); }
[[gnu::always_inline]] inline void Store(std::byte* p, size_t i, float f) { StoreLE32(p + 4 * i, std::bit_cast<uint32_t>(f)); }

#if defined(__x86_64__)
// StepScales and DivideByScales eight lanes wide: the same IEEE binary32
// sqrt, add and divide per element (the compiler left their loops scalar:
// the validity test is a reduction), the test as two ordered compares
// (0 < s < inf, false for NaN), the tail by the scalar loop. The callers
// check CpuHasSimd.
__attribute__((target("avx2"))) bool AllPositiveFinite(__m256 good) { return _mm256_movemask_ps(good) == 0xFF; }

__attribute__((target("avx2"))) size_t StepScalesAvx2(const std::byte* v, size_t n, float eps, std::byte* s,
                                                     bool* ok) {
  const __m256 e = _mm256_set1_ps(eps), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 good = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 scale = _mm256_add_ps(_mm256_sqrt_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(v + 4 * i))), e);
    good = _mm256_and_ps(good, _mm256_and_ps(_mm256_cmp_ps(scale, _mm256_setzero_ps(), _CMP_GT_OQ),
                                             _mm256_cmp_ps(scale, inf, _CMP_LT_OQ)));
    _mm256_storeu_ps(reinterpret_cast<float*>(s + 4 * i), scale);
  }
  *ok = AllPositiveFinite(good);
  return i;
}

__attribute__((target("avx2"))) size_t DivideByScalesAvx2(const std::byte* m, const std::byte* s, size_t n,
                                                         std::byte* x, bool* ok) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 good = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 q = _mm256_div_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(m + 4 * i)),
                                   _mm256_loadu_ps(reinterpret_cast<const float*>(s + 4 * i)));
    good = _mm256_and_ps(good, _mm256_cmp_ps(_mm256_and_ps(q, abs_mask), inf, _CMP_LT_OQ));
    _mm256_storeu_ps(reinterpret_cast<float*>(x + 4 * i), q);
  }
  *ok = AllPositiveFinite(good);
  return i;
}
#endif

}  // namespace

// FromStepSpace also has an AVX2 clone, chosen when the process starts (the
// same IEEE operations eight lanes wide: the same bits).
#if defined(__x86_64__)
#define CKPTFS_STEP_SPACE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CKPTFS_STEP_SPACE_CLONES
#endif

bool StepScales(ByteSpan v, float eps, std::byte* s) {
  const size_t n = v.size() / 4;
  bool ok = true;
  size_t i = 0;
#if defined(__x86_64__)
  if (CpuHasSimd(SimdLevel::kAvx2)) i = StepScalesAvx2(v.data(), n, eps, s, &ok);
#endif
  for (; i < n; ++i) {
    const float x = Load(v.data(), i);
    const float scale = std::sqrt(x) + eps;  // NaN for x < 0 or NaN
    ok &= std::isfinite(scale) && scale > 0;
    Store(s, i, scale);
  }
  return ok;
}

bool DivideByScales(ByteSpan m, const std::byte* s, std::byte* x) {
  const size_t n = m.size() / 4;
  bool ok = true;
  size_t i = 0;
#if defined(__x86_64__)
  if (CpuHasSimd(SimdLevel::kAvx2)) i = DivideByScalesAvx2(m.data(), s, n, x, &ok);
#endif
  for (; i < n; ++i) {
    const float q = Load(m.data(), i) / Load(s, i);
    ok &= std::isfinite(q);
    Store(x, i, q);
  }
  return ok;
}

CKPTFS_STEP_SPACE_CLONES void FromStepSpace(MutableByteSpan x, const std::byte* s) {
  const size_t n = x.size() / 4;
  for (size_t i = 0; i < n; ++i) Store(x.data(), i, Load(x.data(), i) * Load(s, i));
}

}  // namespace ckptfs
