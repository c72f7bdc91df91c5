#include "codec/tensor/rans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codec/tensor/rans_model.h"
#include "codec/tensor/rans_stream.h"

namespace ckptfs {
namespace {

std::vector<std::byte> Encode(const std::vector<uint8_t>& in, size_t capacity = 0) {
  std::vector<std::byte> out(capacity != 0 ? capacity : in.size() + 1024);
  Result<size_t> n = RansEncode(in.data(), in.size(), CountBytes(in.data(), in.size()), out.data(), out.size());
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  out.resize(n.ok() ? *n : 0);
  // Every encoder the CPU can run writes the same bytes.
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<std::byte> other(capacity != 0 ? capacity : in.size() + 1024);
    Result<size_t> m =
        RansEncodeWith(level, in.data(), in.size(), CountBytes(in.data(), in.size()), other.data(), other.size());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    other.resize(m.ok() ? *m : 0);
    EXPECT_EQ(out, other) << "level " << static_cast<int>(level);
  }
  // The AVX-512 path without IFMA, which the CPU may otherwise never take.
  if (CpuHasSimd(SimdLevel::kAvx512)) {
    std::vector<std::byte> other(capacity != 0 ? capacity : in.size() + 1024);
    Result<size_t> m =
        RansEncodeAvx512WithoutIfma(in.data(), in.size(), CountBytes(in.data(), in.size()), other.data(), other.size());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    other.resize(m.ok() ? *m : 0);
    EXPECT_EQ(out, other) << "AVX-512 without IFMA";
  }
  return out;
}

// Decodes with the dispatching decoder and with every instruction set the
// CPU has; they must agree with the scalar one on the status and the bytes.
Status Decode(ByteSpan stored, size_t n, std::vector<uint8_t>* out) {
  out->assign(n, 0xcc);
  std::vector<uint8_t> scalar(n, 0xcc);
  Status fast = RansDecode(stored, out->data(), n, "test");
  Status slow = RansDecodeWith(SimdLevel::kScalar, stored, scalar.data(), n, "test");
  EXPECT_EQ(fast.code(), slow.code()) << fast.ToString() << " vs " << slow.ToString();
  if (fast.ok() && slow.ok()) {
    EXPECT_EQ(*out, scalar);
  }
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<uint8_t> other(n, 0xcc);
    Status st = RansDecodeWith(level, stored, other.data(), n, "test");
    EXPECT_EQ(st.code(), slow.code()) << "level " << static_cast<int>(level) << ": " << st.ToString();
    if (st.ok() && slow.ok()) {
      EXPECT_EQ(other, scalar) << "level " << static_cast<int>(level);
    }
  }
  // Piece by piece, in pieces that start on group boundaries and pieces
  // that do not, at every level.
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<uint8_t> other(n, 0xcc);
    RansStreamDecoder stream;
    Status st = stream.Open(stored, n, "test", level);
    constexpr size_t kPieces[] = {64, 5, 27, 96, 1, 31, 33, 512};
    for (size_t at = 0, p = 0; st.ok() && at < n; ++p) {
      const size_t piece = std::min(kPieces[p % std::size(kPieces)], n - at);
      st = stream.Next(other.data() + at, piece);
      at += piece;
    }
    if (st.ok()) st = stream.Finish();
    EXPECT_EQ(st.code(), slow.code()) << "stream, level " << static_cast<int>(level) << ": " << st.ToString();
    if (st.ok() && slow.ok()) {
      EXPECT_EQ(other, scalar) << "stream, level " << static_cast<int>(level);
    }
  }
  return fast;
}

std::vector<uint8_t> Skewed(size_t n, double spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, spread);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(static_cast<int>(std::lround(120 + normal(rng))) & 0xff);
  return v;
}

double EntropyBytes(const std::vector<uint8_t>& v) {
  ByteHistogram h = CountBytes(v.data(), v.size());
  double bits = 0;
  for (uint32_t c : h)
    if (c != 0) bits -= c * std::log2(static_cast<double>(c) / v.size());
  return bits / 8;
}

TEST(Rans, RoundTripsEveryLengthAroundTheGroupSize) {
  for (size_t n = 1; n <= 3 * rans::kStates + 1; ++n) {
    std::vector<uint8_t> in = Skewed(n, 3.0, static_cast<uint32_t>(n));
    std::vector<uint8_t> out;
    ASSERT_TRUE(Decode(Encode(in), n, &out).ok()) << n;
    EXPECT_EQ(out, in) << n;
  }
}

TEST(Rans, RoundTripsDistributionsAndStaysNearTheEntropy) {
  std::mt19937 rng(7);
  std::vector<uint8_t> uniform(100000);
  for (auto& b : uniform) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> two(100000);
  for (auto& b : two) b = (rng() % 100) < 3 ? 200 : 17;
  std::vector<uint8_t> every_value(256 * 7 + 5);
  for (size_t i = 0; i < every_value.size(); ++i) every_value[i] = static_cast<uint8_t>(i * 37);
  for (const auto& in : {Skewed(1 << 20, 2.0, 1), Skewed(300001, 20.0, 2), uniform, two, every_value}) {
    std::vector<std::byte> stored = Encode(in);
    std::vector<uint8_t> out;
    ASSERT_TRUE(Decode(stored, in.size(), &out).ok());
    EXPECT_EQ(out, in);
    // Table (at most 32 + 512 bytes), states, and 0.3% over the entropy:
    // 12-bit frequencies lose little.
    EXPECT_LE(static_cast<double>(stored.size()), EntropyBytes(in) * 1.003 + 32 + 512 + rans::kStateBytes + 8)
        << in.size();
  }
}

TEST(Rans, AllSameSymbolAndOneElement) {
  for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{100000}}) {
    std::vector<uint8_t> in(n, 0x7f);
    std::vector<std::byte> stored = Encode(in);
    // One symbol of frequency 4096 codes to no words at all.
    EXPECT_EQ(stored.size(), 32 + 2 + rans::kStateBytes);
    std::vector<uint8_t> out;
    ASSERT_TRUE(Decode(stored, n, &out).ok());
    EXPECT_EQ(out, in);
  }
}

TEST(Rans, SameInputSameBytes) {
  std::vector<uint8_t> in = Skewed(50000, 5.0, 3);
  EXPECT_EQ(Encode(in), Encode(in));
}

TEST(Rans, EncodeRefusesWhenCapacityIsShort) {
  std::vector<uint8_t> in = Skewed(10000, 40.0, 4);
  const size_t full = Encode(in).size();
  std::vector<std::byte> out(full - 1);
  Result<size_t> n = RansEncode(in.data(), in.size(), CountBytes(in.data(), in.size()), out.data(), out.size());
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kUnsupported);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    n = RansEncodeWith(level, in.data(), in.size(), CountBytes(in.data(), in.size()), out.data(), out.size());
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), StatusCode::kUnsupported);
  }
}

TEST(Rans, TruncatedOrExtendedStreamsAreCorruption) {
  std::vector<uint8_t> in = Skewed(5000, 6.0, 5);
  std::vector<std::byte> stored = Encode(in);
  std::vector<uint8_t> out;
  for (size_t cut = 0; cut < stored.size(); ++cut)
    EXPECT_EQ(Decode(ByteSpan(stored).first(cut), in.size(), &out).code(), StatusCode::kCorruption) << cut;
  std::vector<std::byte> longer = stored;
  longer.push_back(std::byte{0});
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer, in.size(), &out).code(), StatusCode::kCorruption);
  // The wrong element count does not end in the start state.
  EXPECT_EQ(Decode(stored, in.size() - 1, &out).code(), StatusCode::kCorruption);
  EXPECT_EQ(Decode(stored, in.size() + 1, &out).code(), StatusCode::kCorruption);
}

TEST(Rans, HostileTablesAndStatesAreCorruption) {
  std::vector<uint8_t> in = Skewed(2000, 4.0, 6);
  const std::vector<std::byte> stored = Encode(in);
  std::vector<uint8_t> out;
  // Frequencies that do not sum to 4096.
  std::vector<std::byte> bad = stored;
  bad[32] = std::byte(static_cast<uint8_t>(bad[32]) ^ 1);
  EXPECT_EQ(Decode(bad, in.size(), &out).code(), StatusCode::kCorruption);
  // A two-byte frequency above 4096.
  bad = stored;
  bad[32] = std::byte{0x9f};
  EXPECT_EQ(Decode(bad, in.size(), &out).code(), StatusCode::kCorruption);
  // No symbol present at all.
  bad.assign(32 + rans::kStateBytes, std::byte{0});
  EXPECT_EQ(Decode(bad, in.size(), &out).code(), StatusCode::kCorruption);
  // A state below the lower bound.
  size_t used = 0;
  rans::Freqs freqs;
  ASSERT_TRUE(rans::ReadFreqs(stored, &freqs, &used, "test").ok());
  bad = stored;
  StoreLE32(bad.data() + used + 4 * 5, 12);
  EXPECT_EQ(Decode(bad, in.size(), &out).code(), StatusCode::kCorruption);
}

TEST(Rans, RandomDamageNeverCrashesAndBothDecodersAgree) {
  std::vector<uint8_t> in = Skewed(4000, 8.0, 8);
  const std::vector<std::byte> stored = Encode(in);
  std::mt19937 rng(9);
  std::vector<uint8_t> out;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::byte> bad = stored;
    for (int k = 0; k < 1 + trial % 4; ++k) bad[rng() % bad.size()] ^= std::byte(1 + rng() % 255);
    Status s = Decode(bad, in.size(), &out);
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCorruption) << s.ToString();
  }
  // Random bytes as a stream.
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::byte> junk(rng() % 600);
    for (auto& b : junk) b = std::byte(rng());
    Status s = Decode(junk, rng() % 300, &out);
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCorruption) << s.ToString();
  }
}

TEST(Rans, NormalizedFrequenciesSumExactlyAndKeepEverySymbol) {
  // Many rare symbols force the rounding to take from the common ones.
  std::array<uint32_t, 256> hist{};
  for (size_t s = 0; s < 256; ++s) hist[s] = 1;
  hist[3] = 1000000;
  hist[4] = 700000;
  size_t n = 0;
  for (uint32_t c : hist) n += c;
  rans::Freqs f = rans::NormalizeFreqs(hist, n);
  uint32_t sum = 0;
  for (size_t s = 0; s < 256; ++s) {
    EXPECT_GE(f[s], 1u) << s;
    sum += f[s];
  }
  EXPECT_EQ(sum, rans::kProbScale);
  EXPECT_GT(f[3], f[4]);
}

// The top bytes of normal floats of both signs: two clusters of values
// around 0x3c and 0xbc, with rare ones at the cluster edges.
std::vector<uint8_t> SignedExponents(size_t n, uint32_t seed) {
  std::vector<uint8_t> v = Skewed(n, 3.0, seed);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>((b - 120 + 0x3c) | (rng() & 1 ? 0x80 : 0));
  return v;
}

// SignedExponents with one outlier beyond each cluster's edge, which a
// sample misses.
std::vector<uint8_t> SignedExponentsWithOutliers(size_t n, uint32_t seed) {
  std::vector<uint8_t> in = SignedExponents(n, seed);
  const auto [lo, hi] = std::minmax_element(in.begin(), in.end(), [](uint8_t a, uint8_t b) { return (a & 0x7f) < (b & 0x7f); });
  in[12345] = static_cast<uint8_t>((*lo & 0x7f) - 3);
  in[54321] = static_cast<uint8_t>((*hi | 0x80) + 3);
  return in;
}

// `model` gives every byte of `in` a frequency, codes it within 0.2% of the
// exact counts, and decodes back to `in`.
void ExpectModelCodesNearTheExactCounts(const std::vector<uint8_t>& in, const ByteHistogram& model) {
  const ByteHistogram exact = CountBytes(in.data(), in.size());
  for (size_t s = 0; s < 256; ++s)
    if (exact[s] != 0) {
      EXPECT_NE(model[s], 0u) << s;
    }
  std::vector<std::byte> a(in.size() + 1024), b(in.size() + 1024);
  Result<size_t> with_exact = RansEncode(in.data(), in.size(), exact, a.data(), a.size());
  Result<size_t> with_model = RansEncode(in.data(), in.size(), model, b.data(), b.size());
  ASSERT_TRUE(with_exact.ok() && with_model.ok());
  EXPECT_LT(*with_model, *with_exact * 1.002) << "model codes within 0.2% of the exact counts";
  std::vector<uint8_t> back;
  ASSERT_TRUE(Decode(ByteSpan(b.data(), *with_model), in.size(), &back).ok());
  EXPECT_EQ(back, in);
}

TEST(Rans, ModelCoversEveryByteAndCodesNearTheExactCounts) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<uint8_t> in = SignedExponentsWithOutliers(300001, seed);
    const ByteHistogram model = ModelBytes(in.data(), in.size());
    EXPECT_NE(model, CountBytes(in.data(), in.size())) << "sampled, not counted";
    ExpectModelCodesNearTheExactCounts(in, model);
  }
}

TEST(Rans, ModelFromACallersSampleCoversEveryByte) {
  std::vector<uint8_t> in = SignedExponentsWithOutliers(300001, 7);
  ByteHistogram sample{};
  for (size_t i = 0; i < in.size(); i += 31) ++sample[in[i]];
  const rans::ByteRanges ranges = rans::FindByteRanges(in.data(), in.size());
  const ByteHistogram model = ModelBytesFromSample(in.data(), in.size(), sample, ranges);
  EXPECT_NE(model, ModelBytes(in.data(), in.size())) << "the caller's sample, not its own";
  ExpectModelCodesNearTheExactCounts(in, model);
  // Too few samples: the plane's own.
  ByteHistogram few{};
  for (size_t i = 0; i < 1000; ++i) ++few[in[i * 300]];
  EXPECT_EQ(ModelBytesFromSample(in.data(), in.size(), few, ranges), ModelBytes(in.data(), in.size()));
}

TEST(Rans, ModelIsExactForSmallOrGappyPlanes) {
  std::vector<uint8_t> small = SignedExponents(1000, 4);
  EXPECT_EQ(ModelBytes(small.data(), small.size()), CountBytes(small.data(), small.size()));
  // Values spread over the whole range with gaps: filling the ranges would
  // add too many absent values.
  std::vector<uint8_t> gappy(100000);
  for (size_t i = 0; i < gappy.size(); ++i) gappy[i] = static_cast<uint8_t>(i % 2 == 0 ? 0 : 17 * (i % 15));
  EXPECT_EQ(ModelBytes(gappy.data(), gappy.size()), CountBytes(gappy.data(), gappy.size()));
}

TEST(Rans, ByteRangesOfEitherClusterAndEveryTailLength) {
  for (size_t n : {1u, 31u, 32u, 33u, 100u}) {
    std::vector<uint8_t> low(n, 0x20), high(n, 0xa0);
    low[n / 2] = 0x05;
    low[n - 1] = 0x70;
    high[0] = 0x90;
    high[n - 1] = 0xf1;
    rans::ByteRanges r = rans::FindByteRanges(low.data(), n);
    EXPECT_EQ(r.low_min, n == 1 ? 0x70u : 0x05u) << n;
    EXPECT_EQ(r.low_max, 0x70u);
    EXPECT_LT(r.high_max, 0x80u);
    r = rans::FindByteRanges(high.data(), n);
    EXPECT_GE(r.low_min, 0x80u);
    EXPECT_EQ(r.high_min, n == 1 ? 0xf1u : 0x90u) << n;
    EXPECT_EQ(r.high_max, 0xf1u);
    std::vector<uint8_t> both = low;
    both.insert(both.end(), high.begin(), high.end());
    r = rans::FindByteRanges(both.data(), both.size());
    EXPECT_EQ(r.low_max, 0x70u);
    EXPECT_EQ(r.high_min, n == 1 ? 0xf1u : 0x90u);
  }
}

}  // namespace
}  // namespace ckptfs
