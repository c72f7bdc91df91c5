// Property tests of the lossy chunk codec: error within budget and reported
// correctly, decode == the encoder's reconstruction, determinism, edge
// sizes and special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "codec/common/hash.h"
#include "codec/tensor/lossy/lossy.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;
using testing::Generate;
using testing::Measure;
using testing::ToElements;

// Encodes, checks every property, returns the encoded chunk.
EncodedChunk CheckRoundTrip(ElementType type, const std::vector<std::byte>& values, const std::vector<std::byte>& base,
                            const Budget& budget, Scratch* scratch) {
  Result<EncodedChunk> enc = EncodeChunk(type, values, base, budget, scratch);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  if (!enc.ok()) return {};
  const EncodedChunk& c = *enc;
  EXPECT_EQ(c.reconstruction.size(), values.size());

  // Achieved error within budget, and reported correctly.
  testing::NaiveError e = Measure(type, values, c.reconstruction);
  EXPECT_TRUE(e.nonfinite_exact);
  double rel = e.norm_sq > 0 ? std::sqrt(e.err_sq / e.norm_sq) : (e.err_sq > 0 ? INFINITY : 0.0);
  if (budget.rel_l2 > 0) {
    EXPECT_LE(rel, budget.rel_l2);
  }
  if (budget.max_abs > 0) {
    EXPECT_LE(e.max_abs, budget.max_abs);
  }
  if (budget.rel_l2 == 0 && budget.max_abs == 0) {
    EXPECT_EQ(c.reconstruction, values) << "lossless budget must reproduce the bytes";
  }
  EXPECT_NEAR(c.stats.rel_l2, rel, 1e-9 * (1 + rel));
  EXPECT_EQ(c.stats.max_abs, e.max_abs);
  const uint64_t n = values.size() / ElementSize(type);
  EXPECT_EQ(c.stats.pruned + c.stats.quantized + c.stats.exact, n);

  // decode(encode) == the reconstruction, bit for bit.
  std::vector<std::byte> out(values.size(), std::byte{0x5a});
  Status st = testing::DecodeBothWays(type, c.bytes, base, out, scratch);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(out == c.reconstruction) << "decoded bytes differ from the encoder's reconstruction";

  // Determinism: a fresh scratch gives the same bytes.
  Scratch fresh;
  Result<EncodedChunk> again = EncodeChunk(type, values, base, budget, &fresh);
  EXPECT_TRUE(again.ok());
  if (again.ok()) {
    EXPECT_EQ(Checksum64(again->bytes), Checksum64(c.bytes));
  }
  return std::move(enc).value();
}

class LossyPropertyTest : public ::testing::TestWithParam<std::tuple<ElementType, Dist, double>> {};

TEST_P(LossyPropertyTest, WithinBudgetAndRoundTrips) {
  auto [type, dist, rel] = GetParam();
  Scratch scratch;
  for (size_t n : {0u, 1u, 2u, 7u, 4095u, 4097u, 100000u}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<std::byte> values = ToElements(type, Generate(dist, n, static_cast<uint32_t>(n) * 7 + 1));
    CheckRoundTrip(type, values, {}, Budget{rel, 0.0}, &scratch);
  }
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<ElementType, Dist, double>>& info) {
  auto [type, dist, rel] = info.param;
  const char* t = type == ElementType::kF32 ? "f32" : type == ElementType::kF16 ? "f16" : "bf16";
  return std::string(t) + "_" + testing::DistName(dist) + "_e" +
         std::to_string(static_cast<int>(-std::log10(rel) + 0.5));
}

INSTANTIATE_TEST_SUITE_P(Distributions, LossyPropertyTest,
                         ::testing::Combine(::testing::Values(ElementType::kF32, ElementType::kF16, ElementType::kBF16),
                                            ::testing::Values(Dist::kNormal, Dist::kLaplace, Dist::kHeavyTail,
                                                              Dist::kConstant, Dist::kZeros, Dist::kDenormal,
                                                              Dist::kNonFinite, Dist::kPositive),
                                            ::testing::Values(1e-1, 1e-2, 1e-3, 1e-4)),
                         ParamName);

TEST(LossyCodecTest, MaxAbsBudget) {
  Scratch scratch;
  for (ElementType type : {ElementType::kF32, ElementType::kF16, ElementType::kBF16}) {
    for (double max_abs : {1e-2, 1e-3, 1e-4}) {
      SCOPED_TRACE(std::to_string(max_abs));
      std::vector<std::byte> values = ToElements(type, Generate(Dist::kLaplace, 50000, 3));
      CheckRoundTrip(type, values, {}, Budget{0.0, max_abs}, &scratch);
      CheckRoundTrip(type, values, {}, Budget{1e-2, max_abs}, &scratch);
    }
  }
}

TEST(LossyCodecTest, LosslessBudgetIsBitExact) {
  Scratch scratch;
  std::vector<std::byte> values = ToElements(ElementType::kF32, Generate(Dist::kNonFinite, 10000, 9));
  EncodedChunk c = CheckRoundTrip(ElementType::kF32, values, {}, Budget{}, &scratch);
  EXPECT_EQ(c.stats.bits, 0);
  EXPECT_EQ(c.stats.exact, 10000u);
}

TEST(LossyCodecTest, LargeChunkCompresses) {
  Scratch scratch;
  const size_t n = 4u << 20;  // 4M elements
  std::vector<std::byte> values = ToElements(ElementType::kF32, Generate(Dist::kNormal, n, 11));
  EncodedChunk c = CheckRoundTrip(ElementType::kF32, values, {}, Budget{1e-2, 0.0}, &scratch);
  EXPECT_GT(c.stats.bits, 0);
  // 1% relative L2 on a Gaussian needs about 6-7 bits per element, not 32.
  EXPECT_LT(c.bytes.size() * 8.0 / n, 8.0);
}

TEST(LossyCodecTest, TighterBudgetNeverSmallerStream) {
  Scratch scratch;
  std::vector<std::byte> values = ToElements(ElementType::kF32, Generate(Dist::kLaplace, 200000, 5));
  size_t previous = 0;
  for (double rel : {1e-1, 3e-2, 1e-2, 3e-3}) {
    Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, {}, Budget{rel, 0.0}, &scratch);
    ASSERT_TRUE(c.ok());
    EXPECT_GE(c->bytes.size() * 1.05, previous) << rel;  // 5% slack: zstd is not monotone
    previous = c->bytes.size();
  }
}

TEST(LossyCodecTest, RejectsBadArguments) {
  Scratch scratch;
  std::vector<std::byte> odd(6);
  EXPECT_EQ(EncodeChunk(ElementType::kF32, odd, {}, Budget{1e-2, 0}, &scratch).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::byte> values(16), base(12);
  EXPECT_EQ(EncodeChunk(ElementType::kF32, values, base, Budget{1e-2, 0}, &scratch).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeChunk(ElementType::kF32, values, {}, Budget{-1, 0}, &scratch).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeChunk(static_cast<ElementType>(9), values, {}, Budget{1e-2, 0}, &scratch).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::byte> wrong_out(3);
  EncodeOptions opt;
  opt.reconstruction_out = wrong_out;
  EXPECT_EQ(EncodeChunk(ElementType::kF32, values, {}, Budget{1e-2, 0}, &scratch, opt).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LossyCodecTest, DecodeChecksShapeAndBase) {
  Scratch scratch;
  std::vector<std::byte> values = ToElements(ElementType::kF32, Generate(Dist::kNormal, 1000, 2));
  Result<EncodedChunk> c = EncodeChunk(ElementType::kF32, values, {}, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(c.ok());
  std::vector<std::byte> out(values.size());
  std::vector<std::byte> small(values.size() - 4);
  EXPECT_EQ(DecodeChunk(ElementType::kF32, c->bytes, {}, small, &scratch).code(), StatusCode::kCorruption);
  std::vector<std::byte> half(values.size() / 2);
  EXPECT_EQ(DecodeChunk(ElementType::kF16, c->bytes, {}, half, &scratch).code(), StatusCode::kCorruption);
  // A key frame ignores a base; a delta frame requires one of the right size.
  ASSERT_TRUE(DecodeChunk(ElementType::kF32, c->bytes, values, out, &scratch).ok());
  EXPECT_EQ(out, c->reconstruction);
  std::vector<std::byte> near = values;
  near[0] ^= std::byte{1};
  Result<EncodedChunk> d = EncodeChunk(ElementType::kF32, values, near, Budget{1e-2, 0}, &scratch);
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(static_cast<uint8_t>(d->bytes[4]) & 1, 1) << "want a delta frame";
  EXPECT_EQ(DecodeChunk(ElementType::kF32, d->bytes, {}, out, &scratch).code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeChunk(ElementType::kF32, d->bytes, ByteSpan(near).first(near.size() - 4), out, &scratch).code(),
            StatusCode::kCorruption);
  std::vector<std::byte> future = c->bytes;
  future[0] = std::byte{6};
  testing::Reseal(&future);
  EXPECT_EQ(DecodeChunk(ElementType::kF32, future, {}, out, &scratch).code(), StatusCode::kUnsupported);
}

TEST(LossyCodecTest, ReconstructionOutReceivesTheSameBytes) {
  Scratch scratch;
  for (const Budget& budget : {Budget{1e-2, 0}, Budget{}}) {
    std::vector<std::byte> values = ToElements(ElementType::kBF16, Generate(Dist::kLaplace, 9000, 12));
    Result<EncodedChunk> plain = EncodeChunk(ElementType::kBF16, values, {}, budget, &scratch);
    std::vector<std::byte> mine(values.size());
    EncodeOptions opt;
    opt.reconstruction_out = mine;
    Result<EncodedChunk> direct = EncodeChunk(ElementType::kBF16, values, {}, budget, &scratch, opt);
    ASSERT_TRUE(plain.ok() && direct.ok());
    EXPECT_TRUE(direct->reconstruction.empty());
    EXPECT_EQ(direct->bytes, plain->bytes);
    EXPECT_EQ(mine, plain->reconstruction);
  }
}

TEST(LossyCodecTest, ElementTypeOfDType) {
  EXPECT_EQ(*ElementTypeOf(DType::kBF16), ElementType::kBF16);
  EXPECT_EQ(*ElementTypeOf(DType::kF16), ElementType::kF16);
  EXPECT_EQ(*ElementTypeOf(DType::kF32), ElementType::kF32);
  EXPECT_FALSE(ElementTypeOf(DType::kI32).ok());
}

}  // namespace
}  // namespace ckptfs::lossy
