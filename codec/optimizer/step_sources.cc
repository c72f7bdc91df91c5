#include "codec/optimizer/step_sources.h"

#include <cmath>
#include <string_view>
#include <unordered_map>

#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {
namespace {

// Adam's default epsilon; the fit absorbs the rest (the prediction only has
// to be good, not exact).
constexpr double kStepEps = 1e-8;
// Elements sampled per candidate to tell which state belongs to a chunk.
constexpr uint64_t kCorrelationSamples = 2048;
// Below this |correlation| no candidate is taken to belong to the chunk.
constexpr double kMinCorrelation = 0.2;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The prediction, when it leaves at most kMaxPredictedEnergy of the update's
// energy (measured as the codec measures errors), with the update's size
// for the budget schedule.
// predictor.scale * base (no step term), as a decoder computes it, into
// scratch.prediction.
MutableByteSpan WriteScaledBase(lossy::ElementType type, ByteSpan base, const lossy::StepPredictor& predictor,
                                CodecScratch& scratch) {
  lossy::StepSources sources;
  sources.weight_type = type;
  sources.weight_base = base;
  MutableByteSpan prediction(scratch.prediction.Reserve(base.size()), base.size());
  lossy::PredictWeights(predictor, sources, prediction);
  return prediction;
}

std::optional<ChunkPrediction> KeepIfItHelps(lossy::ElementType type, ByteSpan values, ByteSpan base,
                                             ByteSpan prediction, const StepPrediction& step) {
  const DType dtype = type == lossy::ElementType::kF32   ? DType::kF32
                      : type == lossy::ElementType::kF16 ? DType::kF16
                                                         : DType::kBF16;
  const auto [update, left] = MeasureErrorPair(dtype, values, base, prediction);
  // A base with Inf where the values are finite (a run rolled back from a
  // divergence) makes both sums infinite: no prediction, and no infinite
  // update for the schedule (the parameters would not decode).
  if (!(update.err2 > 0) || !std::isfinite(update.err2) || !std::isfinite(update.ref2) ||
      !(left.err2 <= kMaxPredictedEnergy * update.err2))
    return std::nullopt;
  ChunkPrediction out;
  out.prediction = prediction;
  out.update_rel = update.ref2 > 0 ? std::sqrt(update.err2 / update.ref2) : 0.0;
  if (!std::isfinite(out.update_rel)) return std::nullopt;
  out.step = step;
  return out;
}

}  // namespace

std::vector<std::optional<uint64_t>> SingleSegmentOffsets(const Layout& layout) {
  const size_t n = layout.tensors.size();
  std::vector<std::optional<uint64_t>> offset(n);
  std::vector<int> segments(n, 0);
  for (const Segment& s : layout.segments)
    if (s.is_tensor() && ++segments[s.tensor] == 1) offset[s.tensor] = s.offset;
  for (size_t t = 0; t < n; ++t)
    if (segments[t] != 1) offset[t].reset();
  return offset;
}

StepStates FindStepStates(const Layout& layout) {
  StepStates out;
  const size_t n = layout.tensors.size();
  out.is_state.assign(n, false);
  out.is_momentum.assign(n, false);
  out.tensor_offset = SingleSegmentOffsets(layout);
  out.tensor_elements.assign(n, 0);
  for (const Segment& s : layout.segments)
    if (s.is_tensor()) out.tensor_elements[s.tensor] += s.length / DTypeSize(layout.tensors[s.tensor].dtype);
  std::unordered_map<std::string_view, int32_t> by_name;
  for (size_t t = 0; t < n; ++t) by_name.emplace(layout.tensors[t].name, static_cast<int32_t>(t));
  auto usable = [&](int32_t t) {
    const TensorInfo& info = layout.tensors[t];
    return out.tensor_offset[t].has_value() && IsCodecFloat(info.dtype) && !info.big_endian;
  };
  for (size_t t = 0; t < n; ++t) {
    const std::string& name = layout.tensors[t].name;
    StepStateTensors state;
    if (EndsWith(name, ".exp_avg")) {
      auto v = by_name.find(name + "_sq");
      if (v == by_name.end()) continue;
      state = {static_cast<int32_t>(t), v->second};
    } else if (EndsWith(name, ".momentum_buffer")) {
      state = {static_cast<int32_t>(t), -1};
    } else {
      continue;
    }
    const TensorInfo& m = layout.tensors[state.m];
    if (!usable(state.m)) continue;
    if (state.v >= 0) {
      const TensorInfo& v = layout.tensors[state.v];
      if (!usable(state.v) || v.dtype != m.dtype || v.shape != m.shape) continue;
      out.is_state[state.v] = true;
    }
    out.is_state[state.m] = true;
    out.is_momentum[state.m] = true;
    out.states.push_back(state);
  }
  return out;
}

std::optional<ChunkPrediction> PredictChunk(lossy::ElementType weight_type, ByteSpan values, ByteSpan base,
                                            ByteSpan recon, const std::vector<StepCandidate>& candidates,
                                            const BaseViewer& read_base,
                                            CodecScratch& scratch) {
  if (base.empty() || base.size() != values.size() || candidates.empty()) return std::nullopt;
  const uint64_t n = values.size() / lossy::ElementSize(weight_type);
  if (n < kMinPredictedElements) return std::nullopt;
  lossy::StepSources sources;
  sources.weight_type = weight_type;
  sources.weight_base = base;
  // The candidate whose step direction follows the update best.
  const StepCandidate* best = nullptr;
  double best_corr = kMinCorrelation;
  for (const StepCandidate& c : candidates) {
    const uint64_t length = n * lossy::ElementSize(c.state_type);
    sources.state_type = c.state_type;
    sources.m = recon.subspan(c.m_offset, length);
    sources.v = c.has_v ? recon.subspan(c.v_offset, length) : ByteSpan();
    const double corr = std::fabs(lossy::StepCorrelation(values, sources, kStepEps, kCorrelationSamples));
    if (corr > best_corr) {
      best_corr = corr;
      best = &c;
    }
  }
  if (best == nullptr) return std::nullopt;
  const uint64_t length = n * lossy::ElementSize(best->state_type);
  StepPrediction step;
  step.state_type = best->state_type;
  step.has_step = true;
  step.has_v = best->has_v;
  step.m_offset = best->m_offset;
  step.v_offset = best->has_v ? best->v_offset : 0;
  sources.state_type = best->state_type;
  sources.m = recon.subspan(best->m_offset, length);
  sources.v = best->has_v ? recon.subspan(best->v_offset, length) : ByteSpan();
  sources.m_base = sources.v_base = ByteSpan();
  // The base's state, in place where its reader holds it (until this
  // returns: only the fit reads it).
  std::shared_ptr<const void> m_hold, v_hold;
  if (best->m_base_offset && (!best->has_v || best->v_base_offset)) {
    MutableByteSpan m_buffer(scratch.step_inputs[2].ReserveForFallback(length), length);
    MutableByteSpan v_buffer(scratch.step_inputs[3].ReserveForFallback(length), length);
    Result<ByteSpan> m_base = read_base(*best->m_base_offset, m_buffer, &m_hold);
    Result<ByteSpan> v_base = best->has_v ? read_base(*best->v_base_offset, v_buffer, &v_hold) : ByteSpan();
    if (m_base.ok() && v_base.ok()) {
      sources.m_base = *m_base;
      if (best->has_v) sources.v_base = *v_base;
      step.has_base_step = true;
      step.m_base_offset = *best->m_base_offset;
      step.v_base_offset = best->has_v ? *best->v_base_offset : 0;
    }
  }
  if (!lossy::CheckStepSources(sources).ok()) return std::nullopt;
  // Fitted and predicted in one call: each element's steps are computed once.
  MutableByteSpan prediction(scratch.prediction.Reserve(values.size()), values.size());
  auto* steps = reinterpret_cast<double*>(scratch.steps.Reserve(2 * n * sizeof(double)));
  std::optional<lossy::StepPredictor> fit = lossy::FitAndPredict(values, sources, kStepEps, /*f32_steps=*/true, steps, prediction);
  if (!fit) return std::nullopt;
  if (step.has_base_step && fit->base_step == 0.0) {
    // The base term did not enter the fit (nor the prediction): do not make
    // the decoder read it.
    step.has_base_step = false;
    step.m_base_offset = step.v_base_offset = 0;
  }
  step.predictor = *fit;
  // Keep it only when it explains enough of the update.
  return KeepIfItHelps(weight_type, values, base, prediction, step);
}

std::optional<ChunkPrediction> PredictScaledBase(lossy::ElementType type, ByteSpan values, ByteSpan base,
                                                 CodecScratch& scratch) {
  if (base.empty() || base.size() != values.size()) return std::nullopt;
  if (values.size() / lossy::ElementSize(type) < kMinPredictedElements) return std::nullopt;
  std::optional<double> scale = lossy::FitScale(type, values, base);
  if (!scale) return std::nullopt;
  StepPrediction step;
  step.predictor.scale = *scale;
  const MutableByteSpan prediction = WriteScaledBase(type, base, step.predictor, scratch);
  return KeepIfItHelps(type, values, base, prediction, step);
}


std::optional<ScaledBase> FitScaledBase(ByteSpan x, ByteSpan base_x, CodecScratch& scratch) {
  if (base_x.size() != x.size() || x.empty()) return std::nullopt;
  const ErrorSums update = MeasureError(DType::kF32, x, base_x);
  if (!(update.ref2 > 0) || !std::isfinite(update.ref2) || !std::isfinite(update.err2)) return std::nullopt;
  ScaledBase out;
  out.x2 = update.ref2;
  out.prediction.step.predictor.scale = lossy::FitScale(lossy::ElementType::kF32, x, base_x).value_or(0.0);
  out.values = WriteScaledBase(lossy::ElementType::kF32, base_x, out.prediction.step.predictor, scratch);
  out.prediction.prediction = out.values;
  out.prediction.update_rel = std::sqrt(update.err2 / update.ref2);
  return out;
}

}  // namespace ckptfs
