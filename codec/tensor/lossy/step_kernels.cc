// The step prediction's element kernels (step_kernels.h). Compiled with
// -ffp-contract=off: the prediction is a decoder input and must be
// bit-identical wherever it is computed.
#include "codec/tensor/lossy/step_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::lossy::step_kernels {
namespace {

// Step() for the element types known at compile time (the per-element
// switch kept the loop from being vectorized: the prediction was half of a
// delta chain's decode time). Same operations, same order, same bits.
template <typename S>
[[gnu::always_inline]] inline double StepAs(const std::byte* m, const std::byte* v, double eps, uint64_t i) {
  const double mi = LoadAs<S>(m, i);
  double u = mi;
  if (v != nullptr) {
    const double vi = LoadAs<S>(v, i);
    const double q = mi / (std::sqrt(vi) + eps);  // computed for every lane: the loop vectorizes
    u = vi >= 0 ? q : 0.0;                        // negative or NaN v: 0
  }
  return std::isfinite(u) ? u : 0.0;
}

// StepAs in binary32 (f32_steps): the same tests, f32 square root, sum and
// quotient, the result widened exactly.
template <typename S>
[[gnu::always_inline]] inline float StepAsF32(const std::byte* m, const std::byte* v, float eps, uint64_t i) {
  typename S::Bits bits;
  std::memcpy(&bits, m + i * sizeof bits, sizeof bits);
  const float mi = S::ToFloat(bits);
  float u = mi;
  if (v != nullptr) {
    std::memcpy(&bits, v + i * sizeof bits, sizeof bits);
    const float vi = S::ToFloat(bits);
    const float q = mi / (std::sqrt(vi) + eps);
    u = vi >= 0 ? q : 0.0f;  // negative or NaN v: 0
  }
  return std::isfinite(u) ? u : 0.0f;
}

template <typename S>
void StepsPortable(const std::byte* m, const std::byte* v, double eps, uint64_t first, uint64_t count, double* u) {
  for (uint64_t k = 0; k < count; ++k) u[k] = StepAs<S>(m, v, eps, first + k);
}

template <typename S>
void StepsPortable(const std::byte* m, const std::byte* v, float eps, uint64_t first, uint64_t count, float* u) {
  for (uint64_t k = 0; k < count; ++k) u[k] = StepAsF32<S>(m, v, eps, first + k);
}

// The binary32 prediction (f32_steps): the coefficients rounded to binary32,
// products and sums in CombinePortable's order.
struct F32Coefficients {
  float scale, step, base_step;
  explicit F32Coefficients(const StepPredictor& pr)
      : scale(static_cast<float>(pr.scale)), step(static_cast<float>(pr.step)),
        base_step(static_cast<float>(pr.base_step)) {}
};

void CombinePortable(const F32Coefficients& c, const float* wb, const float* u, const float* ub, uint64_t count,
                     float* p) {
  for (uint64_t k = 0; k < count; ++k) {
    float q = c.scale * wb[k];
    q += c.step * u[k];
    q += c.base_step * ub[k];
    p[k] = q;
  }
}

void CombinePortable(const StepPredictor& pr, const float* wb, const double* u, const double* ub, uint64_t count,
                     float* p) {
  for (uint64_t k = 0; k < count; ++k) {
    double q = pr.scale * static_cast<double>(wb[k]);
    q += pr.step * u[k];
    q += pr.base_step * ub[k];
    p[k] = static_cast<float>(q);
  }
}

#if defined(__x86_64__)
// The steps' vector operations in binary64 (4 lanes, StepAs) and in
// binary32 (8 lanes, StepAsF32): one kernel below serves both.
struct StepLanesF64 {
  using T = double;
  using V = __m256d;
  static constexpr uint64_t kLanes = 4;
  CKPTFS_STEP_AVX2 static V Load(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
  CKPTFS_STEP_AVX2 static void Store(T* p, V x) { _mm256_storeu_pd(p, x); }
  CKPTFS_STEP_AVX2 static V Set(T x) { return _mm256_set1_pd(x); }
  CKPTFS_STEP_AVX2 static V Step(V m, V v, V eps) { return _mm256_div_pd(m, _mm256_add_pd(_mm256_sqrt_pd(v), eps)); }
  CKPTFS_STEP_AVX2 static V And(V a, V b) { return _mm256_and_pd(a, b); }
  CKPTFS_STEP_AVX2 static V AndNot(V a, V b) { return _mm256_andnot_pd(a, b); }
  CKPTFS_STEP_AVX2 static V GreaterEqual(V a, V b) { return _mm256_cmp_pd(a, b, _CMP_GE_OQ); }
  CKPTFS_STEP_AVX2 static V Less(V a, V b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
  static T Scalar(const std::byte* m, const std::byte* v, T eps, uint64_t i) { return StepAs<F32Elem>(m, v, eps, i); }
};
struct StepLanesF32 {
  using T = float;
  using V = __m256;
  static constexpr uint64_t kLanes = 8;
  CKPTFS_STEP_AVX2 static V Load(const float* p) { return _mm256_loadu_ps(p); }
  CKPTFS_STEP_AVX2 static void Store(T* p, V x) { _mm256_storeu_ps(p, x); }
  CKPTFS_STEP_AVX2 static V Set(T x) { return _mm256_set1_ps(x); }
  CKPTFS_STEP_AVX2 static V Step(V m, V v, V eps) { return _mm256_div_ps(m, _mm256_add_ps(_mm256_sqrt_ps(v), eps)); }
  CKPTFS_STEP_AVX2 static V And(V a, V b) { return _mm256_and_ps(a, b); }
  CKPTFS_STEP_AVX2 static V AndNot(V a, V b) { return _mm256_andnot_ps(a, b); }
  CKPTFS_STEP_AVX2 static V GreaterEqual(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  CKPTFS_STEP_AVX2 static V Less(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static T Scalar(const std::byte* m, const std::byte* v, T eps, uint64_t i) {
    return StepAsF32<F32Elem>(m, v, eps, i);
  }
};

// The steps of f32 state, L::kLanes wide: the same operations per element
// as L::Scalar (the portable code), so the same bits.
template <typename L>
CKPTFS_STEP_AVX2 void StepsF32Avx2(const std::byte* m, const std::byte* v, typename L::T eps, uint64_t first,
                                   uint64_t count, typename L::T* u) {
  using V = typename L::V;
  const float* mf = reinterpret_cast<const float*>(m) + first;
  const float* vf = v != nullptr ? reinterpret_cast<const float*>(v) + first : nullptr;
  const V eps_v = L::Set(eps), zero = L::Set(0), sign = L::Set(-0.0);
  const V inf = L::Set(std::numeric_limits<typename L::T>::infinity());
  uint64_t k = 0;
  for (; k + L::kLanes <= count; k += L::kLanes) {
    const V mi = L::Load(mf + k);
    V x = mi;
    if (vf != nullptr) {
      const V vi = L::Load(vf + k);
      x = L::And(L::Step(mi, vi, eps_v), L::GreaterEqual(vi, zero));  // negative or NaN v: +0
    }
    L::Store(u + k, L::And(x, L::Less(L::AndNot(sign, x), inf)));
  }
  for (; k < count; ++k) u[k] = L::Scalar(m, v, eps, first + k);
}

// The binary32 CombinePortable 8 lanes wide on f32 weights (w_base, or
// weights widened to f32 by the caller), with the not-finite fallback to
// w_base.
CKPTFS_STEP_AVX2 void CombineInF32Avx2(const F32Coefficients& c, const float* wb, const float* u, const float* ub,
                                       uint64_t count, float* out) {
  const __m256 scale = _mm256_set1_ps(c.scale), step = _mm256_set1_ps(c.step), base_step = _mm256_set1_ps(c.base_step);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  uint64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256 w = _mm256_loadu_ps(wb + k);
    __m256 q = _mm256_mul_ps(scale, w);
    q = _mm256_add_ps(q, _mm256_mul_ps(step, _mm256_loadu_ps(u + k)));
    q = _mm256_add_ps(q, _mm256_mul_ps(base_step, _mm256_loadu_ps(ub + k)));
    const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(sign, q), inf, _CMP_LT_OQ);
    _mm256_storeu_ps(out + k, _mm256_blendv_ps(w, q, finite));
  }
  for (; k < count; ++k) {
    float p;
    CombinePortable(c, wb + k, u + k, ub + k, 1, &p);
    out[k] = std::isfinite(p) ? p : wb[k];
  }
}

// scale w + step u + base_step ub of four elements, as CombinePortable
// (double products and sums in its order, then rounded to f32).
CKPTFS_STEP_AVX2 inline __m128 Combine4(__m256d scale, __m256d step, __m256d base_step, __m128 w, const double* u,
                                        const double* ub) {
  __m256d q = _mm256_mul_pd(scale, _mm256_cvtps_pd(w));
  q = _mm256_add_pd(q, _mm256_mul_pd(step, _mm256_loadu_pd(u)));
  q = _mm256_add_pd(q, _mm256_mul_pd(base_step, _mm256_loadu_pd(ub)));
  return _mm256_cvtpd_ps(q);
}

// CombinePortable 4 lanes wide on f32 weights, with the not-finite
// fallback to w_base (an f32 prediction that is not finite becomes w_base).
CKPTFS_STEP_AVX2 void CombineF32Avx2(const StepPredictor& pr, const std::byte* wb_bytes, const double* u,
                                     const double* ub, uint64_t count, std::byte* out_bytes) {
  const float* wb = reinterpret_cast<const float*>(wb_bytes);
  float* out = reinterpret_cast<float*>(out_bytes);
  const __m256d scale = _mm256_set1_pd(pr.scale);
  const __m256d step = _mm256_set1_pd(pr.step);
  const __m256d base_step = _mm256_set1_pd(pr.base_step);
  const __m128 sign = _mm_set1_ps(-0.0f);
  const __m128 inf = _mm_set1_ps(std::numeric_limits<float>::infinity());
  uint64_t k = 0;
  for (; k + 4 <= count; k += 4) {
    const __m128 w = _mm_loadu_ps(wb + k);
    const __m128 p = Combine4(scale, step, base_step, w, u + k, ub + k);
    const __m128 finite = _mm_cmplt_ps(_mm_andnot_ps(sign, p), inf);
    _mm_storeu_ps(out + k, _mm_blendv_ps(w, p, finite));
  }
  for (; k < count; ++k) {
    float p;
    CombinePortable(pr, wb + k, u + k, ub + k, 1, &p);
    out[k] = std::isfinite(p) ? p : wb[k];
  }
}

// CombineBlock for bf16 weights, 8 elements at a time (the rest are left
// to the caller; returns how many were done): the same double operations
// as CombineF32Avx2 on the weights widened to f32, then the bf16 rounding
// of FloatToBf16 (to nearest, ties to even; p is finite there) and its
// finiteness test. A p that is not finite, or rounds to an infinity,
// keeps w_base's bits, which is what the scalar path gives (it rounds
// w_base itself then, exactly).
CKPTFS_STEP_AVX2 uint64_t CombineBf16Avx2(const StepPredictor& pr, const std::byte* wb_bytes, const double* u,
                                          const double* ub, uint64_t count, std::byte* out_bytes) {
  const __m256d scale = _mm256_set1_pd(pr.scale);
  const __m256d step = _mm256_set1_pd(pr.step);
  const __m256d base_step = _mm256_set1_pd(pr.base_step);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256i exponent = _mm256_set1_epi32(0x7f80);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i half = _mm256_set1_epi32(0x7fff);
  uint64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256i wb16 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb_bytes + 2 * k)));
    const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(wb16, 16));
    const __m256 p = _mm256_set_m128(Combine4(scale, step, base_step, _mm256_extractf128_ps(w, 1), u + k + 4, ub + k + 4),
                                     Combine4(scale, step, base_step, _mm256_castps256_ps128(w), u + k, ub + k));
    const __m256i p_finite = _mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(sign, p), inf, _CMP_LT_OQ));
    const __m256i bits = _mm256_castps_si256(p);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, half), _mm256_and_si256(_mm256_srli_epi32(bits, 16), one)), 16);
    const __m256i rounded_inf = _mm256_cmpeq_epi32(_mm256_and_si256(rounded, exponent), exponent);
    const __m256i out = _mm256_blendv_epi8(wb16, rounded, _mm256_andnot_si256(rounded_inf, p_finite));
    // 16-bit results in 32-bit lanes: pack each half, then join the halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0b1000);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_bytes + 2 * k), _mm256_castsi256_si128(packed));
  }
  return k;
}
#endif

// A block of w_base's elements: their bits, and widened to f32.
template <typename W>
void WidenBlock(const std::byte* wb_p, uint64_t count, typename W::Bits* wb_bits, float* wb) {
  std::memcpy(wb_bits, wb_p, count * sizeof(typename W::Bits));
  for (uint64_t k = 0; k < count; ++k) wb[k] = W::ToFloat(wb_bits[k]);
}

// The f32 predictions p rounded to W into `o`; an element whose rounded
// value is not finite (or, with `p_finite_too`, whose p is not) keeps
// w_base's bits.
template <typename W>
void RoundBlock(const float* p, const typename W::Bits* wb_bits, uint64_t count, bool p_finite_too, std::byte* o) {
  for (uint64_t k = 0; k < count; ++k) {
    const typename W::Bits rounded = W::FromFloat(p[k]);
    const bool finite = (!p_finite_too || std::isfinite(p[k])) && std::isfinite(W::ToFloat(rounded));
    const typename W::Bits bits = finite ? rounded : wb_bits[k];
    std::memcpy(o + k * sizeof bits, &bits, sizeof bits);
  }
}

// p of a block of weights widened to f32 (p in f32): from binary64 steps
// in binary64 as CombinePortable, from binary32 steps (f32_steps) in
// binary32; AVX2 or portable, the same bits.
void CombineWidened(StepKernels kernels, const StepPredictor& pr, const float* wb, const double* u, const double* ub,
                    uint64_t count, float* p) {
#if defined(__x86_64__)
  if (kernels.avx2) {
    return CombineF32Avx2(pr, reinterpret_cast<const std::byte*>(wb), u, ub, count, reinterpret_cast<std::byte*>(p));
  }
#endif
  (void)kernels;
  CombinePortable(pr, wb, u, ub, count, p);
}
void CombineWidened(StepKernels kernels, const StepPredictor& pr, const float* wb, const float* u, const float* ub,
                    uint64_t count, float* p) {
  const F32Coefficients c(pr);
#if defined(__x86_64__)
  if (kernels.avx2) return CombineInF32Avx2(c, wb, u, ub, count, p);
#endif
  (void)kernels;
  CombinePortable(c, wb, u, ub, count, p);
}

}  // namespace

// step_kernels.h says what each of these computes.
template <typename S, typename T>
void Steps(StepKernels kernels, const std::byte* m, const std::byte* v, T eps, uint64_t first, uint64_t count, T* u) {
  if (m == nullptr) {
    std::fill(u, u + count, T{0});
    return;
  }
#if defined(__x86_64__)
  if constexpr (std::is_same_v<S, F32Elem>) {
    if (kernels.avx2) {
      return StepsF32Avx2<std::conditional_t<std::is_same_v<T, float>, StepLanesF32, StepLanesF64>>(m, v, eps, first,
                                                                                                 count, u);
    }
  }
#endif
  (void)kernels;
  StepsPortable<S>(m, v, eps, first, count, u);
}

template <typename W, typename T>
void CombineBlock(StepKernels kernels, const StepPredictor& pr, const std::byte* wb_p, const T* u, const T* ub,
                  uint64_t count, std::byte* o) {
  using Bits = typename W::Bits;
  constexpr bool kF32Steps = std::is_same_v<T, float>;
#if defined(__x86_64__)
  if constexpr (std::is_same_v<W, F32Elem>) {
    // f32 weights: straight from w_base into the output.
    if (kernels.avx2) {
      if constexpr (kF32Steps) {
        return CombineInF32Avx2(F32Coefficients(pr), reinterpret_cast<const float*>(wb_p), u, ub, count,
                                reinterpret_cast<float*>(o));
      } else {
        return CombineF32Avx2(pr, wb_p, u, ub, count, o);
      }
    }
  }
  if constexpr (std::is_same_v<W, BF16Elem> && !kF32Steps) {
    if (kernels.avx2) {
      const uint64_t done = CombineBf16Avx2(pr, wb_p, u, ub, count, o);
      wb_p += done * sizeof(Bits);
      u += done;
      ub += done;
      o += done * sizeof(Bits);
      count -= done;
      if (count == 0) return;
    }
  }
#endif
  float wb[kBlock] = {}, p[kBlock];  // (zeroed: GCC cannot tell that count elements are set)
  Bits wb_bits[kBlock];
  WidenBlock<W>(wb_p, count, wb_bits, wb);
  // (A not-finite f32 p that a vector kernel replaced by w_base converts
  // back to w_base's bits below, or fails the same finiteness test.)
  CombineWidened(kernels, pr, wb, u, ub, count, p);
  // With binary32 steps p itself is tested too.
  RoundBlock<W>(p, wb_bits, count, /*p_finite_too=*/kF32Steps, o);
}

// Every element type a checkpoint's weights and optimizer state come in.
#define CKPTFS_STEP_KERNELS(E)                                                                                         \
  template void Steps<E, double>(StepKernels, const std::byte*, const std::byte*, double, uint64_t, uint64_t,          \
                                 double*);                                                                             \
  template void Steps<E, float>(StepKernels, const std::byte*, const std::byte*, float, uint64_t, uint64_t, float*); \
  template void CombineBlock<E, double>(StepKernels, const StepPredictor&, const std::byte*, const double*,           \
                                        const double*, uint64_t, std::byte*);                                          \
  template void CombineBlock<E, float>(StepKernels, const StepPredictor&, const std::byte*, const float*, const float*, \
                                       uint64_t, std::byte*);
CKPTFS_STEP_KERNELS(F32Elem)
CKPTFS_STEP_KERNELS(F16Elem)
CKPTFS_STEP_KERNELS(BF16Elem)
#undef CKPTFS_STEP_KERNELS

}  // namespace ckptfs::lossy::step_kernels
