// What a decoder makes slice by slice instead of over the whole chunk: a
// first moment's step space (StepSpaceSlices), with the same bits as the
// whole-chunk kernels, a scaled prediction included, and a bad second
// moment reported; and step-predicted weights (lossy::PredictionSlices),
// with PredictWeights's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/optimizer/step_space.h"
#include "codec/optimizer/step_space_slices.h"
#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {
namespace {

std::vector<std::byte> F32s(const std::vector<float>& v) {
  std::vector<std::byte> out(4 * v.size());
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

struct Moments {
  std::vector<std::byte> v, base_m, x;
};

Moments Make(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n), m(n), x(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::exp2(-30.0f + 10.0f * normal(rng) / 3.0f);
    m[i] = 1e-4f * normal(rng);
    x[i] = normal(rng);
  }
  m[3] = std::numeric_limits<float>::infinity();  // the codec keeps non-finite values
  v[5] = 0.0f;                                     // s = eps
  return {F32s(v), F32s(m), F32s(x)};
}

TEST(StepSpaceSlices, SlicesGiveTheWholeChunksBits) {
  const size_t n = 10007;
  const Moments mo = Make(n, 1);
  const float eps = kStepSpaceEps;
  std::vector<std::byte> s(4 * n), base_x(4 * n);
  ASSERT_TRUE(StepScales(mo.v, eps, s.data()));
  DivideByScales(mo.base_m, s.data(), base_x.data());
  lossy::StepPredictor scaled;
  scaled.scale = 0.9;
  std::vector<std::byte> predicted(4 * n);
  lossy::StepSources sources;
  sources.weight_base = base_x;
  lossy::PredictWeights(scaled, sources, predicted);
  std::vector<std::byte> m_whole = mo.x;
  FromStepSpace(m_whole, s.data());

  const std::vector<const lossy::StepPredictor*> predictions = {nullptr, &scaled};
  for (const lossy::StepPredictor* prediction : predictions) {
    SCOPED_TRACE(prediction != nullptr);
    for (uint64_t slice : {uint64_t{8}, uint64_t{1000}, uint64_t{n}}) {
      const StepSpaceSlices slices(mo.v, eps, mo.base_m, prediction);
      EXPECT_EQ(slices.elements(), n);
      std::vector<std::byte> base(4 * n), m = mo.x;
      for (uint64_t first = 0; first < n; first += slice) {
        const uint64_t count = std::min<uint64_t>(slice, n - first);
        slices.Fill(first, count, base.data() + 4 * first);
        slices.Apply(first, count, m.data() + 4 * first);
      }
      EXPECT_EQ(base, prediction ? predicted : base_x) << "slice " << slice;
      EXPECT_EQ(m, m_whole) << "slice " << slice;
      EXPECT_TRUE(slices.scales_ok());
    }
  }
  // A key frame: Apply alone makes its own scales.
  const StepSpaceSlices key(mo.v, eps, {}, nullptr);
  std::vector<std::byte> m = mo.x;
  for (uint64_t first = 0; first < n; first += 512)
    key.Apply(first, std::min<uint64_t>(512, n - first), m.data() + 4 * first);
  EXPECT_EQ(m, m_whole);
}

TEST(StepSpaceSlices, ANegativeSecondMomentIsReported) {
  const size_t n = 4096;
  Moments mo = Make(n, 2);
  const float bad = -1.0f;
  std::memcpy(mo.v.data() + 4 * 3000, &bad, 4);
  const StepSpaceSlices slices(mo.v, kStepSpaceEps, mo.base_m, nullptr);
  std::vector<std::byte> out(4 * n);
  slices.Fill(0, 2048, out.data());
  EXPECT_TRUE(slices.scales_ok()) << "not in this slice";
  slices.Fill(2048, 2048, out.data() + 4 * 2048);
  EXPECT_FALSE(slices.scales_ok());
}

TEST(PredictionSlices, SlicesGivePredictWeightsBits) {
  const size_t n = 9001;
  const Moments now = Make(n, 3), before = Make(n, 4);
  const std::vector<std::byte> w = Make(n, 5).x;
  for (bool f32_steps : {false, true}) {
    SCOPED_TRACE(f32_steps);
    lossy::StepPredictor predictor;
    predictor.scale = 0.999;
    predictor.step = -1e-3;
    predictor.base_step = 2e-4;
    predictor.f32_steps = f32_steps;
    lossy::StepSources sources;
    sources.weight_base = w;
    sources.m = now.base_m;
    sources.v = now.v;
    sources.m_base = before.base_m;
    sources.v_base = before.v;
    ASSERT_TRUE(lossy::CheckStepSources(sources).ok());
    std::vector<std::byte> whole(4 * n);
    lossy::PredictWeights(predictor, sources, whole);
    const lossy::PredictionSlices slices(predictor, sources);
    EXPECT_EQ(slices.elements(), n);
    for (uint64_t slice : {uint64_t{8}, uint64_t{777}, uint64_t{n}}) {
      std::vector<std::byte> got(4 * n);
      for (uint64_t first = 0; first < n; first += slice)
        slices.Fill(first, std::min<uint64_t>(slice, n - first), got.data() + 4 * first);
      EXPECT_EQ(got, whole) << "slice " << slice;
    }
  }
}

}  // namespace
}  // namespace ckptfs
