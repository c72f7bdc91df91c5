// Compiled with -ffp-contract=off: the prediction is a decoder input and
// must be bit-identical wherever it is computed.
#include "codec/tensor/lossy/step_predictor.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <string>

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

template <typename W, typename S>
[[gnu::always_inline]] inline void PredictAs(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  const uint64_t n = s.weight_base.size() / sizeof(typename W::Bits);
  const std::byte* wb_p = s.weight_base.data();
  const std::byte* m = s.m.empty() ? nullptr : s.m.data();
  const std::byte* v = s.v.empty() ? nullptr : s.v.data();
  const std::byte* mb = s.m_base.empty() ? nullptr : s.m_base.data();
  const std::byte* vb = s.v_base.empty() ? nullptr : s.v_base.data();
  std::byte* o = out.data();
  for (uint64_t i = 0; i < n; ++i) {
    typename W::Bits wb_bits;
    std::memcpy(&wb_bits, wb_p + i * sizeof wb_bits, sizeof wb_bits);
    const double wb = W::ToFloat(wb_bits);
    const double u = m != nullptr ? StepAs<S>(m, v, pr.eps, i) : 0.0;
    const double ub = mb != nullptr ? StepAs<S>(mb, vb, pr.eps, i) : 0.0;
    double p = pr.scale * wb;
    p += pr.step * u;
    p += pr.base_step * ub;
    const typename W::Bits rounded = W::FromFloat(static_cast<float>(p));
    // Not finite in the weights' type: keep w_base's bits.
    const typename W::Bits bits = std::isfinite(W::ToFloat(rounded)) ? rounded : wb_bits;
    std::memcpy(o + i * sizeof bits, &bits, sizeof bits);
  }
}

template <typename W>
[[gnu::always_inline]] inline void PredictWithState(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  switch (s.state_type) {
    case ElementType::kF32: return PredictAs<W, F32Elem>(pr, s, out);
    case ElementType::kF16: return PredictAs<W, F16Elem>(pr, s, out);
    default: return PredictAs<W, BF16Elem>(pr, s, out);
  }
}

}  // namespace

// An AVX2 clone too, chosen when the process starts: the same IEEE double
// operations four lanes wide (no FMA), so the same bits.
#if defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
void PredictWeights(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  static_assert(std::endian::native == std::endian::little, "the element loads assume a little-endian host");
  switch (s.weight_type) {
    case ElementType::kF32: return PredictWithState<F32Elem>(pr, s, out);
    case ElementType::kF16: return PredictWithState<F16Elem>(pr, s, out);
    default: return PredictWithState<BF16Elem>(pr, s, out);
  }
}

std::optional<double> FitScale(ElementType type, ByteSpan values, ByteSpan base) {
  const uint64_t n = Count(type, base);
  double xb = 0, bb = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double x = Load(type, values, i);
    const double b = Load(type, base, i);
    if (!std::isfinite(x) || !std::isfinite(b)) continue;
    xb += x * b;
    bb += b * b;
  }
  if (!(bb > 0) || !std::isfinite(xb / bb)) return std::nullopt;
  return xb / bb;
}

namespace {

// The normal equations' sums of FitStepPredictor for element types known
// at compile time: the steps of a block are computed first (a loop that
// vectorizes: the square roots and divisions were most of the fit's time),
// then added in element order as before, so the sums keep their bits.
struct FitSums {
  double uu = 0, ub_ub = 0, u_ub = 0, ud = 0, ub_d = 0;
};
template <typename W, typename S>
[[gnu::always_inline]] inline FitSums FitSumsAs(ByteSpan weights, const StepSources& s, double eps) {
  const uint64_t n = s.weight_base.size() / sizeof(typename W::Bits);
  const std::byte* w_p = weights.data();
  const std::byte* wb_p = s.weight_base.data();
  const std::byte* m = s.m.data();
  const std::byte* v = s.v.empty() ? nullptr : s.v.data();
  const std::byte* mb = s.m_base.empty() ? nullptr : s.m_base.data();
  const std::byte* vb = s.v_base.empty() ? nullptr : s.v_base.data();
  constexpr uint64_t kBlock = 256;
  double u[kBlock], ub[kBlock];
  FitSums f;
  for (uint64_t first = 0; first < n; first += kBlock) {
    const uint64_t count = std::min(kBlock, n - first);
    for (uint64_t k = 0; k < count; ++k) u[k] = StepAs<S>(m, v, eps, first + k);
    for (uint64_t k = 0; k < count; ++k) ub[k] = mb != nullptr ? StepAs<S>(mb, vb, eps, first + k) : 0.0;
    for (uint64_t k = 0; k < count; ++k) {
      const double w = LoadAs<W>(w_p, first + k);
      const double wb = LoadAs<W>(wb_p, first + k);
      if (!std::isfinite(w) || !std::isfinite(wb)) continue;
      const double d = w - wb;
      f.uu += u[k] * u[k];
      f.ub_ub += ub[k] * ub[k];
      f.u_ub += u[k] * ub[k];
      f.ud += u[k] * d;
      f.ub_d += ub[k] * d;
    }
  }
  return f;
}

template <typename W>
[[gnu::always_inline]] inline FitSums FitSumsWithState(ByteSpan weights, const StepSources& s, double eps) {
  switch (s.state_type) {
    case ElementType::kF32: return FitSumsAs<W, F32Elem>(weights, s, eps);
    case ElementType::kF16: return FitSumsAs<W, F16Elem>(weights, s, eps);
    default: return FitSumsAs<W, BF16Elem>(weights, s, eps);
  }
}

// An AVX2 clone too (the same IEEE operations, so the same sums).
#if defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
FitSums ComputeFitSums(ByteSpan weights, const StepSources& s, double eps) {
  switch (s.weight_type) {
    case ElementType::kF32: return FitSumsWithState<F32Elem>(weights, s, eps);
    case ElementType::kF16: return FitSumsWithState<F16Elem>(weights, s, eps);
    default: return FitSumsWithState<BF16Elem>(weights, s, eps);
  }
}

}  // namespace

std::optional<StepPredictor> FitStepPredictor(ByteSpan weights, const StepSources& s, double eps) {
  if (s.m.empty()) return std::nullopt;
  // Normal equations of d = w - w_base over (u, u_base).
  const auto [uu, ub_ub, u_ub, ud, ub_d] = ComputeFitSums(weights, s, eps);
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

}  // namespace ckptfs::lossy
