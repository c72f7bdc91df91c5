// The log mode gives second moments back without a bias: the encoder rounds
// in log (LogRounding::kLog) and holds every element, kept levels
// included, within a factor 1 + max_rel either way. Rounding in value and a
// bound on |x_hat - x| / x gave Adam's exp_avg_sq back smaller on average
// (mean log ratio -0.04 to -0.15 on the eval's runs), and each step after
// a restore that much longer (docs/eval.md "What one restore does").
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/lossy.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

// The mean of log(y / x) over the positive elements of x.
double MeanLogRatio(const std::vector<float>& x, const std::vector<std::byte>& recon) {
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0)) continue;
    sum += std::log(static_cast<double>(testing::ElementAt(ElementType::kF32, recon, i)) / x[i]);
    ++count;
  }
  return sum / static_cast<double>(count);
}

// The default bound of update denominators (0.45: one level per octave).
constexpr double kMaxRel = 0.45;

TEST(LossyLogBias, KeyFramesRoundInLog) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> octaves(-30.0, -10.0);
  std::vector<float> v(1 << 16);
  for (float& x : v) x = static_cast<float>(std::exp2(octaves(rng)));
  Scratch scratch;
  Result<EncodedChunk> key =
      EncodeChunk(ElementType::kF32, testing::ToElements(ElementType::kF32, v), {}, Budget{0, 0, kMaxRel}, &scratch);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_NEAR(MeanLogRatio(v, key->reconstruction), 0.0, 0.01);
  // The same values rounded in value, as the format's Index does (what the
  // encoder did before): biased low, so this test can tell the two apart.
  Result<LogGrid> by_value = LogGrid::FromRatio(LogGrid::RatioFor(kMaxRel), LogRounding::kValue);
  ASSERT_TRUE(by_value.ok());
  double sum = 0;
  for (float x : v) sum += std::log(static_cast<double>(by_value->FloatValue(by_value->FloatIndex(x))) / x);
  EXPECT_LT(sum / static_cast<double>(v.size()), -0.04);
}

// A second moment that grows every version (Adam's v early in a run: beta2
// = 0.999 averages over a thousand steps) coded as a closed-loop chain of
// delta frames: hysteresis keeps each element's level while it stays within
// the bound, and a bound that allowed 1 - max_rel below but only 1 + max_rel
// above kept it low on average.
TEST(LossyLogBias, AGrowingSecondMomentIsNotKeptLow) {
  const size_t n = 1 << 15;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> octaves(-30.0, -10.0);
  std::lognormal_distribution<double> growth(std::log(1.04), 0.03);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(std::exp2(octaves(rng)));
  Scratch scratch;
  const Budget budget{0, 0, kMaxRel};
  std::vector<std::byte> base;
  double late_sum = 0;
  int late = 0;
  for (int version = 0; version < 60; ++version) {
    if (version > 0)
      for (float& x : v) x = static_cast<float>(x * growth(rng));
    Result<EncodedChunk> c =
        EncodeChunk(ElementType::kF32, testing::ToElements(ElementType::kF32, v), base, budget, &scratch);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (size_t i = 0; i < n; ++i) {
      const double y = testing::ElementAt(ElementType::kF32, c->reconstruction, i);
      ASSERT_TRUE(y <= (1 + kMaxRel) * v[i] && v[i] <= (1 + kMaxRel) * y) << "version " << version << " element " << i;
    }
    if (version >= 30) late_sum += MeanLogRatio(v, c->reconstruction), ++late;
    base = std::move(c->reconstruction);
  }
  EXPECT_NEAR(late_sum / late, 0.0, 0.05);
}

}  // namespace
}  // namespace ckptfs::lossy
