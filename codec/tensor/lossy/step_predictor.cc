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

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/step_kernels.h"

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

using step_kernels::CombineBlock;
using step_kernels::kBlock;
using step_kernels::LoadAs;
using step_kernels::StepKernels;
using step_kernels::Steps;


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
