// The dynamic-precision budget schedule: the pure budget function, the
// encoder following it on a converging sequence (tighter error as the
// updates shrink), and the container recording the applied budget.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/schedule.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs {
namespace {

using lossy::Budget;
using lossy::BudgetSchedule;
using lossy::EffectiveBudget;

BudgetSchedule Dsq() {
  BudgetSchedule s;
  s.kind = BudgetSchedule::Kind::kDsq;
  return s;
}

TEST(BudgetSchedule, ParsesNames) {
  EXPECT_FALSE(lossy::ParseBudgetSchedule("off")->enabled());
  EXPECT_EQ(lossy::ParseBudgetSchedule("dsq")->kind, BudgetSchedule::Kind::kDsq);
  EXPECT_EQ(lossy::BudgetScheduleName(Dsq()), "dsq");
  EXPECT_EQ(lossy::BudgetScheduleName(BudgetSchedule{}), "off");
  for (const char* bad : {"", "DSQ", "on", "dsq "}) EXPECT_FALSE(lossy::ParseBudgetSchedule(bad).ok()) << bad;
}

TEST(BudgetSchedule, OffKeyFrameOrNoRelL2KeepTheConfiguredBudget) {
  const Budget b{1e-2, 0.5};
  for (const Budget& got : {EffectiveBudget(BudgetSchedule{}, b, 1e-4), EffectiveBudget(Dsq(), b, std::nullopt),
                            EffectiveBudget(Dsq(), b, NAN), EffectiveBudget(Dsq(), b, -1.0),
                            EffectiveBudget(Dsq(), b, INFINITY)}) {
    EXPECT_EQ(got.rel_l2, b.rel_l2);
    EXPECT_EQ(got.max_abs, b.max_abs);
  }
  const Budget abs_only{0, 0.5};
  EXPECT_EQ(EffectiveBudget(Dsq(), abs_only, 1e-6).max_abs, 0.5);
  EXPECT_EQ(EffectiveBudget(Dsq(), abs_only, 1e-6).rel_l2, 0.0);
  const Budget lossless{};
  EXPECT_EQ(EffectiveBudget(Dsq(), lossless, 1e-6).rel_l2, 0.0);
}

TEST(BudgetSchedule, FollowsTheUpdateBetweenFloorAndConfigured) {
  const BudgetSchedule s = Dsq();
  const Budget b{1e-2, 0.0};
  // A large update: the configured budget (never looser).
  EXPECT_EQ(EffectiveBudget(s, b, 0.5).rel_l2, 1e-2);
  EXPECT_EQ(EffectiveBudget(s, b, s.update_fraction == 0 ? 1.0 : 1e-2 / s.update_fraction).rel_l2, 1e-2);
  // In between: a fixed fraction of the update.
  const double r = 1e-2;
  EXPECT_DOUBLE_EQ(EffectiveBudget(s, b, r).rel_l2, s.update_fraction * r);
  EXPECT_LT(EffectiveBudget(s, b, r).rel_l2, 1e-2);
  // Monotone in the update.
  double last = 0;
  for (double u : {0.0, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0}) {
    const double got = EffectiveBudget(s, b, u).rel_l2;
    EXPECT_GE(got, last) << u;
    EXPECT_LE(got, b.rel_l2);
    EXPECT_GE(got, s.min_fraction * b.rel_l2 * (1 - 1e-12));
    last = got;
  }
  // A vanishing update: the floor, never lossless.
  EXPECT_DOUBLE_EQ(EffectiveBudget(s, b, 0.0).rel_l2, s.min_fraction * 1e-2);
  BudgetSchedule no_floor = s;
  no_floor.min_fraction = 0;
  EXPECT_GT(EffectiveBudget(no_floor, b, 0.0).rel_l2, 0.0);
  // max_abs shrinks by the same factor.
  const Budget both{1e-2, 0.4};
  const Budget got = EffectiveBudget(s, both, r);
  EXPECT_DOUBLE_EQ(got.max_abs / both.max_abs, got.rel_l2 / both.rel_l2);
}

TEST(BudgetSchedule, TheFractionScalesTheBudgetWithinTheSameBounds) {
  const Budget b{1e-2, 0.0};
  for (double fraction : {0.25, 0.5, 1.0, 2.0}) {
    BudgetSchedule s = Dsq();
    s.update_fraction = fraction;
    EXPECT_DOUBLE_EQ(EffectiveBudget(s, b, 4e-3).rel_l2, std::min(fraction * 4e-3, 1e-2)) << fraction;
    EXPECT_EQ(EffectiveBudget(s, b, 5e-2).rel_l2, 1e-2) << fraction;  // never looser than configured
    EXPECT_DOUBLE_EQ(EffectiveBudget(s, b, 1e-5).rel_l2, s.min_fraction * 1e-2) << fraction;
  }
}

// A converging sequence: weights drift with steps that halve every version
// (a decaying learning rate). Each version is a delta frame against the
// previous reconstruction (closed loop), with and without the schedule.
TEST(BudgetSchedule, EncoderTightensTheErrorAsUpdatesShrink) {
  constexpr size_t kN = 1 << 16;
  constexpr double kBudget = 1e-2;
  const BudgetSchedule dsq = Dsq();
  std::vector<float> w = lossy::testing::Generate(lossy::testing::Dist::kNormal, kN, 3);
  std::vector<std::byte> base_off, base_dsq;
  lossy::Scratch scratch;
  double last_budget = INFINITY;
  for (int v = 0; v < 7; ++v) {
    std::vector<float> step = lossy::testing::Generate(lossy::testing::Dist::kNormal, kN, 100 + v);
    const float scale = 2e-2f * std::ldexp(1.0f, -v);  // relative step 2e-2 * 2^-v (w and step share sigma)
    for (size_t i = 0; i < kN; ++i) w[i] += scale * step[i];
    const std::vector<std::byte> values = lossy::testing::ToElements(lossy::ElementType::kF32, w);
    lossy::EncodeOptions with;
    with.schedule = &dsq;
    Result<lossy::EncodedChunk> off = lossy::EncodeChunk(lossy::ElementType::kF32, values, base_off, {kBudget, 0}, &scratch);
    Result<lossy::EncodedChunk> on =
        lossy::EncodeChunk(lossy::ElementType::kF32, values, base_dsq, {kBudget, 0}, &scratch, with);
    ASSERT_TRUE(off.ok() && on.ok());
    const lossy::testing::NaiveError e_off = lossy::testing::Measure(lossy::ElementType::kF32, values, off->reconstruction);
    const lossy::testing::NaiveError e_on = lossy::testing::Measure(lossy::ElementType::kF32, values, on->reconstruction);
    const double rel_off = std::sqrt(e_off.err_sq / e_off.norm_sq), rel_on = std::sqrt(e_on.err_sq / e_on.norm_sq);
    EXPECT_LE(rel_off, kBudget) << v;
    EXPECT_EQ(off->stats.budget.rel_l2, kBudget);
    EXPECT_EQ(off->stats.update_rel, 0.0);
    // The decoder reproduces the scheduled reconstruction.
    std::vector<std::byte> decoded(values.size());
    ASSERT_TRUE(lossy::DecodeChunk(lossy::ElementType::kF32, on->bytes, base_dsq, decoded, &scratch).ok());
    EXPECT_EQ(decoded, on->reconstruction) << v;
    if (v == 0) {
      EXPECT_EQ(on->bytes, off->bytes) << "a key frame is not scheduled";
    } else {
      // The measured update is the true one, within the histogram's resolution.
      double d2 = 0, n2 = 0;
      for (size_t i = 0; i < kN; ++i) {
        float b;
        std::memcpy(&b, base_dsq.data() + 4 * i, 4);
        d2 += (double(w[i]) - b) * (double(w[i]) - b);
        n2 += double(w[i]) * w[i];
      }
      EXPECT_NEAR(on->stats.update_rel, std::sqrt(d2 / n2), 0.05 * std::sqrt(d2 / n2)) << v;
      const Budget want = EffectiveBudget(dsq, {kBudget, 0}, on->stats.update_rel);
      EXPECT_EQ(on->stats.budget.rel_l2, want.rel_l2) << v;
      EXPECT_LE(rel_on, want.rel_l2) << v;
      EXPECT_LE(want.rel_l2, last_budget) << v << ": the budget follows the shrinking update";
      last_budget = want.rel_l2;
      if (v >= 3) {
        EXPECT_LT(want.rel_l2, kBudget) << v;
        EXPECT_LT(rel_on, 0.6 * rel_off) << v << ": tighter than the fixed budget once updates are small";
      }
    }
    base_off = off->reconstruction;
    base_dsq = on->reconstruction;
  }
}

EncodeOptions LossyOptions(double rel_l2, bool dsq) {
  EncodeOptions o;
  o.chunk_bytes = 64 << 10;
  o.lossy_budget = [rel_l2](FileFormat, const TensorInfo&) { return lossy::Budget{rel_l2, 0}; };
  if (dsq) o.budget_schedule = Dsq();
  return o;
}

// Adds a small training step (about 2e-3 of a 0.05-scale tensor) to the f32
// elements of `w`.
void AddSmallStep(std::vector<std::byte>* w, uint32_t seed) {
  const size_t n = w->size() / 4;
  std::vector<std::byte> step = testing::NormalF32(n, seed, 0.05f * 2e-3f);
  for (size_t i = 0; i < n; ++i) {
    float a, d;
    std::memcpy(&a, w->data() + 4 * i, 4);
    std::memcpy(&d, step.data() + 4 * i, 4);
    a += d;
    std::memcpy(w->data() + 4 * i, &a, 4);
  }
}

// Two versions of one tensor, the second a small step from the first.
struct TwoVersions {
  testing::FileBuilder v0, v1;
};
TwoVersions SmallStep() {
  std::vector<std::byte> w = testing::NormalF32(60000, 11, 0.05f);
  TwoVersions t;
  t.v0.Verbatim(testing::RandomBytes(64, 1)).Tensor("w", DType::kF32, {60000}, w);
  AddSmallStep(&w, 12);
  t.v1.Verbatim(testing::RandomBytes(64, 1)).Tensor("w", DType::kF32, {60000}, w);
  return t;
}

TEST(BudgetSchedule, BlobRecordsTheAppliedBudgetPerTensor) {
  TwoVersions t = SmallStep();
  for (bool dsq : {false, true}) {
    SCOPED_TRACE(dsq ? "dsq" : "off");
    testing::MapResolver resolver;
    const EncodeOptions options = LossyOptions(1e-2, dsq);
    ObjectId id0 = resolver.Add(testing::Encode(t.v0.bytes, t.v0.layout, options));
    BaseRef base{id0, *resolver.OpenBlob(id0)};
    EncodeStats stats;
    std::vector<std::byte> blob = testing::Encode(t.v1.bytes, t.v1.layout, options, &base, &stats);
    ASSERT_TRUE(stats.uses_base);
    ObjectId id1 = resolver.Add(blob);
    auto reader = resolver.OpenBlob(id1);
    ASSERT_TRUE(reader.ok());
    Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**reader);
    ASSERT_TRUE(reports.ok());
    ASSERT_EQ(reports->size(), 1u);
    const TensorLossyReport& r = reports->front();
    EXPECT_LE(r.rel_l2, r.budget_rel_l2 * (1 + 1e-9));
    if (dsq) {
      // The update is measured against the base's reconstruction: the step
      // plus the base's own quantization error.
      Result<std::vector<std::byte>> base_recon = DecodeAll(*base.reader);
      ASSERT_TRUE(base_recon.ok());
      const Segment& s = t.v1.layout.segments[1];
      ErrorSums u = MeasureError(DType::kF32, ByteSpan(t.v1.bytes).subspan(s.offset, s.length),
                                 ByteSpan(*base_recon).subspan(s.offset, s.length));
      const double update = std::sqrt(u.err2 / u.ref2);
      EXPECT_NEAR(r.update_rel, update, 0.05 * update);
      const double want = EffectiveBudget(Dsq(), {1e-2, 0}, update).rel_l2;
      EXPECT_NEAR(r.budget_rel_l2, want, 0.05 * want);
      EXPECT_LT(r.budget_rel_l2, 1e-2);
    } else {
      EXPECT_NEAR(r.budget_rel_l2, 1e-2, 1e-12);
      EXPECT_EQ(r.update_rel, 0.0);
    }
    // Decoding is unaffected: within the recorded budget.
    Result<std::vector<std::byte>> got = DecodeAll(**reader);
    ASSERT_TRUE(got.ok());
    const Segment& s = t.v1.layout.segments[1];
    ErrorSums e = MeasureError(DType::kF32, ByteSpan(t.v1.bytes).subspan(s.offset, s.length),
                               ByteSpan(*got).subspan(s.offset, s.length));
    EXPECT_LE(std::sqrt(e.err2 / e.ref2), r.budget_rel_l2 * (1 + 1e-9));
  }
}

// A frozen tensor (bit-identical between versions) next to a trained one.
// Measured against the base's reconstruction, the frozen tensor's "update"
// is the base's own quantization error; without the source digest the
// schedule would tighten its budget and re-encode the same values, version
// after version.
TEST(BudgetSchedule, FrozenTensorKeepsItsBudgetAndCostsNothing) {
  constexpr size_t kN = 60000;
  const std::vector<std::byte> frozen = testing::NormalF32(kN, 21, 0.05f);
  std::vector<testing::FileBuilder> versions(3);
  std::vector<std::byte> trained = testing::NormalF32(kN, 22, 0.05f);
  for (size_t v = 0; v < versions.size(); ++v) {
    if (v > 0) AddSmallStep(&trained, 30 + static_cast<uint32_t>(v));
    versions[v].Tensor("frozen", DType::kF32, {kN}, frozen).Tensor("trained", DType::kF32, {kN}, trained);
  }
  const EncodeOptions options = LossyOptions(1e-2, true);
  // Encodes version v against `base_id` (a key frame when none); returns its id.
  testing::MapResolver resolver;
  auto encode = [&](size_t v, std::optional<ObjectId> base_id) {
    std::optional<BaseRef> base;
    if (base_id) base = BaseRef{*base_id, *resolver.OpenBlob(*base_id)};
    return resolver.Add(testing::Encode(versions[v].bytes, versions[v].layout, options, base ? &*base : nullptr));
  };
  auto reports_of = [&](const ObjectId& id) {
    Result<std::vector<TensorLossyReport>> r = LossyTensorReports(**resolver.OpenBlob(id));
    EXPECT_TRUE(r.ok() && r->size() == 2u);
    return r.ok() && r->size() == 2u ? *r : std::vector<TensorLossyReport>(2);
  };
  auto decode = [&](const ObjectId& id) {
    Result<std::vector<std::byte>> r = DecodeAll(**resolver.OpenBlob(id));
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::vector<std::byte>(versions[0].bytes.size());
  };
  auto frozen_of = [&](const std::vector<std::byte>& file) {  // the frozen tensor is first
    return std::vector<std::byte>(file.begin(), file.begin() + 4 * kN);
  };

  const ObjectId v0 = encode(0, std::nullopt);
  const ObjectId v1 = encode(1, v0);
  const ObjectId v2 = encode(2, v1);
  for (const ObjectId& id : {v1, v2}) {
    std::vector<TensorLossyReport> r = reports_of(id);
    EXPECT_NEAR(r[0].budget_rel_l2, 1e-2, 1e-12) << "frozen: the configured budget";
    EXPECT_EQ(r[0].update_rel, 0.0) << "frozen: no update";
    EXPECT_EQ(r[0].pruned, kN) << "frozen: every element unchanged";
    EXPECT_LT(r[1].budget_rel_l2, 1e-2) << "trained: the schedule still tightens";
    EXPECT_GT(r[1].update_rel, 0.0);
  }
  // The frozen tensor reads back as the key frame's reconstruction, within
  // its budget, in every version.
  const std::vector<std::byte> key = frozen_of(decode(v0));
  for (const ObjectId& id : {v1, v2}) {
    EXPECT_EQ(frozen_of(decode(id)), key);
  }
  ErrorSums e = MeasureError(DType::kF32, frozen, key);
  EXPECT_LE(std::sqrt(e.err2 / e.ref2), 1e-2);

  // The same versions against a key frame whose parameters carry no digest
  // (what version-2 writers produced): the frozen tensor is tightened and
  // re-encoded, and costs bytes.
  std::vector<std::byte> v0_bytes = testing::Encode(versions[0].bytes, versions[0].layout, options);
  const ObjectId v0_old = resolver.Add(testing::RewriteBlob(v0_bytes, [](BlobIndex& index, auto&) {
    for (size_t c = 0; c < index.chunks.size(); ++c)
      if (index.chunks[c].codec == ChunkCodec::kLossy) {
        index.params[c].resize(LossyChunkParams::kEncodedSizeV2);
        index.params[c][0] = std::byte{2};
      }
  }));
  const ObjectId v1_old = encode(1, v0_old);
  EXPECT_LT(reports_of(v1_old)[0].budget_rel_l2, 1e-2);
  auto stored = [&](const ObjectId& id) { return (*resolver.OpenBlob(id))->stored_size(); };
  EXPECT_LT(stored(v1) + 4 * kN / 30, stored(v1_old)) << "the frozen tensor's re-encode costs over 1/30 of its raw size";

  // Another chunking than the base's: no base chunk covers exactly the same
  // range, so nothing is known to be unchanged and the schedule applies.
  EncodeOptions finer = options;
  finer.chunk_bytes = options.chunk_bytes / 2;
  BaseRef base0{v0, *resolver.OpenBlob(v0)};
  const ObjectId v1_finer =
      resolver.Add(testing::Encode(versions[1].bytes, versions[1].layout, finer, &base0));
  EXPECT_LT(reports_of(v1_finer)[0].budget_rel_l2, 1e-2);

  // A digest that matches values that did change (a forged base, or a hash
  // collision) only turns the schedule off: the budget still holds.
  const std::vector<std::byte> trained1(versions[1].bytes.begin() + 4 * kN, versions[1].bytes.end());
  const ObjectId v0_forged = resolver.Add(testing::RewriteBlob(v0_bytes, [&](BlobIndex& index, auto&) {
    for (size_t c = 0; c < index.chunks.size(); ++c)
      if (index.chunks[c].codec == ChunkCodec::kLossy && index.chunks[c].logical_offset >= 4 * kN) {
        Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(index.params[c]);
        ASSERT_TRUE(p.ok());
        const uint64_t at = index.chunks[c].logical_offset - 4 * kN;
        p->source_digest = Checksum64(ByteSpan(trained1).subspan(at, index.chunks[c].logical_length));
        index.params[c].clear();
        ByteWriter w(&index.params[c]);
        p->EncodeTo(w);
      }
  }));
  const ObjectId v1_forged = encode(1, v0_forged);
  std::vector<TensorLossyReport> forged = reports_of(v1_forged);
  EXPECT_NEAR(forged[1].budget_rel_l2, 1e-2, 1e-12) << "the schedule is off for a matching digest";
  EXPECT_LE(forged[1].rel_l2, 1e-2 * (1 + 1e-9));
  const std::vector<std::byte> got = decode(v1_forged);
  ErrorSums t = MeasureError(DType::kF32, trained1, ByteSpan(got).subspan(4 * kN));
  EXPECT_LE(std::sqrt(t.err2 / t.ref2), 1e-2 * (1 + 1e-9));
}

TEST(BudgetSchedule, VersionOneParamsStillDecode) {
  TwoVersions t = SmallStep();
  std::vector<std::byte> blob = testing::Encode(t.v0.bytes, t.v0.layout, LossyOptions(1e-2, false));
  // What a version-1 writer produced: 64 bytes, version 1, zeros in the
  // fields version 2 added.
  auto as_v1 = [](std::vector<std::byte>& p, bool keep_budget) {
    p.resize(LossyChunkParams::kEncodedSizeV2);
    p[0] = std::byte{1};
    std::fill(p.begin() + 3, p.begin() + 8, std::byte{0});
    if (!keep_budget) std::fill(p.begin() + 56, p.end(), std::byte{0});
  };
  auto rewrite = [&](bool keep_budget) {
    return testing::RewriteBlob(blob, [&](BlobIndex& index, auto&) {
      for (size_t c = 0; c < index.chunks.size(); ++c)
        if (index.chunks[c].codec == ChunkCodec::kLossy) as_v1(index.params[c], keep_budget);
    });
  };
  auto v1 = testing::OpenBytes(rewrite(false));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**v1);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ(reports->front().budget_rel_l2, 0.0) << "not recorded in version 1";
  EXPECT_TRUE(DecodeAll(**v1).ok());
  // Version 1 with the (then reserved) budget field set is corrupt.
  EXPECT_FALSE(testing::OpenBytes(rewrite(true)).ok());
}

}  // namespace
}  // namespace ckptfs
