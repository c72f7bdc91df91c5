// Unbiased levels (EncodeOptions::unbiased_levels, level_gain.h): the
// reconstruction's residual is not shrunk on average (<x_hat - b, r> =
// <r, r>), the levels as searched meet the budget (so no rescaling of the
// residual is further than the budget), the gain raises the error by at
// most kUnbiasAllowance, the symbols are those of the levels as searched,
// and the stream decodes to the encoder's reconstruction.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "codec/tensor/lossy/level_gain.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/stream.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

struct Moments {
  double rr = 0, dr = 0, dd = 0, error = 0, norm = 0;  // over all elements; error and norm of x
};

Moments Measure(const std::vector<float>& x, const std::vector<float>& b, const std::vector<std::byte>& recon) {
  Moments m;
  for (size_t i = 0; i < x.size(); ++i) {
    const double bi = b.empty() ? 0.0 : b[i];
    const double r = x[i] - bi, d = testing::ElementAt(ElementType::kF32, recon, i) - bi;
    m.rr += r * r, m.dr += d * r, m.dd += d * d;
    m.error += (d - r) * (d - r), m.norm += static_cast<double>(x[i]) * x[i];
  }
  return m;
}

// A first moment's update: heavy-tailed, so pruning and the search's
// levels both shrink it.
std::vector<float> Update(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t(3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = scale * t(rng);
  return v;
}

TEST(LossyLevelGain, TheResidualComesBackUnbiasedAndItsDirectionWithinTheBudget) {
  const size_t n = 1 << 16;
  int fully_unbiased = 0;  // cases at 0.5 whose gain was not held back
  for (const bool delta : {false, true}) {
    for (const double budget : {0.1, 0.5}) {
      const std::vector<float> b = delta ? Update(n, 1, 1.0f) : std::vector<float>();
      std::vector<float> x = Update(n, 2, 1.0f);  // a residual as large as the base: not all pruned
      if (delta)
        for (size_t i = 0; i < n; ++i) x[i] += b[i];
      const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, x);
      const std::vector<std::byte> base = delta ? testing::ToElements(ElementType::kF32, b) : std::vector<std::byte>();
      Scratch scratch;
      EncodeOptions plain_options, unbiased_options;
      unbiased_options.unbiased_levels = true;
      Result<EncodedChunk> plain = EncodeChunk(ElementType::kF32, values, base, Budget{budget}, &scratch, plain_options);
      Result<EncodedChunk> unbiased =
          EncodeChunk(ElementType::kF32, values, base, Budget{budget}, &scratch, unbiased_options);
      ASSERT_TRUE(plain.ok() && unbiased.ok());
      const std::string what = std::string(delta ? "delta" : "key") + " frame at " + std::to_string(budget);
      ASSERT_EQ(unbiased->stats.mode, static_cast<uint8_t>(StreamMode::kQuantized)) << what;
      const Moments p = Measure(x, b, plain->reconstruction), u = Measure(x, b, unbiased->reconstruction);
      if (budget >= 0.5) {
        EXPECT_LT(p.dr / p.rr, 0.95) << what << ": the searched levels shrink the residual";
      }
      // Unbiased, or as far as the allowance goes.
      const bool at_allowance = std::sqrt(u.error / u.norm) >= budget * kUnbiasAllowance * (1 - 1e-3);
      EXPECT_TRUE(std::fabs(u.dr / u.rr - 1.0) < 2e-3 || (at_allowance && u.dr > p.dr))
          << what << ": gain " << u.dr / u.rr << ", error " << std::sqrt(u.error / u.norm);
      fully_unbiased += budget >= 0.5 && std::fabs(u.dr / u.rr - 1.0) < 2e-3;
      // The same configuration (bits, classes), only the levels scaled.
      EXPECT_EQ(unbiased->stats.bits, plain->stats.bits) << what;
      EXPECT_EQ(unbiased->stats.pruned, plain->stats.pruned) << what;
      EXPECT_EQ(unbiased->stats.exact, plain->stats.exact) << what;
      // The searched levels met the budget, and no rescaling of the
      // reconstruction's residual comes closer than they did.
      EXPECT_LE(std::sqrt(p.error / p.norm), budget) << what;
      const double best_rescaled = p.rr - u.dr * u.dr / u.dd;  // min over c of |c d - r|^2
      EXPECT_LE(std::sqrt(std::max(0.0, best_rescaled) / u.norm), budget * (1 + 1e-6)) << what;
      EXPECT_LE(std::sqrt(u.error / u.norm), budget * kUnbiasAllowance) << what;
      EXPECT_NEAR(unbiased->stats.rel_l2, std::sqrt(u.error / u.norm), 1e-9) << what;
      std::vector<std::byte> out(values.size());
      Status st = testing::DecodeBothWays(ElementType::kF32, unbiased->bytes, base, out, &scratch);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(out == unbiased->reconstruction) << what;
    }
  }
  EXPECT_GE(fully_unbiased, 1);
}

// A gain the allowance holds back is aimed just inside it, so the
// rounding of the scaled levels does not push the error past it (which
// drops the gain: the chunk comes back shrunk). Aimed at the allowance
// itself, 9 of these 30 chunks lost their gain.
TEST(LossyLevelGain, AGainHeldByTheAllowanceIsKept) {
  const size_t n = 1 << 14;
  int held = 0, dropped = 0;
  for (uint32_t seed = 10; seed < 40; ++seed) {
    const std::vector<float> b = Update(n, seed, 1.0f);
    std::vector<float> x = Update(n, seed + 1000, 1.0f);
    for (size_t i = 0; i < n; ++i) x[i] += b[i];
    const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, x);
    const std::vector<std::byte> base = testing::ToElements(ElementType::kF32, b);
    Scratch scratch;
    EncodeOptions plain_options, options;
    options.unbiased_levels = true;
    Result<EncodedChunk> plain = EncodeChunk(ElementType::kF32, values, base, Budget{0.5}, &scratch, plain_options);
    Result<EncodedChunk> unbiased = EncodeChunk(ElementType::kF32, values, base, Budget{0.5}, &scratch, options);
    ASSERT_TRUE(plain.ok() && unbiased.ok());
    const Moments p = Measure(x, b, plain->reconstruction), u = Measure(x, b, unbiased->reconstruction);
    if (std::fabs(u.dr / u.rr - 1.0) < 2e-3) continue;  // unbiased within the allowance
    ++held;
    const double rel = std::sqrt(u.error / u.norm);
    if (u.dr <= p.dr || rel < 0.5 * kUnbiasAllowance * (1 - 1e-3)) ++dropped;
    EXPECT_LE(rel, 0.5 * kUnbiasAllowance) << seed;
  }
  EXPECT_GE(held, 10) << "the cases exercise the allowance";
  EXPECT_EQ(dropped, 0) << "of " << held << " gains held by the allowance";
}

// Weights: a small update on a large base at a budget of 1e-2, allowance
// 1 (the budget itself): the gain takes the room the search left under the
// budget, so the update comes back less shrunk, unbiased where the room
// suffices, and the error stays within the budget.
TEST(LossyLevelGain, WithinTheBudgetAnUpdateComesBackLessShrunk) {
  const size_t n = 1 << 16;
  const std::vector<float> b = Update(n, 4, 1.0f);
  const std::vector<float> update = Update(n, 5, 0.025f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = b[i] + update[i];
  const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, x);
  const std::vector<std::byte> base = testing::ToElements(ElementType::kF32, b);
  Scratch scratch;
  EncodeOptions plain_options, options;
  options.unbiased_levels = true;
  options.unbias_allowance = 1.0;
  Result<EncodedChunk> plain = EncodeChunk(ElementType::kF32, values, base, Budget{1e-2}, &scratch, plain_options);
  Result<EncodedChunk> unbiased = EncodeChunk(ElementType::kF32, values, base, Budget{1e-2}, &scratch, options);
  ASSERT_TRUE(plain.ok() && unbiased.ok());
  const Moments p = Measure(x, b, plain->reconstruction), u = Measure(x, b, unbiased->reconstruction);
  EXPECT_LT(p.dr / p.rr, 0.99) << "the plain levels shrink the update";
  EXPECT_GT(u.dr / u.rr, p.dr / p.rr + 0.002);
  const bool at_budget = std::sqrt(u.error / u.norm) >= 1e-2 * (1 - 1e-3);
  EXPECT_TRUE(std::fabs(u.dr / u.rr - 1.0) < 2e-3 || at_budget) << u.dr / u.rr;
  EXPECT_LE(std::sqrt(u.error / u.norm), 1e-2);
}

// Where unbiasing would cost more than the allowance (most of a loose
// delta frame pruned), the gain stops at the allowance.
TEST(LossyLevelGain, TheGainStopsAtTheAllowance) {
  GainSums s;
  s.rr = 1.0, s.dr = 0.5, s.dd = 0.5;  // error at g = 1: 0.5; unbiased at g = 2: 1.0
  EXPECT_DOUBLE_EQ(UnbiasingGain(s, 2.0), 2.0);
  const double g = UnbiasingGain(s, 0.625);  // g^2 / 2 - g + 1 = 0.625: g = 1.5
  EXPECT_NEAR(g, 1.5, 1e-12);
  EXPECT_EQ(UnbiasingGain(s, 0.4), 1.0) << "not even g = 1 keeps it";
  s.dr = 0;
  EXPECT_EQ(UnbiasingGain(s, 2.0), 1.0) << "nothing quantized";
  s.dr = -1;
  EXPECT_EQ(UnbiasingGain(s, 2.0), 1.0);
}

TEST(LossyLevelGain, ExactElementsAreLeftOutOfTheSums) {
  const std::vector<float> residual = {1.0f, 2.0f, 1e30f};
  const std::vector<std::byte> recon = testing::ToElements(ElementType::kF32, {0.5f, 1.5f, 1e30f});
  QuantizeTable t;
  t.exact_from = FloatBits(1e20f);
  const GainSums s = GainSums::Of(residual, recon, {}, t.exact_from);
  EXPECT_DOUBLE_EQ(s.rr, 5.0);
  EXPECT_DOUBLE_EQ(s.dr, 3.5);
  EXPECT_DOUBLE_EQ(s.dd, 2.5);
}

// The vector sums equal the scalar reference bit for bit: exact elements
// (NaN, Inf, outliers) add +0 in both, and a partial last block.
TEST(LossyLevelGain, VectorSumsEqualTheScalarOnes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{1003}, size_t{1} << 14}) {
    std::vector<float> r(n), x(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      b[i] = normal(rng);
      r[i] = i % 97 == 3 ? std::numeric_limits<float>::quiet_NaN() : i % 89 == 5 ? 1e30f : normal(rng);
      x[i] = i % 7 == 0 ? b[i] : b[i] + 0.9f * r[i];  // some pruned
    }
    if (n > 11) r[11] = -std::numeric_limits<float>::infinity();
    const std::vector<std::byte> recon = testing::ToElements(ElementType::kF32, x);
    const std::vector<std::byte> base = testing::ToElements(ElementType::kF32, b);
    for (const bool with_base : {false, true}) {
      const ByteSpan bs = with_base ? ByteSpan(base) : ByteSpan();
      const GainSums scalar = GainSums::Of(r, recon, bs, FloatBits(1e20f), SimdLevel::kScalar);
      const GainSums vector = GainSums::Of(r, recon, bs, FloatBits(1e20f));
      EXPECT_EQ(std::bit_cast<uint64_t>(scalar.rr), std::bit_cast<uint64_t>(vector.rr)) << n;
      EXPECT_EQ(std::bit_cast<uint64_t>(scalar.dr), std::bit_cast<uint64_t>(vector.dr)) << n;
      EXPECT_EQ(std::bit_cast<uint64_t>(scalar.dd), std::bit_cast<uint64_t>(vector.dd)) << n;
      EXPECT_TRUE(std::isfinite(scalar.rr)) << "exact elements are left out";
    }
  }
}

}  // namespace
}  // namespace ckptfs::lossy
