// Compiled with -ffp-contract=off: the prediction is a decoder input and
// must be bit-identical wherever it is computed.
#include "codec/tensor/lossy/step_predictor.h"

#include <algorithm>
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

// Stores `value` rounded to `type` at element i of `out`, unless it is not
// finite there: then element i of `fallback` (its bits, unchanged).
void StoreOr(ElementType type, std::byte* out, uint64_t i, double value, ByteSpan fallback) {
  const float f = static_cast<float>(value);
  switch (type) {
    case ElementType::kF32:
      if (std::isfinite(f)) return StoreLE32(out + 4 * i, FloatBits(f));
      return StoreLE32(out + 4 * i, LoadLE32(fallback.data() + 4 * i));
    case ElementType::kF16: {
      const uint16_t h = FloatToHalf(f);
      if (std::isfinite(HalfToFloat(h))) return StoreLE16(out + 2 * i, h);
      return StoreLE16(out + 2 * i, LoadLE16(fallback.data() + 2 * i));
    }
    default: {
      const uint16_t h = FloatToBf16(f);
      if (std::isfinite(Bf16ToFloat(h))) return StoreLE16(out + 2 * i, h);
      return StoreLE16(out + 2 * i, LoadLE16(fallback.data() + 2 * i));
    }
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

void PredictWeights(const StepPredictor& pr, const StepSources& s, MutableByteSpan out) {
  const uint64_t n = Count(s.weight_type, s.weight_base);
  const bool has_step = !s.m.empty();
  const bool has_base_step = !s.m_base.empty();
  for (uint64_t i = 0; i < n; ++i) {
    const double wb = Load(s.weight_type, s.weight_base, i);
    const double u = has_step ? Step(s.state_type, s.m, s.v, pr.eps, i) : 0.0;
    const double ub = has_base_step ? Step(s.state_type, s.m_base, s.v_base, pr.eps, i) : 0.0;
    double p = pr.scale * wb;
    p += pr.step * u;
    p += pr.base_step * ub;
    StoreOr(s.weight_type, out.data(), i, p, s.weight_base);
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

std::optional<StepPredictor> FitStepPredictor(ByteSpan weights, const StepSources& s, double eps) {
  if (s.m.empty()) return std::nullopt;
  const uint64_t n = Count(s.weight_type, s.weight_base);
  const bool has_base_step = !s.m_base.empty();
  // Normal equations of d = w - w_base over (u, u_base).
  double uu = 0, ub_ub = 0, u_ub = 0, ud = 0, ub_d = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double w = Load(s.weight_type, weights, i);
    const double wb = Load(s.weight_type, s.weight_base, i);
    if (!std::isfinite(w) || !std::isfinite(wb)) continue;
    const double d = w - wb;
    const double u = Step(s.state_type, s.m, s.v, eps, i);
    const double ub = has_base_step ? Step(s.state_type, s.m_base, s.v_base, eps, i) : 0.0;
    uu += u * u;
    ub_ub += ub * ub;
    u_ub += u * ub;
    ud += u * d;
    ub_d += ub * d;
  }
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
