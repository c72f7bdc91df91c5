// Compiled with -ffp-contract=off: the prediction is a decoder input and
// must be bit-identical wherever it is computed.
#include "codec/tensor/lossy/step_predictor.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <utility>
#include <string>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/element_ops.h"

namespace ckptfs::lossy {
namespace {

double Load(ElementType type, ByteSpan span, uint64_t i) {
  const std::byte* p = span.data();
  switch (type) {
    case ElementType::kF32: return BitsFloat(LoadLE32(p + 4 * i));
    case ElementType::kF16: return HalfToFloat(LoadLE16(p + 2 * i));
    default: return Bf16ToFloat(LoadLE16(p + 2 * i));
  }
}

uint64_t Count(ElementType type, ByteSpan span) { return span.size() / ElementSize(type); }

// u of element i: m / (sqrt(v) + eps), or m without v; 0 when not finite.
double Step(ElementType type, ByteSpan m, ByteSpan v, double eps, uint64_t i) {
  const double mi = Load(type, m, i);
  double u = mi;
  if (!v.empty()) {
    const double vi = Load(type, v, i);
    if (!(vi >= 0)) return 0.0;  // negative or NaN
    u = mi / (std::sqrt(vi) + eps);
  }
  return std::isfinite(u) ? u : 0.0;
}

}  // namespace

Status CheckStepSources(const StepSources& s) {
  const uint64_t n = Count(s.weight_type, s.weight_base);
  auto bad = [](const char* what) { return Status::InvalidArgument(std::string("step predictor: ") + what); };
  if (s.weight_base.size() % ElementSize(s.weight_type) != 0) return bad("weights are not whole elements");
  if (s.m.empty()) {
    if (!s.v.empty() || !s.m_base.empty() || !s.v_base.empty()) return bad("moments without a first moment");
    return Status::Ok();
  }
  if (s.m.size() != n * ElementSize(s.state_type)) return bad("first moment has another element count");
  if (!s.v.empty() && s.v.size() != s.m.size()) return bad("second moment has another element count");
  if (!s.m_base.empty() && s.m_base.size() != s.m.size()) return bad("base first moment has another element count");
  if (s.v_base.size() != (s.m_base.empty() || s.v.empty() ? 0 : s.m.size()))
    return bad("base second moment present exactly when both the second moment and the base first moment are");
  return Status::Ok();
}

namespace {

template <typename E>
[[gnu::always_inline]] inline double LoadAs(const std::byte* p, uint64_t i) {
  typename E::Bits bits;
  std::memcpy(&bits, p + i * sizeof bits, sizeof bits);
  return E::ToFloat(bits);
}

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

// The kernels below work in blocks: the steps u (and u_base) of a block are
// computed first, 4 lanes wide with AVX2 when the state is f32 (the square
// roots and divisions were most of a predicted chunk's time, and the
// element loop did not vectorize), then combined in element order. The
// vector lanes do the same IEEE binary64 operations in the same order as
// the portable code (no FMA), so both write the same bits.
constexpr uint64_t kBlock = 256;

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
#define CKPTFS_STEP_AVX2 __attribute__((target("avx2")))

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

// Which kernels a call uses: the vector ones when the CPU has AVX2.
struct StepKernels {
  bool avx2 = false;
  static StepKernels Best() { return StepKernels{CpuHasSimd(SimdLevel::kAvx2)}; }
};

// u of elements [first, first + count) into u, in binary64 or (f32_steps,
// T = float, eps rounded to binary32) binary32; all 0 without m.
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

// p of `count` (<= kBlock) elements from their steps: wb_p and o point at
// the block's first element.
template <typename W>
void CombineBlock(StepKernels kernels, const StepPredictor& pr, const std::byte* wb_p, const double* u,
                  const double* ub, uint64_t count, std::byte* o) {
  using Bits = typename W::Bits;
#if defined(__x86_64__)
  if constexpr (std::is_same_v<W, F32Elem>) {
    if (kernels.avx2) return CombineF32Avx2(pr, wb_p, u, ub, count, o);
  }
  if constexpr (std::is_same_v<W, BF16Elem>) {
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
  std::memcpy(wb_bits, wb_p, count * sizeof(Bits));
  for (uint64_t k = 0; k < count; ++k) wb[k] = W::ToFloat(wb_bits[k]);
  // (A not-finite f32 p that the vector kernel replaced by w_base converts
  // back to w_base's bits below, or fails the same finiteness test.)
#if defined(__x86_64__)
  if (kernels.avx2) {
    CombineF32Avx2(pr, reinterpret_cast<const std::byte*>(wb), u, ub, count, reinterpret_cast<std::byte*>(p));
  } else {
    CombinePortable(pr, wb, u, ub, count, p);
  }
#else
  CombinePortable(pr, wb, u, ub, count, p);
#endif
  for (uint64_t k = 0; k < count; ++k) {
    const Bits rounded = W::FromFloat(p[k]);
    // Not finite in the weights' type: keep w_base's bits.
    const Bits bits = std::isfinite(W::ToFloat(rounded)) ? rounded : wb_bits[k];
    std::memcpy(o + k * sizeof bits, &bits, sizeof bits);
  }
}

// CombineBlock in binary32 (f32_steps): p from the f32 steps, then rounded
// to W (f16/bf16) with the same fallback to w_base's bits.
template <typename W>
void CombineBlock(StepKernels kernels, const StepPredictor& pr, const std::byte* wb_p, const float* u, const float* ub,
                  uint64_t count, std::byte* o) {
  using Bits = typename W::Bits;
  const F32Coefficients c(pr);
#if defined(__x86_64__)
  if constexpr (std::is_same_v<W, F32Elem>) {
    // f32 weights: straight from w_base into the output (as CombineF32Avx2).
    if (kernels.avx2) {
      return CombineInF32Avx2(c, reinterpret_cast<const float*>(wb_p), u, ub, count, reinterpret_cast<float*>(o));
    }
  }
#endif
  float wb[kBlock] = {}, p[kBlock];  // (zeroed: GCC cannot tell that count elements are set)
  Bits wb_bits[kBlock];
  std::memcpy(wb_bits, wb_p, count * sizeof(Bits));
  for (uint64_t k = 0; k < count; ++k) wb[k] = W::ToFloat(wb_bits[k]);
#if defined(__x86_64__)
  if (kernels.avx2) {
    CombineInF32Avx2(c, wb, u, ub, count, p);
  } else {
    CombinePortable(c, wb, u, ub, count, p);
  }
#else
  (void)kernels;
  CombinePortable(c, wb, u, ub, count, p);
#endif
  for (uint64_t k = 0; k < count; ++k) {
    const Bits rounded = W::FromFloat(p[k]);
    // Not finite (in f32, or in the weights' type): keep w_base's bits.
    const Bits bits = std::isfinite(p[k]) && std::isfinite(W::ToFloat(rounded)) ? rounded : wb_bits[k];
    std::memcpy(o + k * sizeof bits, &bits, sizeof bits);
  }
}

template <typename W, typename S>
void PredictAs(StepKernels kernels, const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  using Bits = typename W::Bits;
  const uint64_t n = s.weight_base.size() / sizeof(Bits);
  const std::byte* m = s.m.empty() ? nullptr : s.m.data();
  const std::byte* v = s.v.empty() ? nullptr : s.v.data();
  const std::byte* mb = s.m_base.empty() ? nullptr : s.m_base.data();
  const std::byte* vb = s.v_base.empty() ? nullptr : s.v_base.data();
  if (pr.f32_steps) {
    const float eps = static_cast<float>(pr.eps);
    float u[kBlock], ub[kBlock];
    for (uint64_t first = 0; first < n; first += kBlock) {
      const uint64_t count = std::min(kBlock, n - first);
      Steps<S>(kernels, m, v, eps, first, count, u);
      Steps<S>(kernels, mb, vb, eps, first, count, ub);
      CombineBlock<W>(kernels, pr, s.weight_base.data() + first * sizeof(Bits), u, ub, count,
                      out.data() + first * sizeof(Bits));
    }
    return;
  }
  double u[kBlock], ub[kBlock];
  for (uint64_t first = 0; first < n; first += kBlock) {
    const uint64_t count = std::min(kBlock, n - first);
    Steps<S>(kernels, m, v, pr.eps, first, count, u);
    Steps<S>(kernels, mb, vb, pr.eps, first, count, ub);
    CombineBlock<W>(kernels, pr, s.weight_base.data() + first * sizeof(Bits), u, ub, count,
                    out.data() + first * sizeof(Bits));
  }
}

template <typename W>
void PredictWithState(StepKernels kernels, const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  switch (s.state_type) {
    case ElementType::kF32: return PredictAs<W, F32Elem>(kernels, pr, s, out);
    case ElementType::kF16: return PredictAs<W, F16Elem>(kernels, pr, s, out);
    default: return PredictAs<W, BF16Elem>(kernels, pr, s, out);
  }
}

void Predict(StepKernels kernels, const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  static_assert(std::endian::native == std::endian::little, "the element loads assume a little-endian host");
  switch (s.weight_type) {
    case ElementType::kF32: return PredictWithState<F32Elem>(kernels, pr, s, out);
    case ElementType::kF16: return PredictWithState<F16Elem>(kernels, pr, s, out);
    default: return PredictWithState<BF16Elem>(kernels, pr, s, out);
  }
}

}  // namespace

void PredictWeights(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  Predict(StepKernels::Best(), pr, s, out);
}

void PredictWeightsPortable(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  Predict(StepKernels{}, pr, s, out);
}

namespace {

// The fits' sums run in four interleaved lanes (element i of a call in
// lane i % 4, a tail shorter than 4 in lane 0, the lanes added in order at
// the end): the vector kernels below keep the four lanes in one register
// and give the same sums bit for bit (one running sum each was a tenth of
// a delta frame's encode, the loop serialized on its adds). An element
// whose inputs are not finite adds nothing.
template <typename E>
std::pair<double, double> ScaleSumsPortable(const std::byte* values, const std::byte* base, uint64_t n,
                                            uint64_t first = 0, const double* xb_lanes = nullptr,
                                            const double* bb_lanes = nullptr) {
  double xb[4] = {}, bb[4] = {};
  if (xb_lanes != nullptr) std::copy_n(xb_lanes, 4, xb), std::copy_n(bb_lanes, 4, bb);
  auto add = [&](uint64_t lane, uint64_t i) {
    const double x = LoadAs<E>(values, i);
    const double b = LoadAs<E>(base, i);
    if (!std::isfinite(x) || !std::isfinite(b)) return;
    xb[lane] += x * b;
    bb[lane] += b * b;
  };
  uint64_t i = first;
  for (; i + 4 <= n; i += 4)
    for (uint64_t l = 0; l < 4; ++l) add(l, i + l);
  for (; i < n; ++i) add(0, i);
  return {((xb[0] + xb[1]) + xb[2]) + xb[3], ((bb[0] + bb[1]) + bb[2]) + bb[3]};
}

#if defined(__x86_64__)
// ScaleSumsPortable<F32Elem>, its four lanes in one register.
CKPTFS_STEP_AVX2 std::pair<double, double> ScaleSumsF32Avx2(const std::byte* values, const std::byte* base,
                                                             uint64_t n) {
  const __m256d sign = _mm256_set1_pd(-0.0), inf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  __m256d xb = _mm256_setzero_pd(), bb = _mm256_setzero_pd();
  const float* xf = reinterpret_cast<const float*>(values);
  const float* bf = reinterpret_cast<const float*>(base);
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(xf + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(bf + i));
    const __m256d finite = _mm256_and_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, x), inf, _CMP_LT_OQ),
                                         _mm256_cmp_pd(_mm256_andnot_pd(sign, b), inf, _CMP_LT_OQ));
    // (+0.0 added for a skipped element: the sum is never -0.0, so exact.)
    xb = _mm256_add_pd(xb, _mm256_and_pd(finite, _mm256_mul_pd(x, b)));
    bb = _mm256_add_pd(bb, _mm256_and_pd(finite, _mm256_mul_pd(b, b)));
  }
  double xb_lanes[4], bb_lanes[4];
  _mm256_storeu_pd(xb_lanes, xb);
  _mm256_storeu_pd(bb_lanes, bb);
  return ScaleSumsPortable<F32Elem>(values, base, n, i, xb_lanes, bb_lanes);
}
#endif

std::optional<double> FitScaleWith(StepKernels kernels, ElementType type, ByteSpan values, ByteSpan base) {
  const uint64_t n = base.size() / ElementSize(type);
  std::pair<double, double> sums;
#if defined(__x86_64__)
  if (kernels.avx2 && type == ElementType::kF32) {
    sums = ScaleSumsF32Avx2(values.data(), base.data(), n);
  } else
#endif
  {
    (void)kernels;
    sums = type == ElementType::kF32   ? ScaleSumsPortable<F32Elem>(values.data(), base.data(), n)
           : type == ElementType::kF16 ? ScaleSumsPortable<F16Elem>(values.data(), base.data(), n)
                                       : ScaleSumsPortable<BF16Elem>(values.data(), base.data(), n);
  }
  const auto [xb, bb] = sums;
  if (!(bb > 0) || !std::isfinite(xb / bb)) return std::nullopt;
  return xb / bb;
}

}  // namespace

std::optional<double> FitScale(ElementType type, ByteSpan values, ByteSpan base) {
  return FitScaleWith(StepKernels::Best(), type, values, base);
}

std::optional<double> FitScalePortable(ElementType type, ByteSpan values, ByteSpan base) {
  return FitScaleWith(StepKernels{}, type, values, base);
}

namespace {

// The normal equations' sums of the fit, in the lanes above.
struct FitSums {
  double uu[4] = {}, ub_ub[4] = {}, u_ub[4] = {}, ud[4] = {}, ub_d[4] = {};
  double Total(const double (&lanes)[4]) const { return ((lanes[0] + lanes[1]) + lanes[2]) + lanes[3]; }
};

// Adds elements [first, n) with their steps u, ub (both indexed from
// element 0) to f: whole groups of four from `first` lane by lane, the
// tail in lane 0 (the vector kernel does the groups from 0, this its tail).
template <typename W, typename T>
void AddFitSumsPortable(const std::byte* w_p, const std::byte* wb_p, uint64_t first, uint64_t n, const T* u_t,
                        const T* ub_t, FitSums& f) {
  auto add = [&](uint64_t lane, uint64_t i) {
    const double w = LoadAs<W>(w_p, i);
    const double wb = LoadAs<W>(wb_p, i);
    if (!std::isfinite(w) || !std::isfinite(wb)) return;
    const double d = w - wb;
    const double u = u_t[i], ub = ub_t[i];
    f.uu[lane] += u * u;
    f.ub_ub[lane] += ub * ub;
    f.u_ub[lane] += u * ub;
    f.ud[lane] += u * d;
    f.ub_d[lane] += ub * d;
  };
  uint64_t i = first;
  for (; i + 4 <= n; i += 4)
    for (uint64_t l = 0; l < 4; ++l) add(l, i + l);
  for (; i < n; ++i) add(0, i);
}

#if defined(__x86_64__)
// AddFitSumsPortable<F32Elem, float> over all n elements, its lanes in
// registers.
CKPTFS_STEP_AVX2 void AddFitSumsF32Avx2(const std::byte* w_p, const std::byte* wb_p, uint64_t n, const float* u_t,
                                        const float* ub_t, FitSums& f) {
  const __m256d sign = _mm256_set1_pd(-0.0), inf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  const float* wf = reinterpret_cast<const float*>(w_p);
  const float* wbf = reinterpret_cast<const float*>(wb_p);
  __m256d uu = _mm256_setzero_pd(), ub_ub = uu, u_ub = uu, ud = uu, ub_d = uu;
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d w = _mm256_cvtps_pd(_mm_loadu_ps(wf + i)), wb = _mm256_cvtps_pd(_mm_loadu_ps(wbf + i));
    const __m256d finite = _mm256_and_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, w), inf, _CMP_LT_OQ),
                                         _mm256_cmp_pd(_mm256_andnot_pd(sign, wb), inf, _CMP_LT_OQ));
    const __m256d d = _mm256_sub_pd(w, wb);
    const __m256d u = _mm256_cvtps_pd(_mm_loadu_ps(u_t + i)), ub = _mm256_cvtps_pd(_mm_loadu_ps(ub_t + i));
    uu = _mm256_add_pd(uu, _mm256_and_pd(finite, _mm256_mul_pd(u, u)));
    ub_ub = _mm256_add_pd(ub_ub, _mm256_and_pd(finite, _mm256_mul_pd(ub, ub)));
    u_ub = _mm256_add_pd(u_ub, _mm256_and_pd(finite, _mm256_mul_pd(u, ub)));
    ud = _mm256_add_pd(ud, _mm256_and_pd(finite, _mm256_mul_pd(u, d)));
    ub_d = _mm256_add_pd(ub_d, _mm256_and_pd(finite, _mm256_mul_pd(ub, d)));
  }
  _mm256_storeu_pd(f.uu, uu);
  _mm256_storeu_pd(f.ub_ub, ub_ub);
  _mm256_storeu_pd(f.u_ub, u_ub);
  _mm256_storeu_pd(f.ud, ud);
  _mm256_storeu_pd(f.ub_d, ub_d);
  AddFitSumsPortable<F32Elem, float>(w_p, wb_p, i, n, u_t, ub_t, f);
}
#endif

template <typename W, typename T>
void AddFitSums(StepKernels kernels, const std::byte* w_p, const std::byte* wb_p, uint64_t n, const T* u,
                const T* ub, FitSums& f) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<W, F32Elem> && std::is_same_v<T, float>) {
    if (kernels.avx2) return AddFitSumsF32Avx2(w_p, wb_p, n, u, ub, f);
  }
#endif
  (void)kernels;
  AddFitSumsPortable<W, T>(w_p, wb_p, 0, n, u, ub, f);
}

// The coefficients from the normal equations' sums.
std::optional<StepPredictor> Solve(const FitSums& sums, double eps) {
  const double uu = sums.Total(sums.uu), ub_ub = sums.Total(sums.ub_ub), u_ub = sums.Total(sums.u_ub),
               ud = sums.Total(sums.ud), ub_d = sums.Total(sums.ub_d);
  if (!(uu > 0) || !std::isfinite(uu + ub_ub + u_ub + ud + ub_d)) return std::nullopt;
  StepPredictor p;
  p.eps = eps;
  p.step = ud / uu;  // u alone
  // Both, unless u_base is absent or (nearly) collinear with u: then the
  // determinant of the scaled system vanishes.
  const double det = uu * ub_ub - u_ub * u_ub;
  if (ub_ub > 0 && det > 1e-9 * uu * ub_ub) {
    p.step = (ud * ub_ub - ub_d * u_ub) / det;
    p.base_step = (ub_d * uu - ud * u_ub) / det;
  }
  if (!std::isfinite(p.step) || !std::isfinite(p.base_step)) return std::nullopt;
  return p;
}

// The fit and prediction with steps of type T (double, or float for
// f32_steps), `step_eps` eps in T.
template <typename W, typename S, typename T>
std::optional<StepPredictor> FitAndPredictIn(StepKernels kernels, ByteSpan weights, const StepSources& s, double eps,
                                             T step_eps, T* steps, MutableByteSpan out) {
  using Bits = typename W::Bits;
  const uint64_t n = s.weight_base.size() / sizeof(Bits);
  T* u = steps;
  T* ub = steps + n;
  Steps<S>(kernels, s.m.data(), s.v.empty() ? nullptr : s.v.data(), step_eps, 0, n, u);
  Steps<S>(kernels, s.m_base.empty() ? nullptr : s.m_base.data(), s.v_base.empty() ? nullptr : s.v_base.data(),
           step_eps, 0, n, ub);
  // Normal equations of d = w - w_base over (u, u_base).
  FitSums sums;
  AddFitSums<W, T>(kernels, weights.data(), s.weight_base.data(), n, u, ub, sums);
  std::optional<StepPredictor> fit = Solve(sums, eps);
  if (!fit) return std::nullopt;
  fit->f32_steps = std::is_same_v<T, float>;
  // A fit without the base term predicts as PredictWeights does without
  // the base's moments (u_base = 0), which is what a decoder then reads.
  if (fit->base_step == 0.0) std::fill(ub, ub + n, T{0});
  for (uint64_t first = 0; first < n; first += kBlock)
    CombineBlock<W>(kernels, *fit, s.weight_base.data() + first * sizeof(Bits), u + first, ub + first,
                    std::min(kBlock, n - first), out.data() + first * sizeof(Bits));
  return fit;
}

template <typename W, typename S>
std::optional<StepPredictor> FitAndPredictAs(StepKernels kernels, ByteSpan weights, const StepSources& s, double eps,
                                             bool f32, double* steps, MutableByteSpan out) {
  if (f32) {
    // (The steps of binary32 predictions as floats, in the first half of
    // the same working memory.)
    return FitAndPredictIn<W, S, float>(kernels, weights, s, eps, static_cast<float>(eps),
                                        reinterpret_cast<float*>(steps), out);
  }
  return FitAndPredictIn<W, S, double>(kernels, weights, s, eps, eps, steps, out);
}

template <typename W>
std::optional<StepPredictor> FitAndPredictWithState(StepKernels kernels, ByteSpan weights, const StepSources& s,
                                                    double eps, bool f32, double* steps, MutableByteSpan out) {
  switch (s.state_type) {
    case ElementType::kF32: return FitAndPredictAs<W, F32Elem>(kernels, weights, s, eps, f32, steps, out);
    case ElementType::kF16: return FitAndPredictAs<W, F16Elem>(kernels, weights, s, eps, f32, steps, out);
    default: return FitAndPredictAs<W, BF16Elem>(kernels, weights, s, eps, f32, steps, out);
  }
}

std::optional<StepPredictor> FitAndPredictWith(StepKernels kernels, ByteSpan weights, const StepSources& s,
                                               double eps, bool f32, double* steps, MutableByteSpan out) {
  if (s.m.empty()) return std::nullopt;
  switch (s.weight_type) {
    case ElementType::kF32: return FitAndPredictWithState<F32Elem>(kernels, weights, s, eps, f32, steps, out);
    case ElementType::kF16: return FitAndPredictWithState<F16Elem>(kernels, weights, s, eps, f32, steps, out);
    default: return FitAndPredictWithState<BF16Elem>(kernels, weights, s, eps, f32, steps, out);
  }
}

}  // namespace

std::optional<StepPredictor> FitAndPredict(ByteSpan weights, const StepSources& s, double eps, bool f32_steps,
                                           double* steps, MutableByteSpan out) {
  return FitAndPredictWith(StepKernels::Best(), weights, s, eps, f32_steps, steps, out);
}

std::optional<StepPredictor> FitAndPredictPortable(ByteSpan weights, const StepSources& s, double eps, bool f32_steps,
                                                   double* steps, MutableByteSpan out) {
  return FitAndPredictWith(StepKernels{}, weights, s, eps, f32_steps, steps, out);
}

double StepCorrelation(ByteSpan weights, const StepSources& s, double eps, uint64_t samples) {
  const uint64_t n = Count(s.weight_type, s.weight_base);
  if (n == 0 || samples == 0 || s.m.empty()) return 0.0;
  const uint64_t stride = std::max<uint64_t>(1, n / samples);
  double du = 0, dd = 0, uu = 0;
  for (uint64_t i = 0; i < n; i += stride) {
    const double d = Load(s.weight_type, weights, i) - Load(s.weight_type, s.weight_base, i);
    if (!std::isfinite(d)) continue;
    const double u = Step(s.state_type, s.m, s.v, eps, i);
    du += d * u;
    dd += d * d;
    uu += u * u;
  }
  return dd > 0 && uu > 0 ? du / std::sqrt(dd * uu) : 0.0;
}

void PredictionSlices::Fill(uint64_t first, uint64_t count, std::byte* out) const {
  const size_t state = ElementSize(sources_.state_type);
  auto part = [&](ByteSpan whole, size_t width) { return whole.empty() ? whole : whole.subspan(first * width, count * width); };
  StepSources slice = sources_;
  slice.weight_base = part(sources_.weight_base, 4);
  slice.m = part(sources_.m, state);
  slice.v = part(sources_.v, state);
  slice.m_base = part(sources_.m_base, state);
  slice.v_base = part(sources_.v_base, state);
  PredictWeights(predictor_, slice, MutableByteSpan(out, 4 * count));
}

}  // namespace ckptfs::lossy
