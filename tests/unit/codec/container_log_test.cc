// EncodeBlob with the default policy on Adam state: the second moment goes
// through the log mode (per-element relative bound, never pruned), its chunk
// parameters (version 2) report the achieved max_rel, and a closed-loop
// chain of versions stays within the bound at every version.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using testing::Encode;
using testing::F32Bytes;
using testing::FileBuilder;
using testing::MapResolver;
using testing::RandomBytes;

TEST(ContainerLog, SecondMomentChainKeepsEveryElementWithinItsBound) {
  constexpr size_t kN = 20000;
  constexpr double kBudget = 1e-2;
  policy::Policy policy = policy::Policy::Defaults(kBudget, kBudget);
  policy.SetDenominatorBudget(kBudget);
  EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  options.lossy_budget = [&policy](FileFormat, const TensorInfo& t) {
    return policy.BudgetFor("ckpt.pt", FileFormat::kTorchZip, t);
  };
  std::mt19937_64 rng(3);
  std::lognormal_distribution<float> scale(-6.0f, 2.0f);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> gscale(kN), v(kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) gscale[i] = i % 8 == 0 ? 0.0f : scale(rng);
  auto steps = [&](int k) {
    for (int s = 0; s < k; ++s)
      for (size_t i = 0; i < kN; ++i) {
        const float g = gscale[i] * noise(rng);
        v[i] = 0.999f * v[i] + 0.001f * g * g;
      }
  };
  steps(50);

  MapResolver resolver;
  std::shared_ptr<const BlobReader> previous;
  std::optional<ObjectId> previous_id;
  uint64_t key_bytes = 0, delta_bytes = 0;
  for (int version = 0; version < 8; ++version) {
    if (version > 0) steps(10);
    FileBuilder f;
    f.Verbatim(RandomBytes(64, 5)).Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, {kN}, F32Bytes(v));
    BaseRef base{previous_id.value_or(ObjectId{}), previous};
    EncodeStats stats;
    std::vector<std::byte> blob = Encode(f.bytes, f.layout, options, previous ? &base : nullptr, &stats);
    (version == 0 ? key_bytes : delta_bytes) += blob.size();
    ObjectId id = resolver.Add(blob);
    auto reader = resolver.OpenBlob(id);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    Result<std::vector<std::byte>> got = DecodeAll(**reader);
    ASSERT_TRUE(got.ok()) << "version " << version << ": " << got.status().ToString();
    const size_t at = f.layout.segments[1].offset;
    double worst = 0;
    for (size_t i = 0; i < kN; ++i) {
      float y;
      std::memcpy(&y, got->data() + at + 4 * i, 4);
      if (v[i] == 0.0f) {
        ASSERT_EQ(std::bit_cast<uint32_t>(y), 0u) << "a zero must stay +0, element " << i;
        continue;
      }
      const double rel = std::fabs(static_cast<double>(y) - v[i]) / v[i];
      ASSERT_LE(rel, kBudget) << "version " << version << " element " << i;
      worst = std::max(worst, rel);
    }
    Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**reader);
    ASSERT_TRUE(reports.ok()) << reports.status().ToString();
    ASSERT_EQ(reports->size(), 1u);
    const TensorLossyReport& r = (*reports)[0];
    EXPECT_EQ(r.log_chunks, r.lossy_chunks);
    EXPECT_GT(r.log_chunks, 0u);
    EXPECT_EQ(r.max_rel, worst) << "the parameters report the achieved bound";
    EXPECT_GT(r.max_bits, 0);
    EXPECT_EQ(r.pruned, 0u) << "the log mode never prunes";
    previous = *reader;
    previous_id = id;
  }
  EXPECT_LT(delta_bytes / 7, key_bytes / 2) << "closed-loop index deltas should cost well under a key frame";
  EXPECT_LT(key_bytes, kN * 4 / 2);
}

TEST(ContainerLog, VersionThreeParametersRoundTripAndOlderVersionsStillDecode) {
  LossyChunkParams p;
  p.bits = 12;
  p.mode = 2;
  p.max_rel = 0.0093;
  p.err2_sum = 1;
  p.ref2_sum = 2;
  p.source_digest = 0x0123456789abcdefull;
  std::vector<std::byte> bytes;
  ByteWriter w(&bytes);
  p.EncodeTo(w);
  ASSERT_EQ(bytes.size(), LossyChunkParams::kEncodedSize);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 3);
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->mode, 2);
  EXPECT_EQ(back->max_rel, 0.0093);
  EXPECT_EQ(back->bits, 12);
  EXPECT_EQ(back->source_digest, 0x0123456789abcdefull);
  bytes[3] = std::byte{1};  // a mode other than log with log's bit width
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(bytes).ok());

  LossyChunkParams q;  // a quantized chunk: its mode in byte 3
  q.bits = 5;
  q.mode = 1;
  q.budget_rel_l2 = 0.01;
  q.source_digest = 42;
  std::vector<std::byte> cur;
  ByteWriter w1(&cur);
  q.EncodeTo(w1);
  EXPECT_EQ(static_cast<uint8_t>(cur[0]), 3);
  EXPECT_EQ(static_cast<uint8_t>(cur[3]), 1);
  Result<LossyChunkParams> q_back = LossyChunkParams::DecodeFrom(cur);
  ASSERT_TRUE(q_back.ok());
  EXPECT_EQ(q_back->mode, 1);
  EXPECT_EQ(q_back->budget_rel_l2, 0.01);
  EXPECT_EQ(q_back->max_rel, 0.0);
  EXPECT_EQ(q_back->source_digest, 42u);
  // The size tells the version: 72 bytes must say 3, 64 bytes 1 or 2.
  std::vector<std::byte> wrong = cur;
  wrong[0] = std::byte{2};
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(wrong).ok());
  wrong = cur;
  wrong.resize(LossyChunkParams::kEncodedSizeV2);
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(wrong).ok()) << "64 bytes cannot be version 3";
  wrong.push_back(std::byte{0});
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(wrong).ok()) << "65 bytes";
  // What version-2 writers produced: the first 64 bytes, no digest.
  std::vector<std::byte> v2(cur.begin(), cur.begin() + LossyChunkParams::kEncodedSizeV2);
  v2[0] = std::byte{2};
  Result<LossyChunkParams> v2_back = LossyChunkParams::DecodeFrom(v2);
  ASSERT_TRUE(v2_back.ok()) << v2_back.status().ToString();
  EXPECT_EQ(v2_back->mode, 1);
  EXPECT_EQ(v2_back->budget_rel_l2, 0.01);
  EXPECT_EQ(v2_back->source_digest, 0u) << "not recorded before version 3";
  // What the first writers produced: version 1, bytes 3-7 and 56-63 zero;
  // the mode follows from bits.
  std::vector<std::byte> old = v2;
  old[0] = std::byte{1};
  std::fill(old.begin() + 3, old.begin() + 8, std::byte{0});
  std::fill(old.begin() + 56, old.end(), std::byte{0});
  Result<LossyChunkParams> old_back = LossyChunkParams::DecodeFrom(old);
  ASSERT_TRUE(old_back.ok());
  EXPECT_EQ(old_back->mode, 1);
  old[3] = std::byte{2};  // version 1 keeps byte 3 reserved
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(old).ok());
}

}  // namespace
}  // namespace ckptfs
