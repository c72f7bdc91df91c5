// Low-rank terms (codec/tensor/lossy/low_rank.h, FORMAT.md "Low-rank
// term"): the factor block's arithmetic, the parameters area (version 6),
// chains of an Adam run whose gradients are nearly low-rank (decoded bit for
// bit, within the step-space budget, smaller than without the term), and
// hostile blobs rejected.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/optimizer/low_rank_candidate.h"
#include "codec/optimizer/step_space.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/low_rank.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

std::vector<std::byte> F32Zeros(size_t n) { return std::vector<std::byte>(4 * n); }

TEST(LowRank, TheTermIsTheSumOfTheDequantizedOuterProducts) {
  // rank 2 over 3 x 4: scale_a {0.5, 2}, scale_b {1, 0.25}.
  const uint64_t rows = 3, columns = 4;
  std::vector<std::byte> block(lossy::LowRankBlockSize(rows, columns, 2));
  ASSERT_EQ(block.size(), 2u * (8 + 3 + 4));
  StoreLE32(block.data() + 0, std::bit_cast<uint32_t>(0.5f));
  StoreLE32(block.data() + 4, std::bit_cast<uint32_t>(2.0f));
  StoreLE32(block.data() + 8, std::bit_cast<uint32_t>(1.0f));
  StoreLE32(block.data() + 12, std::bit_cast<uint32_t>(0.25f));
  const int8_t a[2][3] = {{1, -2, 3}, {0, 1, -1}};
  const int8_t b[2][4] = {{2, 0, -1, 4}, {4, 8, 0, -4}};
  std::memcpy(block.data() + 16, a, 6);
  std::memcpy(block.data() + 22, b, 8);
  std::vector<std::byte> p = F32Zeros(rows * columns);
  StoreLE32(p.data() + 4 * 5, std::bit_cast<uint32_t>(10.0f));  // a prediction to add to
  ASSERT_TRUE(lossy::AddLowRank(block, rows, columns, 2, p));
  for (uint64_t i = 0; i < rows; ++i)
    for (uint64_t j = 0; j < columns; ++j) {
      const double want = (i * columns + j == 5 ? 10.0 : 0.0) + 0.5 * a[0][i] * 1.0 * b[0][j] +
                          2.0 * a[1][i] * 0.25 * b[1][j];
      EXPECT_EQ(F32At(p, i * columns + j), static_cast<float>(want)) << i << "," << j;
    }
  // A scale that is not finite is refused; geometry that cannot be is size 0.
  StoreLE32(block.data() + 4, std::bit_cast<uint32_t>(std::numeric_limits<float>::infinity()));
  EXPECT_FALSE(lossy::AddLowRank(block, rows, columns, 2, p));
  EXPECT_EQ(lossy::LowRankBlockSize(rows, columns, 0), 0u);
  EXPECT_EQ(lossy::LowRankBlockSize(rows, columns, lossy::kMaxLowRank + 1), 0u);
  EXPECT_EQ(lossy::LowRankBlockSize(0, columns, 1), 0u);
}

TEST(LowRank, TheFitFindsAPlantedRankAndIsDeterministic) {
  const uint64_t rows = 40, columns = 30;
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  std::vector<double> u(2 * rows), v(2 * columns), r(rows * columns);
  for (double& x : u) x = normal(rng);
  for (double& x : v) x = normal(rng);
  for (uint64_t i = 0; i < rows; ++i)
    for (uint64_t j = 0; j < columns; ++j)
      r[i * columns + j] = 3 * u[i] * v[j] + u[rows + i] * v[columns + j] + 0.01 * normal(rng);
  std::vector<double> work = r;
  const lossy::LowRankFit fit = lossy::FitLowRank(work.data(), rows, columns, 4);
  ASSERT_GE(fit.rank, 2u);
  ASSERT_EQ(fit.energy_left.size(), fit.rank + 1);
  EXPECT_LT(fit.energy_left[2], 0.01 * fit.energy_left[0]) << "two components hold the planted matrix";
  const std::vector<std::byte> block = lossy::TruncateLowRank(fit, rows, columns, fit.rank);
  EXPECT_EQ(block.size(), lossy::LowRankBlockSize(rows, columns, fit.rank));
  EXPECT_NEAR(std::inner_product(work.begin(), work.end(), work.begin(), 0.0), fit.energy_left.back(),
              1e-9 * fit.energy_left[0])
      << "r is left holding what the components leave";
  work = r;
  const lossy::LowRankFit again = lossy::FitLowRank(work.data(), rows, columns, 4);
  EXPECT_TRUE(lossy::TruncateLowRank(again, rows, columns, again.rank) == block);
  // The first component alone, as the decoder reads it.
  const std::vector<std::byte> one = lossy::TruncateLowRank(fit, rows, columns, 1);
  std::vector<std::byte> p = F32Zeros(rows * columns);
  ASSERT_TRUE(lossy::AddLowRank(one, rows, columns, 1, p));
  double left = 0;
  for (uint64_t k = 0; k < rows * columns; ++k) left += std::pow(r[k] - F32At(p, k), 2);
  EXPECT_NEAR(left, fit.energy_left[1], 1e-3 * fit.energy_left[0]);
}

TEST(LowRank, ChunksOfWholeRowsOnly) {
  const TensorInfo matrix{"m", DType::kF32, {64, 128}, false};
  EXPECT_EQ(ChunkColumns(matrix, 0, 64 * 128), std::optional<uint64_t>(128));
  EXPECT_EQ(ChunkColumns(matrix, 128 * 16, 128 * 16), std::optional<uint64_t>(128));
  EXPECT_FALSE(ChunkColumns(matrix, 100, 128 * 16)) << "starts inside a row";
  EXPECT_FALSE(ChunkColumns(matrix, 0, 128 * 4)) << "fewer than 8 rows";
  EXPECT_FALSE(ChunkColumns(TensorInfo{"b", DType::kF32, {4096}, false}, 0, 4096)) << "a vector";
  EXPECT_EQ(ChunkColumns(TensorInfo{"c", DType::kF32, {16, 4, 3, 3}, false}, 0, 16 * 36),
            std::optional<uint64_t>(36));
}

LossyChunkParams LowRankParams() {
  LossyChunkParams p = DeltaParams();
  p.step_space = StepSpace{4096, kStepSpaceEps};
  StepPrediction s;
  s.predictor.scale = 0.6;
  s.predictor.eps = 1e-8;
  p.prediction = s;
  p.low_rank = LowRankTerm{128, 2, lossy::LowRankBlockSize(64, 128, 2)};
  return p;
}

TEST(LowRankParams, VersionSixRoundTripsAndRejectsWhatItCannotMean) {
  const std::vector<std::byte> good = EncodeParams(LowRankParams());
  ASSERT_EQ(good.size(), LossyChunkParams::kEncodedSizeV6);
  EXPECT_EQ(good[0], std::byte{6});
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(good);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->low_rank);
  EXPECT_EQ(back->low_rank->columns, 128u);
  EXPECT_EQ(back->low_rank->rank, 2u);
  EXPECT_TRUE(EncodeParams(*back) == good);
  auto rejected = [](const std::vector<std::byte>& bytes, const char* why) {
    EXPECT_EQ(LossyChunkParams::DecodeFrom(bytes).status().code(), StatusCode::kCorruption) << why;
  };
  std::vector<std::byte> b = good;
  b[0] = std::byte{5};
  rejected(b, "version 5 in 192 bytes");
  b = good;
  b[1] = std::byte{LossyChunkParams::kFlagDelta | LossyChunkParams::kFlagPredicted | LossyChunkParams::kFlagStepSpace};
  rejected(b, "without the low-rank flag");
  b = good;
  b[180] = std::byte{1};
  rejected(b, "reserved bytes");
  for (uint32_t rank : {0u, lossy::kMaxLowRank + 1}) {
    b = good;
    StoreLE32(b.data() + 164, rank);
    rejected(b, "rank out of range");
  }
  b = good;
  StoreLE32(b.data() + 160, 0);
  rejected(b, "no columns");
  LossyChunkParams no_prediction = LowRankParams();
  no_prediction.prediction.reset();
  no_prediction.flags = LossyChunkParams::kFlagDelta;
  rejected(EncodeParams(no_prediction), "a term without a prediction");
  // The low-rank flag in version 5.
  b = EncodeParams(LowRankParams());
  b.resize(LossyChunkParams::kEncodedSizeV5);
  b[0] = std::byte{5};
  rejected(b, "the low-rank flag in version 5");
}

// An Adam run on one 64 x 128 matrix whose gradients are two fixed outer
// products with coefficients that change every step, plus a little noise:
// its exp_avg is nearly rank 2, and what a scaled base leaves of it too.
struct LowRankRun {
  static constexpr size_t kRows = 64, kColumns = 128, kN = kRows * kColumns;
  std::mt19937 rng{11};
  std::normal_distribution<float> normal{0.0f, 1.0f};
  std::vector<float> w = std::vector<float>(kN), m = std::vector<float>(kN, 0.0f), v = std::vector<float>(kN, 0.0f);
  std::vector<float> a = std::vector<float>(2 * kRows), b = std::vector<float>(2 * kColumns);
  LowRankRun() {
    for (float& x : w) x = 0.05f * normal(rng);
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    Steps(20);
  }
  void Steps(int k) {
    for (int s = 0; s < k; ++s) {
      const float c0 = normal(rng), c1 = normal(rng);
      for (size_t i = 0; i < kRows; ++i)
        for (size_t j = 0; j < kColumns; ++j) {
          const size_t e = i * kColumns + j;
          const float g = c0 * a[i] * b[j] + c1 * a[kRows + i] * b[kColumns + j] + 0.02f * normal(rng);
          m[e] = 0.9f * m[e] + 0.1f * g;
          v[e] = 0.999f * v[e] + 0.001f * g * g;
          w[e] -= 1e-3f * m[e] / (std::sqrt(v[e]) + 1e-8f);
        }
    }
  }
  FileBuilder File() const {
    FileBuilder f;
    f.Verbatim(RandomBytes(40, 1))
        .Tensor("model.w", DType::kF32, {kRows, kColumns}, F32Bytes(w))
        .Tensor("optimizer.state.0.exp_avg", DType::kF32, {kRows, kColumns}, F32Bytes(m))
        .Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, {kRows, kColumns}, F32Bytes(v))
        .Verbatim(RandomBytes(24, 2));
    return f;
  }
};

struct Chain {
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  uint64_t moment_bytes = 0;  // stored bytes of exp_avg in the delta versions
  uint32_t low_rank_chunks = 0;
  double worst_step_error = 0;  // of exp_avg, on the step, over the delta versions
};

void EncodeChain(bool low_rank, int versions, MapResolver* resolver, Chain* chain) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  EncodeOptions options = DefaultLossy(policy, true);
  options.chunk_bytes = 1 << 20;  // one chunk per tensor
  options.momentum_step_space = true;
  options.low_rank_moments = low_rank;
  LowRankRun run;
  std::shared_ptr<const BlobReader> previous;
  for (int version = 0; version < versions; ++version) {
    if (version > 0) run.Steps(5);
    const FileBuilder f = run.File();
    std::optional<std::vector<std::byte>> got =
        AppendVersion(f, options, version, resolver, &chain->ids, &previous, &chain->blobs);
    ASSERT_TRUE(got.has_value());
    for (uint32_t c = 0; c < previous->chunks().size(); ++c) {
      const ChunkInfo& chunk = previous->chunks()[c];
      if (version > 0 && chunk.segment == 2) chain->moment_bytes += chunk.stored_length;
      if (chunk.codec != ChunkCodec::kLossy) continue;
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(previous->chunk_params(c));
      ASSERT_TRUE(p.ok());
      if (p->low_rank) ++chain->low_rank_chunks;
    }
    if (version == 0) continue;
    const Segment& ms = f.layout.segments[2];
    const Segment& vs = f.layout.segments[3];
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < LowRankRun::kN; ++i) {
      const float s = std::sqrt(F32At(ByteSpan(*got).subspan(vs.offset), i)) + kStepSpaceEps;
      const double x = run.m[i] / s;
      const double d = F32At(ByteSpan(*got).subspan(ms.offset), i) / s - x;
      err2 += d * d;
      ref2 += x * x;
    }
    chain->worst_step_error = std::max(chain->worst_step_error, std::sqrt(err2 / ref2));
  }
}

TEST(LowRank, ANearlyLowRankFirstMomentStoresSmallerWithinItsBudget) {
  MapResolver resolver, plain_resolver;
  Chain with, without;
  EncodeChain(true, 5, &resolver, &with);
  EncodeChain(false, 5, &plain_resolver, &without);
  EXPECT_GE(with.low_rank_chunks, 3u) << "most delta versions' exp_avg";
  EXPECT_EQ(without.low_rank_chunks, 0u);
  EXPECT_LT(with.moment_bytes, without.moment_bytes * 0.7) << with.moment_bytes << " vs " << without.moment_bytes;
  // The default budget on the step (0.5) times the unbiasing gain's
  // allowance, with a margin for m = x_hat * s.
  EXPECT_LE(with.worst_step_error, 0.5 * lossy::kUnbiasAllowance * 1.001);
  // The mount's path: a chunk cache, read piece by piece.
  ExpectCachedReadOfNewest(&resolver, with.ids, with.blobs);
}

TEST(LowRank, OpenRejectsATermThatDoesNotFitItsChunkAndReadsCatchADamagedBlock) {
  MapResolver resolver;
  Chain chain;
  EncodeChain(true, 2, &resolver, &chain);
  ASSERT_EQ(chain.low_rank_chunks, 1u);
  auto open = [&](std::vector<std::byte> bytes) { return testing::OpenBytes(std::move(bytes), std::nullopt, &resolver); };
  ASSERT_TRUE(open(chain.blobs.back()).ok());
  auto edit = [&](const std::function<void(LowRankTerm&)>& change) {
    return EditFirstLossyParams(
        chain.blobs.back(), [](const LossyChunkParams& p) { return p.low_rank.has_value(); },
        [&](LossyChunkParams& p, const BlobIndex&, size_t) { change(*p.low_rank); });
  };
  for (const auto& [change, why] : std::vector<std::pair<std::function<void(LowRankTerm&)>, const char*>>{
           {[](LowRankTerm& t) { t.columns = 100; }, "columns that do not divide the chunk"},
           {[](LowRankTerm& t) { t.columns = 64; }, "a block size that does not match the geometry"},
           {[](LowRankTerm& t) { t.block_bytes += 1; }, "a block size that does not match the rank"},
           {[](LowRankTerm& t) {
              t.rank = lossy::kMaxLowRank;
              t.block_bytes = lossy::LowRankBlockSize(64, 128, t.rank);
            },
            "a block that leaves no stream"}}) {
    Result<std::shared_ptr<const BlobReader>> r = open(edit(change));
    if (r.ok()) {
      // A consistent but wrong geometry opens; decoding it fails its checksums.
      EXPECT_FALSE(DecodeAll(**r).ok()) << why;
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << why;
    }
  }
}

}  // namespace
}  // namespace ckptfs
