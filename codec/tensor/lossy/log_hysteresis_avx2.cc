// Step 1b of the log mode (hysteresis, log_codec.cc) by AVX2 for f32
// elements. A second moment one step after its base has about a quarter
// of its elements marked (their nearest level moved); the scalar element
// took a tenth of a large delta frame's encode. Compiled with
// -ffp-contract=off like the rest of the codec: the bound check is the
// same IEEE double subtract and multiply as KeepPredictedLevel, so the
// results equal it bit for bit (tests/unit/codec/lossy_log_simd_test.cc).
#include <cstring>

#include "codec/tensor/lossy/log_index.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

#if defined(__x86_64__)

namespace {

#define CKPTFS_HYSTERESIS_AVX2 __attribute__((target("avx2"), always_inline)) inline

// WithinFactor(y, x, bound) for four lanes of doubles (factor = 1 + bound):
// y <= factor x and x <= factor y, the same products and compares.
CKPTFS_HYSTERESIS_AVX2 __m256i WithinBound(__m128 y, __m128 x, __m256d factor) {
  const __m256d xd = _mm256_cvtps_pd(x), yd = _mm256_cvtps_pd(y);
  return _mm256_castpd_si256(_mm256_and_pd(_mm256_cmp_pd(yd, _mm256_mul_pd(factor, xd), _CMP_LE_OQ),
                                           _mm256_cmp_pd(xd, _mm256_mul_pd(factor, yd), _CMP_LE_OQ)));
}

// Packs two 4 x 64-bit masks into 8 x 32-bit lanes (lanes 0-3, then 4-7).
CKPTFS_HYSTERESIS_AVX2 __m256i PackMasks(__m256i lo, __m256i hi) {
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i lo32 = _mm256_permutevar8x32_epi32(lo, pick);
  const __m256i hi32 = _mm256_permutevar8x32_epi32(hi, pick);
  return _mm256_blend_epi32(lo32, hi32, 0xF0);
}

}  // namespace

__attribute__((target("avx2"))) bool KeepPredictedLevelsF32Avx2(const LogGrid& grid, const LogFractionTable& table,
                                                                const std::byte* values, const int32_t* base_index,
                                                                int64_t origin, int32_t shift, double bound,
                                                                uint64_t n, int32_t* index, std::byte* recon,
                                                                const uint8_t* masks) {
  const int32_t per_octave = static_cast<int32_t>(grid.per_octave());
  const __m256i k = _mm256_set1_epi32(per_octave);
  const __m256d inv_k = _mm256_set1_pd(1.0 / static_cast<double>(per_octave));
  const __m256i shift_v = _mm256_set1_epi32(shift);
  const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  // Base indices beyond this may make the int32 sum wrap (real ones are
  // below 2^24): their group runs the scalar element, which tests the range.
  const __m256i index_limit = _mm256_set1_epi32(1 << 30);
  const __m256d bound_v = _mm256_set1_pd(1.0 + bound);  // WithinFactor's factor
  const int* level_bits = reinterpret_cast<const int*>(table.level_bits.data());
  bool changed = false;
  auto scalar_group = [&](uint64_t i, uint32_t m) {
    for (; m != 0; m &= m - 1) {
      const uint64_t at = i + static_cast<uint64_t>(__builtin_ctz(m));
      if (at < n) changed |= KeepPredictedLevel<F32Elem>(grid, values, base_index, origin, shift, bound, at, index, recon);
    }
  };
  for (uint64_t g = 0; g < (n + 7) / 8; ++g) {
    const uint32_t m = masks[g];
    if (m == 0) continue;
    const uint64_t i = g * 8;
    if (i + 8 > n) {
      scalar_group(i, m);
      continue;
    }
    const __m256i marked = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m)), lane_bits), lane_bits);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base_index + i));
    // A marked lane's base has an index (MovedLevelMasksAvx2).
    const __m256i far = _mm256_cmpgt_epi32(_mm256_abs_epi32(b), index_limit);
    const __m256i p = _mm256_add_epi32(b, shift_v);
    // FloatValue(p): e = floor(p / K) in doubles (exact for |p| < 2^31 and
    // corrected by one either way, as in the decoder), j = p - e K; a
    // normal level is level_bits[j] with e added to the exponent field.
    const __m128i e_lo =
        _mm256_cvttpd_epi32(_mm256_floor_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(p)), inv_k)));
    const __m128i e_hi =
        _mm256_cvttpd_epi32(_mm256_floor_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(p, 1)), inv_k)));
    __m256i e = _mm256_set_m128i(e_hi, e_lo);
    __m256i j = _mm256_sub_epi32(p, _mm256_mullo_epi32(e, k));
    const __m256i low = _mm256_cmpgt_epi32(zero, j);
    e = _mm256_add_epi32(e, low);
    j = _mm256_add_epi32(j, _mm256_and_si256(low, k));
    const __m256i high = _mm256_cmpgt_epi32(j, _mm256_sub_epi32(k, one));
    e = _mm256_sub_epi32(e, high);
    j = _mm256_sub_epi32(j, _mm256_and_si256(high, k));
    const __m256i abnormal = _mm256_cmpgt_epi32(_mm256_abs_epi32(e), _mm256_set1_epi32(126));
    if (_mm256_movemask_epi8(_mm256_and_si256(marked, _mm256_or_si256(far, abnormal))) != 0) {
      scalar_group(i, m);
      continue;
    }
    // j is in [0, K) on the marked lanes; the others (any base index, even
    // kNoIndex) are neither read from the table nor stored.
    const __m256i level = _mm256_mask_i32gather_epi32(zero, level_bits, j, marked, 4);
    const __m256i y = _mm256_add_epi32(level, _mm256_slli_epi32(e, 23));
    const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(values + 4 * i));
    const __m256 yf = _mm256_castsi256_ps(y);
    const __m256i within = PackMasks(WithinBound(_mm256_castps256_ps128(yf), _mm256_castps256_ps128(x), bound_v),
                                     WithinBound(_mm256_extractf128_ps(yf, 1), _mm256_extractf128_ps(x, 1), bound_v));
    // The bound check is false for NaN.
    const __m256i take = _mm256_and_si256(marked, within);
    if (_mm256_testz_si256(take, take)) continue;
    _mm256_maskstore_epi32(index + i, take, p);
    _mm256_maskstore_epi32(reinterpret_cast<int*>(recon + 4 * i), take, y);
    changed = true;
  }
  return changed;
}

#else

bool KeepPredictedLevelsF32Avx2(const LogGrid&, const LogFractionTable&, const std::byte*, const int32_t*, int64_t,
                                int32_t, double, uint64_t, int32_t*, std::byte*, const uint8_t*) {
  return false;
}

#endif

}  // namespace ckptfs::lossy
