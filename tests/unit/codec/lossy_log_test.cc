// Log mode (LOSSY.md section 9): every element's relative error is within
// max_rel over distributions with zeros, denormals, huge values, negatives
// and non-finite values; zeros stay zeros and the rest is exact; a 50-version
// closed-loop chain does not drift and its delta frames are small.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/stream.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

// Checks the per-element contract of log mode; returns the largest relative
// error seen on positive finite elements.
double CheckElements(ElementType type, const std::vector<std::byte>& orig, const std::vector<std::byte>& recon,
                     double max_rel) {
  const size_t w = ElementSize(type), n = orig.size() / w;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float x = testing::ElementAt(type, orig, i), y = testing::ElementAt(type, recon, i);
    if (x > 0 && std::isfinite(x)) {
      const double rel = std::fabs(static_cast<double>(y) - x) / x;
      // Within a factor 1 + max_rel either way (which implies rel <= max_rel).
      EXPECT_LE(y, (1 + max_rel) * x) << "element " << i << " x=" << x << " y=" << y;
      EXPECT_LE(x, (1 + max_rel) * y) << "element " << i << " x=" << x << " y=" << y;
      EXPECT_LE(rel, max_rel) << "element " << i << " x=" << x << " y=" << y;
      EXPECT_GT(y, 0.0f) << "element " << i << ": a positive element must stay positive (never pruned)";
      worst = std::max(worst, rel);
    } else {
      // Zeros, negatives, -0, NaN and Inf: bit for bit.
      EXPECT_EQ(std::memcmp(orig.data() + w * i, recon.data() + w * i, w), 0) << "element " << i << " x=" << x;
    }
  }
  return worst;
}

std::vector<float> Huge(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(0.5f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::numeric_limits<float>::max() * uni(rng);  // rounding up may overflow
  return v;
}

// exp_avg_sq-like: squares of gradients over many octaves, with exact zeros
// (untouched rows), a few denormals, a negative, NaN and Inf.
std::vector<float> SecondMoment(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<float> g(-12.0f, 3.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float u = uni(rng);
    v[i] = u < 0.1f ? 0.0f : u < 0.11f ? 1e-42f * (1 + 100 * uni(rng)) : g(rng);
  }
  if (n > 8) v[1] = -1e-3f, v[2] = NAN, v[3] = INFINITY, v[4] = -0.0f, v[5] = -INFINITY;
  return v;
}

TEST(LossyLog, EveryElementIsWithinItsRelativeBound) {
  Scratch scratch;
  const size_t n = 20000;
  std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"second_moment", SecondMoment(n, 1)},
      {"positive", testing::Generate(Dist::kPositive, n, 2)},
      {"zeros", testing::Generate(Dist::kZeros, n, 3)},
      {"denormal", testing::Generate(Dist::kDenormal, n, 4)},
      {"nonfinite", testing::Generate(Dist::kNonFinite, n, 5)},
      {"heavytail", testing::Generate(Dist::kHeavyTail, n, 6)},
      {"huge", Huge(n, 7)},
  };
  for (ElementType type : {ElementType::kF32, ElementType::kF16, ElementType::kBF16}) {
    for (double max_rel : {1e-3, 1e-2, 5e-2, 0.5}) {
      for (const auto& [name, v] : cases) {
        SCOPED_TRACE(name + " type " + std::to_string(static_cast<int>(type)) + " max_rel " + std::to_string(max_rel));
        std::vector<std::byte> values = testing::ToElements(type, v);
        Result<EncodedChunk> c = EncodeChunk(type, values, {}, Budget{0, 0, max_rel}, &scratch);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        const double worst = CheckElements(type, values, c->reconstruction, max_rel);
        std::vector<std::byte> out(values.size());
        Status st = testing::DecodeBothWays(type, c->bytes, {}, out, &scratch);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_TRUE(out == c->reconstruction);
        if (c->stats.mode == static_cast<uint8_t>(StreamMode::kLog)) {
          EXPECT_LE(c->stats.max_rel, max_rel);
          EXPECT_EQ(c->stats.max_rel, worst);
          EXPECT_LT(c->bytes.size(), values.size());
        }
      }
    }
  }
}

TEST(LossyLog, SecondMomentsCompressAndZerosStayZero) {
  Scratch scratch;
  const size_t n = 1 << 16;
  std::vector<float> v = SecondMoment(n, 11);
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, v);
  Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, {}, Budget{0, 0, 1e-2}, &scratch);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kLog));
  // About 35 octaves at 37 levels each: ~11 bits per element before zstd.
  EXPECT_LT(c->bytes.size(), values.size() / 2);
  EXPECT_GT(c->stats.bits, 4);
  Result<StreamHeader> h = StreamHeader::DecodeFrom(c->bytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->version, kStreamVersionLog);
  EXPECT_EQ(h->num_levels, 37u);  // ratio 1.019
  // Deterministic.
  Result<EncodedChunk> again = EncodeChunk(ElementType::kF32, values, {}, Budget{0, 0, 1e-2}, &scratch);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->bytes == c->bytes);
}

TEST(LossyLog, GridIndexIsNearestAndRoundTrips) {
  Result<LogGrid> g = LogGrid::FromRatio(LogGrid::RatioFor(1e-2));
  ASSERT_TRUE(g.ok());
  for (int64_t q : {int64_t{-5000}, int64_t{-38}, int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{36}, int64_t{37},
                    int64_t{4000}})
    EXPECT_EQ(g->Index(g->Value(q)), q) << q;
  EXPECT_EQ(g->Value(0), 1.0);
  EXPECT_EQ(g->Value(37), 2.0);
  // Nearest on random values over the whole float range, for several grids.
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<uint32_t> finite_bits(1, 0x7f7fffffu);
  for (double ratio : {LogGrid::RatioFor(1e-4), LogGrid::RatioFor(1e-2), LogGrid::RatioFor(0.3), 2.0}) {
    Result<LogGrid> grid = LogGrid::FromRatio(ratio);
    ASSERT_TRUE(grid.ok());
    for (int i = 0; i < 20000; ++i) {
      const double x = std::bit_cast<float>(finite_bits(rng));
      const int64_t q = grid->Index(x);
      const double here = std::fabs(grid->Value(q) - x);
      ASSERT_LE(grid->Value(q - 1), x) << "ratio " << ratio << " x " << x;
      ASSERT_GE(grid->Value(q + 1), x) << "ratio " << ratio << " x " << x;
      ASSERT_LE(here, std::fabs(grid->Value(q - 1) - x)) << "ratio " << ratio << " x " << x;
      ASSERT_LT(here, std::fabs(grid->Value(q + 1) - x)) << "ratio " << ratio << " x " << x;  // ties go down
    }
  }
  EXPECT_FALSE(LogGrid::FromRatio(1.0).ok());
  EXPECT_FALSE(LogGrid::FromRatio(2.5).ok());
  EXPECT_FALSE(LogGrid::FromRatio(1.0 + 1e-9).ok());  // over 2^16 levels per octave
}

TEST(LossyLog, FloatValueIsTheFloatOfValueEverywhere) {
  // The decoder's fast path must give the same bits as rounding the
  // binary64 grid point: over the whole float range (normal, subnormal,
  // overflow) and far outside it.
  for (double ratio : {LogGrid::RatioFor(1e-4), LogGrid::RatioFor(1e-2), LogGrid::RatioFor(0.3), 2.0}) {
    Result<LogGrid> grid = LogGrid::FromRatio(ratio);
    ASSERT_TRUE(grid.ok());
    const int64_t k = grid->per_octave();
    auto same = [&](int64_t q) {
      return std::bit_cast<uint32_t>(grid->FloatValue(q)) == std::bit_cast<uint32_t>(static_cast<float>(grid->Value(q)));
    };
    for (int64_t q = -160 * k; q <= 140 * k; q += std::max<int64_t>(1, k / 97)) ASSERT_TRUE(same(q)) << ratio << " " << q;
    for (int64_t e : {-127, -126, -125, 125, 126, 127})
      for (int64_t j = -2; j <= k + 2; ++j) ASSERT_TRUE(same(e * k + j)) << ratio << " " << e << " " << j;
    for (int64_t q : {int64_t{1} << 29, (int64_t{1} << 30) + 5, -(int64_t{1} << 30) - 5, int64_t{1} << 40,
                      -(int64_t{1} << 40), INT64_MAX / 4, INT64_MIN / 4})
      ASSERT_TRUE(same(q)) << ratio << " " << q;
  }
}

// Adam's second moment between checkpoints: v <- b2 v + (1 - b2) g^2, a few
// steps per version, encoded against the previous reconstruction.
TEST(LossyLog, FiftyVersionChainDoesNotDriftAndDeltasAreSmall) {
  const size_t n = 1 << 14;
  const double max_rel = 1e-2;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<float> scale(-6.0f, 2.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> gscale(n), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) gscale[i] = i % 10 == 0 ? 0.0f : scale(rng);  // a tenth never gets a gradient
  auto steps = [&](int k) {
    for (int s = 0; s < k; ++s)
      for (size_t i = 0; i < n; ++i) {
        const float g = gscale[i] * noise(rng);
        v[i] = 0.999f * v[i] + 0.001f * g * g;
      }
  };
  steps(100);
  Scratch scratch;
  std::vector<std::byte> base;
  size_t key_bytes = 0, delta_bytes = 0;
  for (int t = 0; t < 50; ++t) {
    if (t > 0) steps(5);
    std::vector<std::byte> values = testing::ToElements(ElementType::kF32, v);
    Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, base, Budget{0, 0, max_rel}, &scratch);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kLog)) << "version " << t;
    CheckElements(ElementType::kF32, values, c->reconstruction, max_rel);  // against the truth: no drift
    std::vector<std::byte> out(values.size());
    Status st = testing::DecodeBothWays(ElementType::kF32, c->bytes, base, out, &scratch);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(out == c->reconstruction) << "version " << t;
    (t == 0 ? key_bytes : delta_bytes) += c->bytes.size();
    base = c->reconstruction;
  }
  const double mean_delta = static_cast<double>(delta_bytes) / 49;
  EXPECT_LT(mean_delta, 0.5 * static_cast<double>(key_bytes)) << "key " << key_bytes << " delta " << mean_delta;
}

// Hysteresis (LOSSY.md section 9, "Hysteresis"): an element whose base
// level is still within the bound keeps it (symbol 0), even past the
// midpoint to the next level; one that left the bound moves. Levels of
// ratio 2 (max_rel 0.4): the base sits on powers of two, each element then
// moves by a factor in [0.72, 1.65] (its base within 0.39 of it; past the
// midpoints to the neighbouring levels, 0.75 and 1.5, for a fifth) or, one
// element in 16, by 1.8 (0.44 away).
TEST(LossyLog, ElementsKeepTheirLevelWhileItIsWithinTheBound) {
  const size_t n = 1 << 14;
  const double max_rel = 0.4;
  std::mt19937_64 rng(21);
  std::uniform_int_distribution<int> octave(-30, -5);
  // Within a factor 1.4 either way (the bound), past the geometric midpoint
  // to a neighbouring level for many.
  std::uniform_real_distribution<float> drift(0.716f, 1.39f);
  std::vector<float> v0(n), v1(n);
  for (size_t i = 0; i < n; ++i) {
    v0[i] = std::ldexp(1.0f, octave(rng));
    v1[i] = v0[i] * (i % 16 == 0 ? 1.8f : drift(rng));
  }
  Scratch scratch;
  const Budget budget{0, 0, max_rel};
  const std::vector<std::byte> key_values = testing::ToElements(ElementType::kF32, v0);
  Result<EncodedChunk> key = EncodeChunk(ElementType::kF32, key_values, {}, budget, &scratch);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  ASSERT_TRUE(key->reconstruction == key_values) << "powers of two are on the grid";
  const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, v1);
  Result<EncodedChunk> delta = EncodeChunk(ElementType::kF32, values, key->reconstruction, budget, &scratch);
  ASSERT_TRUE(delta.ok()) << delta.status().ToString();
  ASSERT_EQ(delta->stats.mode, static_cast<uint8_t>(StreamMode::kLog));
  CheckElements(ElementType::kF32, values, delta->reconstruction, max_rel);
  Result<LogGrid> grid = LogGrid::FromRatio(LogGrid::RatioFor(max_rel), LogRounding::kLog);
  ASSERT_TRUE(grid.ok());
  size_t kept = 0, past_midpoint = 0;
  for (size_t i = 0; i < n; ++i) {
    const float y = testing::ElementAt(ElementType::kF32, delta->reconstruction, i);
    if (i % 16 == 0) {
      EXPECT_NE(y, v0[i]) << "element " << i << " left the bound of its base level";
      continue;
    }
    kept += y == v0[i];
    past_midpoint += grid->Index(v1[i]) != grid->Index(v0[i]);
  }
  EXPECT_EQ(kept, n - n / 16) << "every element within the bound of its base level keeps it";
  EXPECT_GT(past_midpoint, n / 16) << "the test must move elements past the midpoint";
  std::vector<std::byte> out(values.size());
  Status st = testing::DecodeBothWays(ElementType::kF32, delta->bytes, key->reconstruction, out, &scratch);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(out == delta->reconstruction);
  // The error sums are those of the levels kept: the largest relative error
  // is the one of an element that drifted furthest from its level.
  const double nearest_worst = std::sqrt(grid->ratio()) - 1;  // at a geometric midpoint, to the upper level
  EXPECT_GT(delta->stats.max_rel, nearest_worst) << "kept levels beyond the nearest one's worst";
}

// However loose the bound, hysteresis keeps no level further than a factor
// 1.5 from the value: at max_rel = 1 an element that grew 1.6-fold or
// 2.5-fold or shrank to 0.6 moves, one that grew 1.45-fold or shrank to 0.7
// (both past the geometric midpoint to a neighbouring level) keeps its
// level. (Most elements do not move, so the shift stays 0.) f32 and f16.
TEST(LossyLog, HysteresisKeepsNoLevelFurtherThanHalfTheValue) {
  const size_t n = 8 << 11;
  const double max_rel = 1.0;
  const float factors[] = {1.0f, 1.45f, 1.0f, 2.5f, 1.0f, 0.6f, 0.7f, 1.6f};
  for (ElementType type : {ElementType::kF32, ElementType::kF16}) {
    std::vector<float> v0(n), v1(n);
    for (size_t i = 0; i < n; ++i) {
      v0[i] = std::ldexp(1.0f, -static_cast<int>(i % 8) - 2);
      v1[i] = v0[i] * factors[(i / 8) % 8];
    }
    Scratch scratch;
    const Budget budget{0, 0, max_rel};
    const std::vector<std::byte> key_values = testing::ToElements(type, v0);
    Result<EncodedChunk> key = EncodeChunk(type, key_values, {}, budget, &scratch);
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    ASSERT_TRUE(key->reconstruction == key_values) << "powers of two are on the grid";
    const std::vector<std::byte> values = testing::ToElements(type, v1);
    Result<EncodedChunk> delta = EncodeChunk(type, values, key->reconstruction, budget, &scratch);
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    CheckElements(type, values, delta->reconstruction, 0.5);
    for (size_t i = 0; i < n; ++i) {
      const float f = factors[(i / 8) % 8];
      const bool kept = testing::ElementAt(type, delta->reconstruction, i) == v0[i];
      EXPECT_EQ(kept, f == 1.0f || f == 1.45f || f == 0.7f) << "factor " << f << " element " << i;
    }
    std::vector<std::byte> out(values.size());
    Status st = testing::DecodeBothWays(type, delta->bytes, key->reconstruction, out, &scratch);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(out == delta->reconstruction);
  }
}

// A delta frame carries the base's zeros (kFlagZeroCarry): a zero over a
// zero costs symbol 0, so an unchanged zero mask costs almost nothing;
// zeros that appear or disappear still decode exactly.
TEST(LossyLog, ZerosOverZerosAreCarried) {
  const size_t n = 1 << 15;
  std::mt19937_64 rng(9);
  std::bernoulli_distribution dead(0.3);
  std::vector<float> v = SecondMoment(n, 4);
  for (float& x : v)
    if (dead(rng)) x = 0.0f;
  Scratch scratch;
  const Budget budget{0, 0, 0.2};
  const std::vector<std::byte> v0 = testing::ToElements(ElementType::kF32, v);
  Result<EncodedChunk> key = EncodeChunk(ElementType::kF32, v0, {}, budget, &scratch);
  ASSERT_TRUE(key.ok());
  // The same values again: every element is predicted, zeros included.
  Result<EncodedChunk> same = EncodeChunk(ElementType::kF32, v0, key->reconstruction, budget, &scratch);
  ASSERT_TRUE(same.ok());
  Result<StreamHeader> h = StreamHeader::DecodeFrom(same->bytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->flags, kFlagDelta | kFlagZeroCarry | kFlagCompactHeader);
  EXPECT_LT(same->bytes.size(), 300u) << "an unchanged chunk with a 30 % zero mask";
  // Every element the key frame put on the grid is reproduced; one it
  // stored exactly (a width escape) may move to its grid point, within the
  // bound.
  CheckElements(ElementType::kF32, v0, same->reconstruction, 0.2);
  size_t moved_elements = 0;
  for (size_t i = 0; i < n; ++i)
    moved_elements += std::memcmp(same->reconstruction.data() + 4 * i, key->reconstruction.data() + 4 * i, 4) != 0;
  EXPECT_LE(moved_elements, key->stats.exact);
  // Zeros that appear and disappear.
  std::vector<float> v2 = v;
  for (size_t i = 0; i < n; i += 7) v2[i] = v2[i] == 0.0f ? 1e-6f : 0.0f;
  const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, v2);
  Result<EncodedChunk> moved = EncodeChunk(ElementType::kF32, values, key->reconstruction, budget, &scratch);
  ASSERT_TRUE(moved.ok());
  CheckElements(ElementType::kF32, values, moved->reconstruction, 0.2);
  std::vector<std::byte> out(values.size());
  Status st = testing::DecodeBothWays(ElementType::kF32, moved->bytes, key->reconstruction, out, &scratch);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(out == moved->reconstruction);
}

TEST(LossyLog, CorruptLogStreamsAreRejected) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, SecondMoment(4096, 3));
  Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, {}, Budget{0, 0, 1e-2}, &scratch);
  ASSERT_TRUE(c.ok());
  std::vector<std::byte> out(values.size());
  auto decode = [&](std::vector<std::byte> s) {
    testing::Reseal(&s);
    return DecodeChunk(ElementType::kF32, s, {}, out, &scratch);
  };
  std::vector<std::byte> s = c->bytes;
  s[0] = std::byte{1};  // mode 2 needs version 2
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[0] = std::byte{4};  // context rANS symbols: mode 1 only
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[0] = std::byte{5};  // trellis: mode 3 only
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[0] = std::byte{6};
  EXPECT_EQ(decode(s).code(), StatusCode::kUnsupported);
  s = c->bytes;
  s[0] = std::byte{static_cast<uint8_t>(static_cast<uint8_t>(s[0]) == 2 ? 3 : 2)};  // zstd read as rANS, or back
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[8] = std::byte{static_cast<uint8_t>(static_cast<uint8_t>(s[8]) + 1)};  // levels per octave
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  const size_t header = StreamHeader::DecodeFrom(c->bytes)->size;
  s = c->bytes;
  StoreLE64(s.data() + header, std::bit_cast<uint64_t>(0.5));  // ratio < 1
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[header + 12] = std::byte{1};  // a shift in a key frame
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[4] = std::byte{kFlagZeroCarry | kFlagCompactHeader};  // zero carry in a key frame
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  s = c->bytes;
  s[4] = std::byte{0x08 | kFlagCompactHeader};  // a reserved flag
  EXPECT_EQ(decode(s).code(), StatusCode::kCorruption);
  // Zero carry in a quantized (not log) delta frame.
  std::vector<std::byte> plain = testing::ToElements(ElementType::kF32, std::vector<float>(4096, 0.5f));
  Result<EncodedChunk> q0 = EncodeChunk(ElementType::kF32, plain, {}, Budget{1e-2, 0, 0}, &scratch);
  ASSERT_TRUE(q0.ok());
  plain = testing::ToElements(ElementType::kF32, std::vector<float>(4096, 0.75f));
  Result<EncodedChunk> q1 = EncodeChunk(ElementType::kF32, plain, q0->reconstruction, Budget{1e-2, 0, 0}, &scratch);
  ASSERT_TRUE(q1.ok());
  s = q1->bytes;
  ASSERT_EQ(s[1], std::byte{1});  // quantized mode
  ASSERT_EQ(s[4], std::byte{kFlagDelta | kFlagCompactHeader});
  s[4] = std::byte{kFlagDelta | kFlagZeroCarry | kFlagCompactHeader};
  testing::Reseal(&s);
  EXPECT_EQ(DecodeChunk(ElementType::kF32, s, q0->reconstruction, out, &scratch).code(), StatusCode::kCorruption);
  EXPECT_TRUE(decode(c->bytes).ok());
}

TEST(LossyLog, LocateIsIndexAndFloatValue) {
  // The encoder's path from a float's bits must equal the general Index
  // (binary64, via the bucket table) and FloatValue: every exponent field
  // (subnormals included), random mantissas, and the floats next to each
  // level and each midpoint between levels.
  std::mt19937_64 rng(11);
  for (double ratio : {LogGrid::RatioFor(1e-4), LogGrid::RatioFor(1e-2), LogGrid::RatioFor(0.3), 2.0}) {
    Result<LogGrid> grid = LogGrid::FromRatio(ratio);
    ASSERT_TRUE(grid.ok());
    auto check = [&](float x) {
      if (!(x > 0) || !std::isfinite(x)) return;
      const LogGrid::Point p = grid->Locate(x);
      ASSERT_EQ(p.q, grid->Index(x)) << ratio << " " << x;
      ASSERT_EQ(std::bit_cast<uint32_t>(p.value), std::bit_cast<uint32_t>(grid->FloatValue(p.q))) << ratio << " " << x;
      ASSERT_EQ(grid->FloatIndex(x), p.q);
    };
    for (uint32_t field = 0; field < 255; ++field)
      for (int r = 0; r < 64; ++r) check(std::bit_cast<float>((field << 23) | static_cast<uint32_t>(rng() & 0x7FFFFF)));
    for (int64_t j = 0; j <= static_cast<int64_t>(grid->per_octave()); ++j) {
      const double level = grid->Value(j), next = grid->Value(j + 1);
      for (double anchor : {level, (level + next) * 0.5}) {
        const float f = static_cast<float>(anchor);
        for (float x : {f, std::nextafter(f, 0.0f), std::nextafter(f, 4.0f)})
          for (int e : {-140, -100, 0, 60, 126}) check(std::ldexp(x, e));
      }
    }
  }
}

TEST(LossyLog, EscapedElementsLeaveTheErrorSums) {
  // A delta frame whose base predicts every element but a rare few, which
  // it misses by about 100 octaves: their symbols are far wider than the
  // rest, so they are escaped (stored exactly), and the error sums cover
  // only the elements that were quantized.
  const size_t n = 1 << 14;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> uni(1.0f, 2.0f);
  std::vector<float> v(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = uni(rng);
    b[i] = i % 1000 == 7 ? 1e-30f * v[i] : v[i];
  }
  // (Not bf16: its rounding of a grid point alone can exceed 1e-2, and such
  // elements are exact too.)
  for (ElementType type : {ElementType::kF32, ElementType::kF16}) {
    Scratch scratch;
    const std::vector<std::byte> values = testing::ToElements(type, v), base = testing::ToElements(type, b);
    Result<EncodedChunk> chunk = EncodeChunk(type, values, base, Budget{0, 0, 1e-2}, &scratch);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    ASSERT_EQ(chunk->stats.mode, static_cast<uint8_t>(StreamMode::kLog));
    EXPECT_LT(chunk->stats.bits, 8) << "the far elements must be escaped, not widen every symbol";
    // Exact elements add 0 to the sums: summing every element in order must
    // give the encoder's sums bit for bit.
    double err2 = 0, max_abs = 0;
    uint64_t far = 0;
    for (size_t i = 0; i < n; ++i) {
      const float x = testing::ElementAt(type, values, i), y = testing::ElementAt(type, chunk->reconstruction, i);
      const double e = static_cast<double>(y) - x;
      if (i % 1000 == 7) {
        EXPECT_EQ(e, 0.0) << "escaped element " << i << " is exact";
        ++far;
      }
      err2 += e * e;
      max_abs = std::max(max_abs, std::fabs(e));
    }
    EXPECT_GT(err2, 0.0);
    EXPECT_EQ(chunk->stats.exact, far);
    EXPECT_EQ(chunk->stats.quantized, n - far);
    EXPECT_EQ(chunk->stats.err2_sum, err2);
    EXPECT_EQ(chunk->stats.max_abs, max_abs);
    std::vector<std::byte> out(values.size());
    ASSERT_TRUE(testing::DecodeBothWays(type, chunk->bytes, base, out, &scratch).ok());
    EXPECT_EQ(out, chunk->reconstruction);
  }
}

TEST(LossyLog, MaxRelIsUsedAlone) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, SecondMoment(64, 3));
  EXPECT_FALSE(EncodeChunk(ElementType::kF32, values, {}, Budget{1e-2, 0, 1e-2}, &scratch).ok());
  EXPECT_FALSE(EncodeChunk(ElementType::kF32, values, {}, Budget{0, 0, -1}, &scratch).ok());
}

// Rare large moves (1 % of the elements jump 12 grid steps, the rest move
// by at most one) are cheaper as wide entropy-coded symbols than escaped to
// the exact list at an element and a position each: the width is chosen
// for rANS-coded symbols (LOSSY.md section 9, "Width").
TEST(LossyLog, RareWideSymbolsAreCodedNotEscaped) {
  const size_t n = 1 << 16;
  std::vector<float> v0 = SecondMoment(n, 5), v1 = v0;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> drift(0.9f, 1.1f);
  for (size_t i = 0; i < n; ++i) v1[i] = v0[i] * (i % 100 == 0 ? 100.0f : drift(rng));
  Scratch scratch;
  const Budget budget{0, 0, 0.2};
  Result<EncodedChunk> key = EncodeChunk(ElementType::kF32, testing::ToElements(ElementType::kF32, v0), {}, budget,
                                         &scratch);
  ASSERT_TRUE(key.ok());
  const std::vector<std::byte> values = testing::ToElements(ElementType::kF32, v1);
  Result<EncodedChunk> delta = EncodeChunk(ElementType::kF32, values, key->reconstruction, budget, &scratch);
  ASSERT_TRUE(delta.ok());
  CheckElements(ElementType::kF32, values, delta->reconstruction, 0.2);
  // (The log mode counts zeros and the specials as exact too: 10 % here.)
  size_t zeros_and_specials = 0;
  for (float x : v1) zeros_and_specials += !(x > 0.0f) || !std::isfinite(x) ? 1 : 0;
  EXPECT_LT(delta->stats.exact, zeros_and_specials + n / 1000) << "the jumps are symbols, not escapes";
  EXPECT_LT(8.0 * static_cast<double>(delta->bytes.size()) / n, 0.9);  // 1.01 with escapes
}

}  // namespace
}  // namespace ckptfs::lossy
