// Dithered first moments (codec/tensor/lossy/dither.h, FORMAT.md "Dither"):
// the offsets, the uniform grid, an error that is uniform and independent
// of the values, the parameters area (version 7), and an Adam run's chain
// decoded bit for bit at the error it asked for.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/optimizer/dither_candidate.h"
#include "codec/optimizer/step_space.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/dither.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/search.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

TEST(Dither, OffsetsAreUniformOnAHalfOpenUnitIntervalAndAFunctionOfSeedAndIndex) {
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double d = lossy::DitherOffset(42, i);
    ASSERT_GE(d, -0.5);
    ASSERT_LT(d, 0.5);
    sum += d;
    sum2 += d * d;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sum2 / n, 1.0 / 12.0, 0.002);
  EXPECT_EQ(lossy::DitherOffset(42, 7), lossy::DitherOffset(42, 7));
  EXPECT_NE(lossy::DitherOffset(42, 7), lossy::DitherOffset(43, 7));
  EXPECT_NE(lossy::DitherOffset(42, 7), lossy::DitherOffset(42, 8));
  // SplitMix64 of 0x9E3779B97F4A7C15 (seed 0, element 0) is 0xE220A8397B1DCDAF.
  EXPECT_EQ(lossy::DitherOffset(0, 0), static_cast<double>(0xE220A8397B1DCDAFull >> 11) * 0x1p-53 - 0.5);

  std::vector<std::byte> p = F32Bytes({1.0f, -2.0f, 0.0f, std::numeric_limits<float>::infinity()});
  ASSERT_TRUE(lossy::SubtractDither(0.5, 9, p));
  for (int i = 0; i < 3; ++i) {
    const double before = i == 0 ? 1.0 : i == 1 ? -2.0 : 0.0;
    EXPECT_EQ(F32At(p, i), static_cast<float>(before - 0.5 * lossy::DitherOffset(9, i))) << i;
  }
  EXPECT_TRUE(std::isinf(F32At(p, 3))) << "a non-finite result keeps its value";
  EXPECT_FALSE(lossy::SubtractDither(0.0, 9, p));
  EXPECT_FALSE(lossy::SubtractDither(std::numeric_limits<double>::quiet_NaN(), 9, p));
}

TEST(Dither, TheGridIsTheMultiplesOfTheStepCoveringTheLargestResidual) {
  std::vector<uint32_t> counts(lossy::kHistogramBins, 0);
  auto count = [&](float r) { ++counts[lossy::FloatBits(r) >> lossy::kHistogramShift]; };
  for (float r : {0.01f, -0.3f, 0.7f, -2.6f}) count(r);
  std::optional<lossy::SearchResult> grid = lossy::UniformGridConfig(counts, 0.5f);
  ASSERT_TRUE(grid);
  const lossy::QuantizeTable& t = grid->table;
  // |r| < 2.75 (the bin of 2.6 ends below 2.75): K = 6 levels a side.
  ASSERT_EQ(t.num_levels % 2, 0u);
  const uint32_t k = t.num_levels / 2;
  EXPECT_GE(k, 6u);
  EXPECT_LE(k, 7u);
  for (uint32_t j = 0; j < k; ++j) {
    EXPECT_EQ(t.levels[k + j], 0.5f * static_cast<float>(j + 1));
    EXPECT_EQ(t.levels[k - 1 - j], -0.5f * static_cast<float>(j + 1));
  }
  EXPECT_EQ(t.bits, static_cast<uint32_t>(std::bit_width(t.num_levels)));
  EXPECT_EQ(t.prune_below, lossy::FloatBits(0.25f));
  EXPECT_EQ(t.exact_from, lossy::FloatBits(0.5f * (static_cast<float>(k) + 0.5f)));
  // A residual far beyond the grid: 127 levels a side, the rest exact.
  count(1e6f);
  grid = lossy::UniformGridConfig(counts, 0.5f);
  ASSERT_TRUE(grid);
  EXPECT_EQ(grid->table.num_levels, 254u);
  EXPECT_EQ(grid->table.bits, 8u);
  EXPECT_FALSE(lossy::UniformGridConfig(counts, 0.0f));
  EXPECT_FALSE(lossy::UniformGridConfig(counts, std::numeric_limits<float>::infinity()));
}

TEST(Dither, TheErrorIsUniformAndIndependentOfTheValues) {
  // A first moment's step: heavy-tailed values, a base that predicts half.
  const size_t n = 60000;
  std::mt19937 rng(3);
  std::exponential_distribution<float> expo(1.0f);
  std::bernoulli_distribution sign(0.5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n), base(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = (sign(rng) ? 1.0f : -1.0f) * expo(rng);
    base[i] = 0.8f * x[i] + 0.6f * normal(rng);
  }
  const std::vector<std::byte> xb = F32Bytes(x), bb = F32Bytes(base);
  CodecScratch scratch;
  const double rel = 0.9;
  std::optional<DitheredPrediction> d = PredictDithered(xb, bb, rel, /*seed=*/5, scratch);
  ASSERT_TRUE(d);
  const std::vector<std::byte> prediction(d->prediction.prediction.begin(), d->prediction.prediction.end());
  lossy::Scratch lossy_scratch;
  lossy::EncodeOptions options;
  options.uniform_step = d->grid_step;
  const lossy::Budget budget{rel * kDitherBudgetSlack};
  Result<lossy::EncodedChunk> encoded =
      lossy::EncodeChunk(lossy::ElementType::kF32, xb, prediction, budget, &lossy_scratch, options);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  ASSERT_EQ(encoded->stats.mode, 1) << "quantized, on the grid";
  std::vector<std::byte> out(xb.size());
  ASSERT_TRUE(lossy::DecodeChunk(lossy::ElementType::kF32, encoded->bytes, prediction, out, &lossy_scratch).ok());
  EXPECT_TRUE(out == encoded->reconstruction);
  double e2 = 0, x2 = 0, ex = 0, worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(F32At(out, i)) - x[i];
    e2 += e * e;
    x2 += static_cast<double>(x[i]) * x[i];
    ex += e * x[i];
    worst = std::max(worst, std::fabs(e));
  }
  const double step = d->grid_step;
  EXPECT_LE(worst, step * 0.5 * (1 + 1e-5)) << "within half a step";
  EXPECT_NEAR(e2 / n, step * step / 12.0, 0.03 * step * step / 12.0) << "uniform on [-step/2, step/2)";
  EXPECT_NEAR(std::sqrt(e2 / x2), rel, 0.03 * rel);
  EXPECT_LT(std::fabs(ex) / std::sqrt(e2 * x2), 0.02) << "uncorrelated with the values";
  // Without the dither the same grid rounds the residual: its error follows
  // it (the large values are pulled toward the prediction).
  CodecScratch plain_scratch;
  std::vector<std::byte> plain = bb;
  for (size_t i = 0; i < n; ++i)
    StoreLE32(plain.data() + 4 * i, std::bit_cast<uint32_t>(static_cast<float>(d->prediction.step.predictor.scale * base[i])));
  Result<lossy::EncodedChunk> rounded =
      lossy::EncodeChunk(lossy::ElementType::kF32, xb, plain, budget, &lossy_scratch, options);
  ASSERT_TRUE(rounded.ok());
  double pe = 0, pe2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = static_cast<double>(x[i]) - F32At(plain, i);
    const double e = static_cast<double>(F32At(rounded->reconstruction, i)) - x[i];
    pe += e * r;
    pe2 += e * e;
  }
  EXPECT_LT(pe / pe2, -0.3) << "undithered, the error is the pruned residual's negative";
  // A budget the grid misses: the step shrinks until it fits (or the chunk
  // is stored losslessly); the budget always holds.
  Result<lossy::EncodedChunk> tight =
      lossy::EncodeChunk(lossy::ElementType::kF32, xb, prediction, lossy::Budget{0.6}, &lossy_scratch, options);
  ASSERT_TRUE(tight.ok());
  EXPECT_LE(tight->stats.err2_sum, 0.36 * tight->stats.ref2_sum);
  EXPECT_EQ(tight->stats.mode, 1) << "a finer grid fits within the retries";
}

// The contexts SubtractDither gives alongside the dither of `n` elements.
std::vector<uint8_t> DitherContexts(uint64_t seed, size_t n) {
  std::vector<std::byte> zeros(4 * n);
  std::vector<uint8_t> ids(n);
  EXPECT_TRUE(lossy::SubtractDither(1.0, seed, zeros, ids.data()));
  return ids;
}

TEST(Dither, SymbolsAreCodedInTheContextsOfTheirOffsets) {
  // Element i's context is the top four bits of its offset's 53.
  std::vector<uint8_t> ids = DitherContexts(77, 5000);
  for (size_t i = 0; i < ids.size(); ++i)
    ASSERT_EQ(ids[i], static_cast<uint8_t>(std::floor((lossy::DitherOffset(77, i) + 0.5) * lossy::kDitherContexts)))
        << i;

  // A step whose base predicts most of it, dithered at 0.9 of it: the grid
  // is coarse against the residual, whose symbol is then mostly one of two
  // neighbours with odds set by the offset.
  const size_t n = 60000;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n), base(n);
  for (size_t i = 0; i < n; ++i) {
    base[i] = normal(rng);
    x[i] = base[i] + 0.5f * normal(rng);
  }
  const std::vector<std::byte> xb = F32Bytes(x), bb = F32Bytes(base);
  CodecScratch scratch;
  std::optional<DitheredPrediction> d = PredictDithered(xb, bb, 0.9, /*seed=*/21, scratch);
  ASSERT_TRUE(d);
  const std::vector<std::byte> prediction(d->prediction.prediction.begin(), d->prediction.prediction.end());
  ids = DitherContexts(21, n);
  ASSERT_TRUE(std::equal(ids.begin(), ids.end(), d->contexts.ids)) << "the candidate's own contexts";
  lossy::Scratch lossy_scratch;
  lossy::EncodeOptions options;
  options.uniform_step = d->grid_step;
  const lossy::Budget budget{0.9 * kDitherBudgetSlack};
  Result<lossy::EncodedChunk> one_table =
      lossy::EncodeChunk(lossy::ElementType::kF32, xb, prediction, budget, &lossy_scratch, options);
  options.symbol_contexts = ByteContexts{ids.data(), lossy::kDitherContexts};
  Result<lossy::EncodedChunk> in_contexts =
      lossy::EncodeChunk(lossy::ElementType::kF32, xb, prediction, budget, &lossy_scratch, options);
  ASSERT_TRUE(one_table.ok() && in_contexts.ok());
  EXPECT_EQ(static_cast<uint8_t>(one_table->bytes[0]), 3);
  EXPECT_EQ(static_cast<uint8_t>(in_contexts->bytes[0]), 4) << "stream version 4: a context rANS plane";
  EXPECT_TRUE(in_contexts->reconstruction == one_table->reconstruction) << "the same quantization";
  EXPECT_LT(in_contexts->bytes.size(), 0.85 * one_table->bytes.size());

  std::vector<std::byte> out(xb.size());
  const ByteContexts contexts{ids.data(), lossy::kDitherContexts};
  ASSERT_TRUE(lossy::DecodeChunk(lossy::ElementType::kF32, in_contexts->bytes, prediction, out, &lossy_scratch,
                                 nullptr, nullptr, contexts)
                  .ok());
  EXPECT_TRUE(out == in_contexts->reconstruction);
  EXPECT_EQ(lossy::DecodeChunk(lossy::ElementType::kF32, in_contexts->bytes, prediction, out, &lossy_scratch).code(),
            StatusCode::kCorruption)
      << "without its contexts";
  const std::vector<uint8_t> other = DitherContexts(22, n);
  const Status wrong = lossy::DecodeChunk(lossy::ElementType::kF32, in_contexts->bytes, prediction, out,
                                          &lossy_scratch, nullptr, nullptr, {other.data(), lossy::kDitherContexts});
  EXPECT_TRUE(!wrong.ok() || out != in_contexts->reconstruction) << "another seed's contexts";
}

LossyChunkParams DitherParams() {
  LossyChunkParams p = DeltaParams();
  p.flags |= LossyChunkParams::kFlagPredicted | LossyChunkParams::kFlagStepSpace | LossyChunkParams::kFlagDither;
  StepPrediction step;
  step.predictor.scale = 0.6;
  p.prediction = step;
  p.step_space = StepSpace{4096, kStepSpaceEps};
  p.dither = DitherTerm{0.125, 0x1234567890abcdefull};
  return p;
}

TEST(DitherParams, VersionSevenRoundTripsAndRejectsWhatItCannotMean) {
  const std::vector<std::byte> good = EncodeParams(DitherParams());
  ASSERT_EQ(good.size(), LossyChunkParams::kEncodedSizeV7);
  EXPECT_EQ(good[0], std::byte{7});
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(good);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->dither);
  EXPECT_EQ(back->dither->step, 0.125);
  EXPECT_EQ(back->dither->seed, 0x1234567890abcdefull);
  EXPECT_FALSE(back->low_rank);
  EXPECT_TRUE(EncodeParams(*back) == good);
  // With a low-rank term as well.
  LossyChunkParams both = DitherParams();
  both.flags |= LossyChunkParams::kFlagLowRank;
  both.low_rank = LowRankTerm{128, 2, 2 * (8 + 64 + 128)};
  Result<LossyChunkParams> both_back = LossyChunkParams::DecodeFrom(EncodeParams(both));
  ASSERT_TRUE(both_back.ok()) << both_back.status().ToString();
  EXPECT_TRUE(both_back->low_rank && both_back->dither);

  auto rejected = [](const std::vector<std::byte>& bytes, const char* why) {
    EXPECT_EQ(LossyChunkParams::DecodeFrom(bytes).status().code(), StatusCode::kCorruption) << why;
  };
  std::vector<std::byte> b = good;
  b[0] = std::byte{6};
  rejected(b, "version 6 in 208 bytes");
  b = good;
  b[1] = std::byte{LossyChunkParams::kFlagDelta | LossyChunkParams::kFlagPredicted | LossyChunkParams::kFlagStepSpace};
  rejected(b, "without the dither flag");
  b = good;
  b[164] = std::byte{1};
  rejected(b, "a term area without the low-rank flag");
  for (double step : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    b = good;
    StoreLE64(b.data() + 192, std::bit_cast<uint64_t>(step));
    rejected(b, "a step that is not finite and > 0");
  }
  LossyChunkParams no_space = DitherParams();
  no_space.step_space.reset();
  no_space.flags &= static_cast<uint8_t>(~LossyChunkParams::kFlagStepSpace);
  b = EncodeParams(no_space);
  rejected(b, "a dither outside step space");
  // The dither flag in version 6.
  b = EncodeParams(both);
  b.resize(LossyChunkParams::kEncodedSizeV6);
  b[0] = std::byte{6};
  rejected(b, "the dither flag in version 6");
}

TEST(Dither, AnAdamRunDecodesBitForBitWithItsFirstMomentsErrorNoiseOfTheSizeAsked) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  EncodeOptions options = DefaultLossy(policy, true);
  options.momentum_step_space = true;
  options.momentum_dither = 0.9;
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  std::shared_ptr<const BlobReader> previous;
  AdamRun run;
  uint32_t dithered = 0;
  for (int version = 0; version < 4; ++version) {
    if (version > 0) run.Steps(5);
    const FileBuilder f = run.File();
    std::optional<std::vector<std::byte>> got = AppendVersion(f, options, version, &resolver, &ids, &previous, &blobs);
    ASSERT_TRUE(got.has_value());
    for (uint32_t c = 0; c < previous->chunks().size(); ++c) {
      if (previous->chunks()[c].codec != ChunkCodec::kLossy) continue;
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(previous->chunk_params(c));
      ASSERT_TRUE(p.ok());
      if (!p->dither) continue;
      ++dithered;
      EXPECT_TRUE(p->step_space && p->prediction);
      EXPECT_LE(p->err2_sum, std::pow(0.9 * kDitherBudgetSlack, 2) * p->ref2_sum);
    }
    if (version == 0) continue;
    // The step of the matrices' first moments: noise of about 0.9 of it,
    // uncorrelated with it.
    for (int t : {3, 5}) {
      const Segment& ms = f.layout.segments[t + 1];
      const Segment& vs = f.layout.segments[t + 2];
      const std::vector<float>& m = t == 3 ? run.b.m : run.a.m;
      double e2 = 0, x2 = 0, ex = 0;
      for (size_t i = 0; i < AdamRun::kN; ++i) {
        const float s = std::sqrt(F32At(ByteSpan(*got).subspan(vs.offset), i)) + kStepSpaceEps;
        const double x = m[i] / s;
        const double e = F32At(ByteSpan(*got).subspan(ms.offset), i) / s - x;
        e2 += e * e;
        x2 += x * x;
        ex += e * x;
      }
      EXPECT_NEAR(std::sqrt(e2 / x2), 0.9, 0.06) << "version " << version << " tensor " << t;
      EXPECT_LT(std::fabs(ex) / std::sqrt(e2 * x2), 0.05) << "version " << version << " tensor " << t;
    }
  }
  // Both matrices' exp_avg in every delta version (several chunks each).
  EXPECT_GE(dithered, 3u * 2u);
  ExpectCachedReadOfNewest(&resolver, ids, blobs);
}

}  // namespace
}  // namespace ckptfs
