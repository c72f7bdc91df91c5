// The context rANS plane (codec/tensor/rans_context.h, FORMAT.md "Context
// rANS plane"): round trips, the rate it saves where contexts inform, the
// tables it merges where they do not, and hostile streams.
#include "codec/tensor/rans_context.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/tensor/rans.h"

namespace ckptfs {
namespace {

struct Plane {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> ids;
};

// Byte i is 0 or 1, 1 with probability (ids[i] + 0.5) / count: one table
// codes it at H(0.5-ish) bits, one per context at the mean of H(p_c).
Plane CoinsInContexts(size_t n, uint32_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> pick(0, count - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Plane p;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t c = pick(rng);
    p.ids.push_back(static_cast<uint8_t>(c));
    p.bytes.push_back(u(rng) < (c + 0.5) / count ? 1 : 0);
  }
  return p;
}

std::vector<std::byte> Encode(const Plane& p, uint32_t count) {
  std::vector<std::byte> out(p.bytes.size() + 4096);
  Result<size_t> n = RansEncodeInContexts(p.bytes.data(), p.bytes.size(), {p.ids.data(), count}, out.data(), out.size());
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  out.resize(n.ok() ? *n : 0);
  return out;
}

Status Decode(ByteSpan stored, const Plane& p, uint32_t count, std::vector<uint8_t>* out) {
  out->assign(p.bytes.size(), 0xcc);
  std::vector<uint32_t> tables;
  return RansDecodeInContexts(stored, {p.ids.data(), count}, out->data(), out->size(), "test", &tables);
}

size_t PlainSize(const std::vector<uint8_t>& bytes) {
  std::vector<std::byte> out(bytes.size() + 4096);
  Result<size_t> n = RansEncode(bytes.data(), bytes.size(), CountBytes(bytes.data(), bytes.size()), out.data(), out.size());
  EXPECT_TRUE(n.ok());
  return n.ok() ? *n : 0;
}

TEST(RansContext, RoundTripsAndCodesNearTheConditionalEntropy) {
  for (uint32_t count : {16u, 5u}) {
    const Plane p = CoinsInContexts(200000, count, count);
    const std::vector<std::byte> stored = Encode(p, count);
    std::vector<uint8_t> back;
    ASSERT_TRUE(Decode(stored, p, count, &back).ok());
    EXPECT_EQ(back, p.bytes);
    double conditional = 0;  // bits per byte, the mean of the contexts' entropies
    for (uint32_t c = 0; c < count; ++c) {
      const double q = (c + 0.5) / count;
      conditional -= (q * std::log2(q) + (1 - q) * std::log2(1 - q)) / count;
    }
    const double bits = 8.0 * stored.size() / p.bytes.size();
    EXPECT_LT(bits, conditional * 1.01 + 0.01) << count;
    EXPECT_LT(stored.size(), 0.85 * PlainSize(p.bytes)) << "one table codes the mixed odds, about 1 bit";
    EXPECT_EQ(static_cast<uint8_t>(stored[0]), count == 16 ? 16 : 5) << "every table pays for itself";
  }
}

TEST(RansContext, MergesTablesThatTheContextsDoNotInform) {
  Plane p = CoinsInContexts(50000, 16, 7);
  std::mt19937 rng(8);
  for (uint8_t& b : p.bytes) b = static_cast<uint8_t>(rng() % 3);  // independent of the context
  const std::vector<std::byte> stored = Encode(p, 16);
  EXPECT_EQ(static_cast<uint8_t>(stored[0]), 1);
  EXPECT_LT(stored.size(), PlainSize(p.bytes) + 16);
  std::vector<uint8_t> back;
  ASSERT_TRUE(Decode(stored, p, 16, &back).ok());
  EXPECT_EQ(back, p.bytes);
}

TEST(RansContext, OneSymbolOneElementAndEmptyContexts) {
  for (size_t n : {size_t{1}, size_t{31}, size_t{33}, size_t{4096}}) {
    Plane p = CoinsInContexts(n, 16, static_cast<uint32_t>(n));
    for (uint8_t& b : p.bytes) b = 200;
    const std::vector<std::byte> stored = Encode(p, 16);
    std::vector<uint8_t> back;
    ASSERT_TRUE(Decode(stored, p, 16, &back).ok()) << n;
    EXPECT_EQ(back, p.bytes) << n;
  }
  // Contexts no byte is in still get a table (all on one symbol).
  Plane p = CoinsInContexts(3000, 16, 9);
  for (uint8_t& id : p.ids) id = id % 2 == 0 ? 0 : 15;
  std::vector<uint8_t> back;
  const std::vector<std::byte> stored = Encode(p, 16);
  ASSERT_TRUE(Decode(stored, p, 16, &back).ok());
  EXPECT_EQ(back, p.bytes);
}

TEST(RansContext, RefusesWhatItCannotCode) {
  Plane p = CoinsInContexts(1000, 16, 3);
  std::vector<std::byte> out(4096);
  EXPECT_EQ(RansEncodeInContexts(p.bytes.data(), p.bytes.size(), {p.ids.data(), 16}, out.data(), 40).status().code(),
            StatusCode::kUnsupported);
  p.ids[500] = 16;
  EXPECT_EQ(RansEncodeInContexts(p.bytes.data(), p.bytes.size(), {p.ids.data(), 16}, out.data(), out.size())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RansEncodeInContexts(p.bytes.data(), p.bytes.size(), {p.ids.data(), 0}, out.data(), out.size())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RansEncodeInContexts(p.bytes.data(), p.bytes.size(), {p.ids.data(), kMaxRansContexts + 1}, out.data(),
                                 out.size())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(RansContext, HostileStreamsAreCorruptionNeverACrash) {
  const Plane p = CoinsInContexts(5000, 16, 11);
  const std::vector<std::byte> stored = Encode(p, 16);
  std::vector<uint8_t> back;
  for (size_t cut = 0; cut < stored.size(); cut += std::max<size_t>(1, cut / 8))
    EXPECT_FALSE(Decode(ByteSpan(stored).first(cut), p, 16, &back).ok()) << cut;
  std::vector<std::byte> longer = stored;
  longer.push_back(std::byte{0});
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer, p, 16, &back).code(), StatusCode::kCorruption);

  std::vector<std::byte> bad = stored;
  bad[0] = std::byte{0};
  EXPECT_EQ(Decode(bad, p, 16, &back).code(), StatusCode::kCorruption) << "no tables";
  bad[0] = std::byte{17};
  EXPECT_EQ(Decode(bad, p, 16, &back).code(), StatusCode::kCorruption) << "more tables than contexts";
  bad = stored;
  bad[1 + 32] = std::byte(static_cast<uint8_t>(bad[1 + 32]) ^ 1);  // the first frequency
  EXPECT_EQ(Decode(bad, p, 16, &back).code(), StatusCode::kCorruption) << "a table's sum";
  bad = stored;
  bad[1 + 32] = std::byte{0x91};
  EXPECT_EQ(Decode(bad, p, 16, &back).code(), StatusCode::kCorruption) << "a frequency past 4096";

  // The wrong contexts decode something else or fail; never the plane.
  Plane shifted = p;
  for (uint8_t& id : shifted.ids) id = static_cast<uint8_t>((id + 8) % 16);
  const Status st = Decode(stored, shifted, 16, &back);
  EXPECT_TRUE(!st.ok() || back != p.bytes);
  Plane out_of_range = p;
  out_of_range.ids[7] = 16;
  EXPECT_EQ(Decode(stored, out_of_range, 16, &back).code(), StatusCode::kInvalidArgument);

  std::mt19937 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::byte> damaged = stored;
    damaged[rng() % damaged.size()] ^= std::byte(1u << (rng() % 8));
    (void)Decode(damaged, p, 16, &back);  // any status; no crash, no read past the end (ASan)
  }
}

}  // namespace
}  // namespace ckptfs
