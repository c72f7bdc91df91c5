// A first moment's step space (step_space.h) made slice by slice where the
// decoder reads and writes it (lossy/base_slices.h): the base in step space,
// x_b = m_b / s (or a scale times it, the chunk's prediction), and the
// output m = x * s, with s = sqrt(v) + eps of the slice only.
//
// Why: over the whole chunk the same work was four passes over 4 MiB
// buffers (the scales, the base divided by them, the prediction, the output
// multiplied back), 16 % of a four-version chain's decode; in slices the
// scales and the base stay in cache between their uses. The same kernels
// on the same elements: the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/tensor/lossy/base_slices.h"
#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {

// Thread safety: one decode's (it keeps the last slice's scales for Apply).
class StepSpaceSlices final : public lossy::BaseSlices, public lossy::SliceFinish {
 public:
  // `v`: the chunk's second moment (f32, as many elements as the chunk);
  // `base_m`: the base version's first moment, or empty for a key frame;
  // `prediction`: a scale-only prediction of the base in step space (no
  // step term, FORMAT.md "Step prediction"), or null. The spans and the
  // predictor must outlive the object.
  StepSpaceSlices(ByteSpan v, float eps, ByteSpan base_m, const lossy::StepPredictor* prediction)
      : v_(v), eps_(eps), base_m_(base_m), prediction_(prediction) {}

  uint64_t elements() const override { return v_.size() / 4; }
  // The base in step space (or its prediction), elements [first, +count).
  // REQUIRES: base_m not empty.
  void Fill(uint64_t first, uint64_t count, std::byte* out) const override;
  // x -> m = x * s over the slice.
  void Apply(uint64_t first, uint64_t count, std::byte* slice) const override;

  // Whether every scale made so far was positive and finite (a negative or
  // non-finite second moment: the chunk is corrupt).
  bool scales_ok() const { return ok_; }

 private:
  // s of [first, +count): those of the last call when it was the same slice.
  const std::byte* Scales(uint64_t first, uint64_t count) const;

  ByteSpan v_;
  float eps_;
  ByteSpan base_m_;
  const lossy::StepPredictor* prediction_;
  mutable std::vector<std::byte> scales_;  // of [scales_first_, +scales_count_)
  mutable std::vector<std::byte> base_x_;  // a prediction's input
  mutable uint64_t scales_first_ = 0, scales_count_ = 0;
  mutable bool ok_ = true;
};

}  // namespace ckptfs
