// Closed-loop delta frames: a chain of slowly drifting versions encoded
// against the previous *reconstruction* stays within budget at every version
// (no drift) and the delta frames are much smaller than key frames.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "codec/tensor/lossy/lossy.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

struct ChainResult {
  size_t key_bytes = 0;
  double mean_delta_bytes = 0;
  double worst_rel = 0;
};

ChainResult RunChain(ElementType type, double rel_l2, size_t n, int versions) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> step(0.0f, 2e-4f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> w = testing::Generate(Dist::kNormal, n, 1);
  std::vector<bool> frozen(n);
  for (size_t i = 0; i < n; ++i) frozen[i] = uni(rng) < 0.3f;  // e.g. a frozen sub-layer

  Scratch scratch;
  ChainResult result;
  std::vector<std::byte> base;  // the previous reconstruction
  double delta_total = 0;
  for (int t = 0; t < versions; ++t) {
    if (t > 0)
      for (size_t i = 0; i < n; ++i)
        if (!frozen[i]) w[i] += step(rng);
    std::vector<std::byte> values = testing::ToElements(type, w);
    Result<EncodedChunk> c = EncodeChunk(type, values, base, Budget{rel_l2, 0.0}, &scratch);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return result;
    testing::NaiveError e = testing::Measure(type, values, c->reconstruction);
    double rel = std::sqrt(e.err_sq / e.norm_sq);
    EXPECT_LE(rel, rel_l2) << "version " << t;
    result.worst_rel = std::max(result.worst_rel, rel);
    // The chain decodes from its own reconstructions.
    std::vector<std::byte> out(values.size());
    Status st = testing::DecodeBothWays(type, c->bytes, base, out, &scratch);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(out == c->reconstruction) << "version " << t;
    if (t == 0) {
      result.key_bytes = c->bytes.size();
    } else {
      delta_total += static_cast<double>(c->bytes.size());
    }
    base = c->reconstruction;
  }
  result.mean_delta_bytes = delta_total / (versions - 1);
  return result;
}

TEST(LossyDeltaTest, ChainOfFiftyVersionsStaysWithinBudget) {
  for (ElementType type : {ElementType::kF32, ElementType::kBF16}) {
    for (double rel : {1e-1, 1e-2}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(type)) + " rel=" + std::to_string(rel));
      ChainResult r = RunChain(type, rel, 65536, 50);
      EXPECT_LE(r.worst_rel, rel);
      EXPECT_LT(r.mean_delta_bytes * 4, static_cast<double>(r.key_bytes))
          << "key " << r.key_bytes << " B, mean delta " << r.mean_delta_bytes << " B";
    }
  }
}

TEST(LossyDeltaTest, IdenticalVersionCostsAlmostNothing) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kLaplace, 100000, 4));
  Result<EncodedChunk> key = EncodeChunk(ElementType::kF32, values, {}, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(key.ok());
  // The same tensor again, against the key frame's reconstruction.
  Result<EncodedChunk> delta = EncodeChunk(ElementType::kF32, values, key->reconstruction, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(delta.ok());
  EXPECT_LT(delta->bytes.size(), 200u);
  EXPECT_EQ(delta->reconstruction, key->reconstruction);
}

TEST(LossyDeltaTest, UnrelatedBaseFallsBackToKeyFrame) {
  // Like Adam's exp_avg between checkpoints: the base says little about the
  // new values, so the residual is larger than the values themselves.
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kLaplace, 50000, 1));
  std::vector<std::byte> unrelated =
      testing::ToElements(ElementType::kF32, testing::Generate(Dist::kLaplace, 50000, 2));
  Result<EncodedChunk> key = EncodeChunk(ElementType::kF32, values, {}, Budget{1e-2, 0}, &scratch);
  Result<EncodedChunk> delta = EncodeChunk(ElementType::kF32, values, unrelated, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(key.ok() && delta.ok());
  EXPECT_EQ(static_cast<uint8_t>(delta->bytes[4]) & 1, 0) << "want a key frame";
  EXPECT_EQ(delta->bytes, key->bytes);
  std::vector<std::byte> out(values.size());
  ASSERT_TRUE(DecodeChunk(ElementType::kF32, delta->bytes, unrelated, out, &scratch).ok());
  EXPECT_EQ(out, delta->reconstruction);
}

TEST(LossyDeltaTest, AlternativeBaseIsUsedWhenItsResidualIsCheaper) {
  // A close base and a poor one for the same values (a step prediction and
  // the previous version, or the other way round): the chunk is coded
  // against the close one whichever the caller passes as `base`, says so,
  // and decodes only against that one.
  Scratch scratch;
  std::vector<float> w = testing::Generate(Dist::kNormal, 60000, 5);
  std::vector<float> close = w, poor = w;
  std::mt19937 rng(3);
  std::normal_distribution<float> small(0.0f, 1e-3f), large(0.0f, 3e-2f);
  for (size_t i = 0; i < w.size(); ++i) {
    close[i] += small(rng);
    poor[i] += large(rng);
  }
  const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, w);
  const std::vector<std::byte> close_b = testing::ToElements(ElementType::kF32, close);
  const std::vector<std::byte> poor_b = testing::ToElements(ElementType::kF32, poor);
  Result<EncodedChunk> direct = EncodeChunk(ElementType::kF32, values, close_b, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(direct.ok());
  for (bool close_first : {true, false}) {
    EncodeOptions options;
    options.alternative_base = close_first ? ByteSpan(poor_b) : ByteSpan(close_b);
    Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, close_first ? close_b : poor_b, Budget{1e-2, 0},
                                         &scratch, options);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->stats.used_alternative_base, !close_first);
    EXPECT_EQ(c->bytes, direct->bytes) << "coded against the close base either way";
    std::vector<std::byte> out(values.size());
    ASSERT_TRUE(DecodeChunk(ElementType::kF32, c->bytes, close_b, out, &scratch).ok());
    EXPECT_EQ(out, c->reconstruction);
    ASSERT_TRUE(DecodeChunk(ElementType::kF32, c->bytes, poor_b, out, &scratch).ok());
    EXPECT_NE(out, c->reconstruction);
  }
}

TEST(LossyDeltaTest, LosslessDeltaIsBitExact) {
  Scratch scratch;
  std::vector<float> w = testing::Generate(Dist::kNormal, 5000, 8);
  std::vector<std::byte> a = testing::ToElements(ElementType::kF16, w);
  for (size_t i = 0; i < w.size(); i += 3) w[i] += 1e-3f;
  std::vector<std::byte> b = testing::ToElements(ElementType::kF16, w);
  Result<EncodedChunk> c = EncodeChunk(ElementType::kF16, b, a, Budget{}, &scratch);
  ASSERT_TRUE(c.ok());
  std::vector<std::byte> out(b.size());
  ASSERT_TRUE(DecodeChunk(ElementType::kF16, c->bytes, a, out, &scratch).ok());
  EXPECT_EQ(out, b);
}

TEST(LossyDeltaTest, NonFiniteBaseOrValueStaysExact) {
  Scratch scratch;
  std::vector<float> base_f = testing::Generate(Dist::kNormal, 3000, 6);
  std::vector<float> w = base_f;
  base_f[10] = INFINITY;  // a base element that overflowed
  w[20] = NAN;
  w[30] = 3e38f;
  base_f[30] = -3e38f;  // the residual overflows to +Inf
  std::vector<std::byte> base = testing::ToElements(ElementType::kF32, base_f);
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, w);
  Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, base, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(c.ok());
  for (size_t i : {10u, 20u, 30u}) {
    EXPECT_EQ(std::memcmp(c->reconstruction.data() + 4 * i, values.data() + 4 * i, 4), 0) << i;
  }
}

}  // namespace
}  // namespace ckptfs::lossy
