#include "codec/optimizer/step_space_slices.h"

#include "codec/optimizer/step_space.h"

namespace ckptfs {

const std::byte* StepSpaceSlices::Scales(uint64_t first, uint64_t count) const {
  if (scales_count_ == count && scales_first_ == first && count > 0) return scales_.data();
  if (scales_.size() < 4 * count) scales_.resize(4 * count);
  ok_ &= StepScales(v_.subspan(4 * first, 4 * count), eps_, scales_.data());
  scales_first_ = first;
  scales_count_ = count;
  return scales_.data();
}

void StepSpaceSlices::Fill(uint64_t first, uint64_t count, std::byte* out) const {
  const std::byte* s = Scales(first, count);
  const ByteSpan base = base_m_.subspan(4 * first, 4 * count);
  if (prediction_ == nullptr) {
    DivideByScales(base, s, out);  // any values: the codec keeps non-finite ones
    return;
  }
  if (base_x_.size() < 4 * count) base_x_.resize(4 * count);
  DivideByScales(base, s, base_x_.data());
  lossy::StepSources sources;
  sources.weight_type = lossy::ElementType::kF32;
  sources.weight_base = ByteSpan(base_x_.data(), 4 * count);
  lossy::PredictWeights(*prediction_, sources, MutableByteSpan(out, 4 * count));
}

void StepSpaceSlices::Apply(uint64_t first, uint64_t count, std::byte* slice) const {
  FromStepSpace(MutableByteSpan(slice, 4 * count), Scales(first, count));
}

}  // namespace ckptfs
