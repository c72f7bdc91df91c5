#include "codec/optimizer/master_copies.h"

#include <cmath>
#include <cstring>
#include <unordered_map>

#include "codec/optimizer/step_sources.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {
namespace {

uint64_t ElementCount(const TensorInfo& t, uint64_t bytes) { return bytes / DTypeSize(t.dtype); }

uint32_t LoadF32Bits(const std::byte* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

uint16_t LoadU16(const std::byte* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return u;
}

// Whether the sampled elements of `copy` (n of `type`) are those of
// `master` (n f32) rounded to that type.
bool SampledCopy(DType type, const std::byte* copy, const std::byte* master, uint64_t n) {
  const uint64_t samples = std::min(n, kCopySamples);
  const uint64_t need = samples * kCopyMinMatches / kCopySamples;
  uint64_t matches = 0;
  for (uint64_t k = 0; k < samples; ++k) {
    const uint64_t i = n <= samples ? k : k * (n - 1) / (samples - 1);
    const float m = lossy::BitsFloat(LoadF32Bits(master + 4 * i));
    const uint16_t rounded = type == DType::kBF16 ? lossy::FloatToBf16(m) : lossy::FloatToHalf(m);
    if (rounded == LoadU16(copy + 2 * i)) ++matches;
    if (matches + (samples - 1 - k) < need) return false;  // cannot reach it any more
  }
  return matches >= need;
}

}  // namespace

std::vector<int32_t> FindMasterCopies(const Layout& layout, ByteSpan file, const std::vector<bool>& eligible,
                                      const std::vector<bool>& excluded) {
  const size_t count = layout.tensors.size();
  std::vector<int32_t> master_of(count, -1);
  const std::vector<std::optional<uint64_t>> offsets = SingleSegmentOffsets(layout);
  std::vector<uint64_t> bytes(count, 0);
  for (const Segment& s : layout.segments)
    if (s.is_tensor()) bytes[s.tensor] += s.length;
  auto usable = [&](size_t t) {
    const TensorInfo& info = layout.tensors[t];
    return offsets[t].has_value() && !info.big_endian && !excluded[t] && bytes[t] > 0;
  };
  // Masters by element count, in file order.
  std::unordered_map<uint64_t, std::vector<int32_t>> masters;
  for (size_t t = 0; t < count; ++t)
    if (usable(t) && layout.tensors[t].dtype == DType::kF32)
      masters[ElementCount(layout.tensors[t], bytes[t])].push_back(static_cast<int32_t>(t));
  if (masters.empty()) return master_of;
  std::vector<bool> taken(count, false);
  for (size_t t = 0; t < count; ++t) {
    const DType type = layout.tensors[t].dtype;
    if (!eligible[t] || !usable(t) || (type != DType::kBF16 && type != DType::kF16)) continue;
    const uint64_t n = ElementCount(layout.tensors[t], bytes[t]);
    auto it = masters.find(n);
    if (it == masters.end()) continue;
    for (int32_t m : it->second) {
      if (taken[m] || !SampledCopy(type, file.data() + *offsets[t], file.data() + *offsets[m], n)) continue;
      master_of[t] = m;
      taken[m] = true;
      break;
    }
  }
  return master_of;
}

ChunkPrediction PredictCopy(lossy::ElementType type, ByteSpan values, ByteSpan base, ByteSpan master,
                            uint64_t master_offset, CodecScratch& scratch) {
  lossy::StepSources sources;
  sources.weight_type = type;
  std::byte* zeros = scratch.step_inputs[2].Reserve(values.size());
  std::memset(zeros, 0, values.size());
  sources.weight_base = ByteSpan(zeros, values.size());
  sources.state_type = lossy::ElementType::kF32;
  sources.m = master;
  ChunkPrediction out;
  out.step.has_step = true;
  out.step.copy = true;
  out.step.m_offset = master_offset;
  out.step.predictor = lossy::StepPredictor{0.0, 1.0, 0.0, 1e-8};  // p = m, rounded to the weights' type
  MutableByteSpan prediction(scratch.prediction.Reserve(values.size()), values.size());
  lossy::PredictWeights(out.step.predictor, sources, prediction);
  out.prediction = prediction;
  if (!base.empty()) {
    const DType dtype = type == lossy::ElementType::kF32 ? DType::kF32
                        : type == lossy::ElementType::kF16 ? DType::kF16 : DType::kBF16;
    const ErrorSums update = MeasureError(dtype, values, base);
    const double rel = update.ref2 > 0 ? std::sqrt(update.err2 / update.ref2) : 0.0;
    out.update_rel = std::isfinite(rel) ? rel : 0.0;
  }
  return out;
}

}  // namespace ckptfs
