// Trellis-coded quantization (LOSSY.md section 11, stream mode 3): the state
// machine; round trips of key and delta frames in all three element types
// within the budget; smaller than the quantized mode where it is chosen;
// exact elements; when it is not tried; refusals of damaged streams.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/trellis.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

std::vector<float> Gaussian(size_t n, uint32_t seed, float sigma = 0.02f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

EncodeOptions WithTrellis(bool on) {
  EncodeOptions o;
  o.trellis = on;
  return o;
}

TEST(LossyTrellis, StateMachine) {
  // Every state has two successors, one per parity of k, and every state
  // two predecessors; even states take even multiples, odd states odd ones.
  std::vector<int> into(kTrellisStates, 0);
  for (uint32_t s = 0; s < kTrellisStates; ++s) {
    EXPECT_NE(TrellisNext(s, 0), TrellisNext(s, 1)) << "state " << s;
    EXPECT_EQ(TrellisNext(s, 2), TrellisNext(s, 0));
    EXPECT_EQ(TrellisNext(s, -1), TrellisNext(s, 1));
    ++into[TrellisNext(s, 0)], ++into[TrellisNext(s, 1)];
    for (int32_t k = -kTrellisMaxIndex; k <= kTrellisMaxIndex; ++k)
      EXPECT_EQ(std::abs(TrellisMultiple(s, k)) % 2, static_cast<int32_t>(s & 1));
  }
  for (int c : into) EXPECT_EQ(c, 2);
  std::set<int> symbols;
  for (int32_t k = -kTrellisMaxIndex; k <= kTrellisMaxIndex; ++k) {
    const uint8_t z = TrellisZigzag(k);
    EXPECT_LT(z, kTrellisExactSymbol);
    EXPECT_EQ(TrellisUnzigzag(z), k);
    symbols.insert(z);
  }
  EXPECT_EQ(symbols.size(), 255u);
}

TEST(LossyTrellis, KeyFramesAreSmallerWithinTheBudget) {
  Scratch scratch;
  const auto v = Gaussian(65536, 1);
  const auto bytes = testing::ToElements(ElementType::kF32, v);
  // (budget, the largest size relative to the quantized mode's): a trellis
  // gains about 1 dB (0.17 bits) at high rates and more of the gap to the
  // bound at low ones.
  for (auto [rel, most] : {std::pair{0.1, 0.97}, {0.3, 0.92}, {0.5, 0.85}, {0.7, 0.82}}) {
    const Budget budget{rel};
    auto plain = EncodeChunk(ElementType::kF32, bytes, {}, budget, &scratch, WithTrellis(false));
    auto trellis = EncodeChunk(ElementType::kF32, bytes, {}, budget, &scratch, WithTrellis(true));
    ASSERT_TRUE(plain.ok() && trellis.ok());
    EXPECT_EQ(trellis->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis)) << rel;
    EXPECT_LT(trellis->bytes.size(), most * plain->bytes.size()) << rel;
    std::printf("rel %.1f: %zu bytes, quantized mode %zu\n", rel, trellis->bytes.size(), plain->bytes.size());
    std::vector<std::byte> out(bytes.size());
    ASSERT_TRUE(testing::DecodeBothWays(ElementType::kF32, trellis->bytes, {}, out, &scratch).ok());
    EXPECT_EQ(out, trellis->reconstruction);
    const auto e = testing::Measure(ElementType::kF32, bytes, out);
    EXPECT_LE(std::sqrt(e.err_sq / e.norm_sq), rel) << rel;
    EXPECT_NEAR(trellis->stats.rel_l2, std::sqrt(e.err_sq / e.norm_sq), 1e-9);
    EXPECT_EQ(trellis->stats.max_abs, e.max_abs);
    EXPECT_GT(trellis->stats.rel_l2, 0.9 * rel) << "most of the budget is used";
    // Deterministic.
    auto again = EncodeChunk(ElementType::kF32, bytes, {}, budget, &scratch, WithTrellis(true));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->bytes, trellis->bytes);
  }
}

TEST(LossyTrellis, DeltaFramesInEveryElementType) {
  Scratch scratch;
  const size_t n = 40000;
  const auto base_v = Gaussian(n, 2, 0.05f);
  const auto step = Gaussian(n, 3, 0.002f);
  std::vector<float> next(n);
  for (size_t i = 0; i < n; ++i) next[i] = base_v[i] + step[i];
  for (ElementType type : {ElementType::kF32, ElementType::kF16, ElementType::kBF16}) {
    const auto base = testing::ToElements(type, base_v);
    const auto values = testing::ToElements(type, next);
    // An error of half the update: about 0.6 bits per element.
    const double update = 0.002 / 0.05;
    const Budget budget{0.5 * update};
    auto c = EncodeChunk(type, values, base, budget, &scratch, WithTrellis(true));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<std::byte> out(values.size());
    ASSERT_TRUE(testing::DecodeBothWays(type, c->bytes, base, out, &scratch).ok());
    EXPECT_EQ(out, c->reconstruction);
    const auto e = testing::Measure(type, values, out);
    EXPECT_LE(std::sqrt(e.err_sq / e.norm_sq), budget.rel_l2) << static_cast<int>(type);
    if (type == ElementType::kF32) {
      EXPECT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
      auto plain = EncodeChunk(type, values, base, budget, &scratch, WithTrellis(false));
      ASSERT_TRUE(plain.ok());
      EXPECT_LT(c->bytes.size(), 0.88 * plain->bytes.size());
    }
  }
}

TEST(LossyTrellis, NonFiniteAndFarElementsAreExact) {
  Scratch scratch;
  auto v = Gaussian(20000, 4);
  v[10] = NAN, v[11] = INFINITY, v[12] = -INFINITY, v[13] = 1e6f, v[19999] = -3e5f;
  const auto bytes = testing::ToElements(ElementType::kF32, v);
  // The outliers dominate the norm: give a budget relative to the rest.
  auto c = EncodeChunk(ElementType::kF32, bytes, {}, Budget{2e-8}, &scratch, WithTrellis(true));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
  std::vector<std::byte> out(bytes.size());
  ASSERT_TRUE(testing::DecodeBothWays(ElementType::kF32, c->bytes, {}, out, &scratch).ok());
  const auto e = testing::Measure(ElementType::kF32, bytes, out);
  EXPECT_TRUE(e.nonfinite_exact);
  EXPECT_LE(std::sqrt(e.err_sq / e.norm_sq), 2e-8);
  for (size_t i : {13u, 19999u})
    EXPECT_EQ(std::memcmp(out.data() + 4 * i, bytes.data() + 4 * i, 4), 0) << "element " << i;
  EXPECT_GE(c->stats.exact, 5u);
}

TEST(LossyTrellis, NotTriedWhereItDoesNotApply) {
  Scratch scratch;
  const auto bytes = testing::ToElements(ElementType::kF32, Gaussian(65536, 5));
  // A max_abs bound (the Viterbi search weighs squared errors only).
  auto abs = EncodeChunk(ElementType::kF32, bytes, {}, Budget{0.3, 0.01}, &scratch, WithTrellis(true));
  ASSERT_TRUE(abs.ok());
  EXPECT_NE(abs->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
  // Small chunks.
  const auto small = testing::ToElements(ElementType::kF32, Gaussian(2000, 6));
  auto s = EncodeChunk(ElementType::kF32, small, {}, Budget{0.3}, &scratch, WithTrellis(true));
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
  // Off.
  auto off = EncodeChunk(ElementType::kF32, bytes, {}, Budget{0.3}, &scratch, WithTrellis(false));
  ASSERT_TRUE(off.ok());
  EXPECT_NE(off->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
  // A version equal to its base stays "unchanged" (a few bytes).
  auto same = EncodeChunk(ElementType::kF32, bytes, bytes, Budget{0.3}, &scratch, WithTrellis(true));
  ASSERT_TRUE(same.ok());
  EXPECT_LT(same->bytes.size(), 200u);
}

class TrellisStream : public ::testing::Test {
 protected:
  void SetUp() override {
    values_ = testing::ToElements(ElementType::kF32, Gaussian(8192, 7));
    auto c = EncodeChunk(ElementType::kF32, values_, {}, Budget{0.4}, &scratch_, WithTrellis(true));
    ASSERT_TRUE(c.ok());
    ASSERT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kTrellis));
    stream_ = c->bytes;
  }
  Status Decode(const std::vector<std::byte>& s) {
    std::vector<std::byte> out(values_.size());
    return testing::DecodeBothWays(ElementType::kF32, s, {}, out, &scratch_);
  }
  Scratch scratch_;
  std::vector<std::byte> values_, stream_;
};

TEST_F(TrellisStream, TruncationAndFlipsAreRefused) {
  for (size_t cut = 0; cut < stream_.size(); cut += std::max<size_t>(1, stream_.size() / 97)) {
    std::vector<std::byte> s(stream_.begin(), stream_.begin() + cut);
    EXPECT_FALSE(Decode(s).ok()) << "cut at " << cut;
  }
  std::mt19937 rng(8);
  for (int i = 0; i < 200; ++i) {
    auto s = stream_;
    const size_t at = rng() % s.size();
    s[at] ^= std::byte(1u << (rng() % 8));
    EXPECT_FALSE(Decode(s).ok()) << "flip at " << at;
  }
}

TEST_F(TrellisStream, ResealedDamageIsCorruption) {
  ASSERT_TRUE(Decode(stream_).ok());
  auto edit = [&](size_t at, uint8_t value) {
    auto s = stream_;
    s[at] = std::byte(value);
    testing::Reseal(&s);
    return Decode(s);
  };
  EXPECT_EQ(edit(0, 4).code(), StatusCode::kCorruption) << "mode 3 in version 4";
  EXPECT_EQ(edit(1, 1).code(), StatusCode::kCorruption) << "version 5 in mode 1";
  EXPECT_EQ(edit(3, 7).code(), StatusCode::kCorruption) << "bits other than 8";
  EXPECT_EQ(edit(8, 4).code(), StatusCode::kCorruption) << "states other than 8";
  EXPECT_EQ(edit(0, 6).code(), StatusCode::kUnsupported) << "a newer version";
  // The step: zero, negative, NaN, infinite.
  const StreamHeader h = *StreamHeader::DecodeFrom(stream_);
  for (uint32_t bits : {0u, FloatBits(-1.0f), 0x7fc00000u, 0x7f800000u}) {
    auto s = stream_;
    StoreLE32(s.data() + h.size, bits);
    testing::Reseal(&s);
    EXPECT_EQ(Decode(s).code(), StatusCode::kCorruption) << std::hex << bits;
  }
  // Header fields rewritten: more elements, exact entries the list lacks.
  for (int field = 0; field < 2; ++field) {
    StreamHeader e = h;
    if (field == 0) e.element_count += 1;
    else e.exact_count += 1, e.exact_raw_size = 1, e.exact_size = 1;
    std::vector<std::byte> s;
    e.EncodeTo(&s);
    s.insert(s.end(), stream_.begin() + h.size, stream_.end());
    testing::Reseal(&s);
    EXPECT_EQ(Decode(s).code(), StatusCode::kCorruption) << "field " << field;
  }
}

}  // namespace
}  // namespace ckptfs::lossy
