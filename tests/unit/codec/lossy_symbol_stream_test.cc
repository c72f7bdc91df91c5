// The main stream of quantized and log chunks (symbol_stream.h): rANS
// (stream version 3) where it is smaller than zstd, zstd otherwise, and
// the uniform candidates of the configuration search that rANS makes
// worthwhile (LOSSY.md sections 4 and 5.7).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/symbol_stream.h"
#include "codec/tensor/rans.h"
#include "lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;
using testing::Generate;
using testing::ToElements;

Scratch::Buffers& ReadyBuffers(Scratch& scratch) {
  Scratch::Buffers& s = scratch.buffers();
  if (!s.cctx) s.cctx.reset(ZSTD_createCCtx());
  if (!s.dctx) s.dctx.reset(ZSTD_createDCtx());
  return s;
}

// Symbols packed as LOSSY.md section 5.3 says: symbol i at bits [i*b, i*b+b).
std::vector<std::byte> Pack(const std::vector<uint8_t>& symbols, unsigned bits, size_t packed_size) {
  std::vector<std::byte> packed(packed_size);
  for (size_t i = 0; i < symbols.size(); ++i)
    for (unsigned k = 0; k < bits; ++k)
      if ((symbols[i] >> k) & 1) {
        const size_t bit = i * bits + k;
        packed[bit / 8] |= std::byte(1u << (bit % 8));
      }
  return packed;
}

// Geometric-like symbols: most are small, as in a delta frame.
std::vector<uint8_t> SkewedSymbols(size_t n, unsigned bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::geometric_distribution<int> geo(0.45);
  std::vector<uint8_t> s(n);
  for (uint8_t& v : s) v = static_cast<uint8_t>(std::min<int>(geo(rng), (1 << bits) - 1));
  return s;
}

TEST(LossySymbolStream, RoundTripsAtEveryWidthAndLength) {
  Scratch scratch;
  Scratch::Buffers& s = ReadyBuffers(scratch);
  for (unsigned bits = 1; bits <= 8; ++bits) {
    for (size_t n : {1u, 7u, 8u, 9u, 1000u, 65537u}) {
      SCOPED_TRACE(::testing::Message() << "bits=" << bits << " n=" << n);
      const std::vector<uint8_t> symbols = SkewedSymbols(n, bits, bits * 131 + static_cast<uint32_t>(n));
      // The quantized mode pads to whole groups of 8 symbols: a longer buffer.
      const size_t packed_size = (n + 7) / 8 * bits;
      const std::vector<std::byte> packed = Pack(symbols, bits, packed_size);
      Result<SymbolStream> coded = CompressSymbols(s, 3, packed, bits, n);
      ASSERT_TRUE(coded.ok()) << coded.status().ToString();
      const std::vector<std::byte> main(coded->bytes.begin(), coded->bytes.end());
      std::vector<std::byte> out(packed_size, std::byte{0xAA});
      ASSERT_TRUE(DecompressSymbols(s, coded->rans, main, bits, n, out, "test").ok());
      EXPECT_EQ(out, packed);
      if (n > 1000 && (bits == 3 || bits >= 5) && bits < 8) {
        EXPECT_TRUE(coded->rans) << "symbols across byte boundaries: rANS is smaller";
      }
    }
  }
}

TEST(LossySymbolStream, ZstdStaysWhereItsMatchesWin) {
  // A short pattern repeated: zstd's matches remove it, order-0 coding
  // cannot (its entropy is log2(7) bits per symbol).
  Scratch scratch;
  Scratch::Buffers& s = ReadyBuffers(scratch);
  std::vector<uint8_t> symbols(1 << 16);
  for (size_t i = 0; i < symbols.size(); ++i) symbols[i] = static_cast<uint8_t>(i % 7);
  const std::vector<std::byte> packed = Pack(symbols, 3, symbols.size() * 3 / 8);
  Result<SymbolStream> coded = CompressSymbols(s, 3, packed, 3, symbols.size());
  ASSERT_TRUE(coded.ok());
  EXPECT_FALSE(coded->rans);
  EXPECT_LT(coded->bytes.size(), 1000u);
}

TEST(LossySymbolStream, ARansPlaneWithWideSymbolsIsCorrupt) {
  Scratch scratch;
  Scratch::Buffers& s = ReadyBuffers(scratch);
  std::vector<uint8_t> symbols = SkewedSymbols(4096, 8, 5);
  symbols[100] = 200;  // wider than 2 bits
  std::vector<std::byte> plane(8192);
  Result<size_t> size = RansEncode(symbols.data(), symbols.size(), CountBytes(symbols.data(), symbols.size()),
                                   plane.data(), plane.size());
  ASSERT_TRUE(size.ok());
  plane.resize(*size);
  std::vector<std::byte> out(4096 * 2 / 8);
  EXPECT_EQ(DecompressSymbols(s, true, plane, 2, 4096, out, "test").code(), StatusCode::kCorruption);
  // Fewer symbols than the plane holds, or a truncated plane: Corruption too.
  EXPECT_EQ(DecompressSymbols(s, true, plane, 8, 4095, MutableByteSpan(out.data(), 1), "test").code(),
            StatusCode::kInternal);
  std::vector<std::byte> wide(4096);
  EXPECT_EQ(DecompressSymbols(s, true, plane, 8, 4000, wide, "test").code(), StatusCode::kCorruption);
  EXPECT_EQ(DecompressSymbols(s, true, ByteSpan(plane).first(plane.size() - 2), 8, 4096, wide, "test").code(),
            StatusCode::kCorruption);
}

// A delta frame of Gaussian updates whose budget is half the update: the
// rate-distortion bound is 1 bit per element (D = sigma^2 / 4). Entropy-
// coded uniform levels take 1.35 bits (Laplace updates: 1.11); the
// search's Lloyd-Max codebooks alone took 1.54 (1.24).
TEST(LossySymbolStream, DeltaFramesCodeNearTheRateDistortionBound) {
  constexpr size_t kN = 1 << 18;
  Scratch scratch;
  for (Dist dist : {Dist::kNormal, Dist::kLaplace}) {
    SCOPED_TRACE(testing::DistName(dist));
    const std::vector<float> base = Generate(Dist::kNormal, kN, 11);
    const std::vector<float> step = Generate(dist, kN, 12);
    std::vector<float> next(kN);
    double update2 = 0, norm2 = 0;
    for (size_t i = 0; i < kN; ++i) {
      next[i] = base[i] + step[i];
      update2 += static_cast<double>(next[i] - base[i]) * (next[i] - base[i]);
      norm2 += static_cast<double>(next[i]) * next[i];
    }
    const double budget = 0.5 * std::sqrt(update2 / norm2);
    const std::vector<std::byte> base_bytes = ToElements(ElementType::kF32, base);
    const std::vector<std::byte> next_bytes = ToElements(ElementType::kF32, next);
    Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, next_bytes, base_bytes, Budget{budget, 0}, &scratch);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(static_cast<uint8_t>(c->bytes[0]), kStreamVersionRans);
    EXPECT_LE(c->stats.rel_l2, budget);
    const double bits_per_element = 8.0 * static_cast<double>(c->bytes.size()) / kN;
    EXPECT_LT(bits_per_element, dist == Dist::kNormal ? 1.42 : 1.17);
    std::vector<std::byte> out(next_bytes.size());
    ASSERT_TRUE(DecodeChunk(ElementType::kF32, c->bytes, base_bytes, out, &scratch).ok());
    EXPECT_EQ(out, c->reconstruction);
  }
}

// A key frame at 1e-2 needs about 7 bits per element, where the levels are
// closer together than the search's histogram bins are wide: the estimate
// must integrate each bin over the cells it spans to use the budget (it
// met 60 % of it when a bin counted whole at its centre's level) and stay
// near the Gaussian bound of log2(1 / 1e-2) = 6.64 bits.
TEST(LossySymbolStream, KeyFramesUseTheirBudget) {
  constexpr size_t kN = 1 << 18;
  Scratch scratch;
  for (ElementType type : {ElementType::kF32, ElementType::kBF16}) {
    SCOPED_TRACE(static_cast<int>(type));
    const std::vector<std::byte> values = testing::ToElements(type, testing::Generate(Dist::kNormal, kN, 21));
    Result<EncodedChunk> c = EncodeChunk(type, values, {}, Budget{1e-2, 0}, &scratch);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->stats.mode, static_cast<uint8_t>(StreamMode::kQuantized)) << "a miss must not end lossless";
    EXPECT_LE(c->stats.rel_l2, 1e-2);
    EXPECT_GT(c->stats.rel_l2, 0.9e-2);
    EXPECT_LT(8.0 * static_cast<double>(c->bytes.size()) / kN, 7.2);
  }
}

}  // namespace
}  // namespace ckptfs::lossy
