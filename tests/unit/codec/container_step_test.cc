// Step prediction (codec/tensor/lossy/step_predictor.h, FORMAT.md "Step
// prediction"): weights coded as a delta frame against a prediction from
// their optimizer state. The parameters area (version 4), and whole chains
// of an Adam run: smaller, within budget, decoded identically with and
// without a chunk cache, and hostile indexes rejected at Open. The
// predictor's arithmetic: lossy_step_predictor_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/step_predictor.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

// The container test helpers (blob_test_util.h).
using namespace testing;  // NOLINT(google-build-using-namespace)

LossyChunkParams PredictedParams() {
  LossyChunkParams p = DeltaParams();
  p.source_digest = 0x1234;
  StepPrediction s;
  s.predictor = {1.0, -2e-3, -1e-3, 1e-8};
  s.state_type = lossy::ElementType::kF32;
  s.has_step = s.has_v = s.has_base_step = true;
  s.m_offset = 100;
  s.v_offset = 200;
  s.m_base_offset = 300;
  s.v_base_offset = 400;
  p.prediction = s;
  return p;
}

TEST(StepParams, VersionFourRoundTripsAndRejectsWhatItCannotMean) {
  std::vector<std::byte> bytes = EncodeParams(PredictedParams());
  ASSERT_EQ(bytes.size(), LossyChunkParams::kEncodedSizeV4);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 4);
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->predicted() && back->delta() && back->prediction.has_value());
  EXPECT_EQ(back->prediction->m_offset, 100u);
  EXPECT_EQ(back->prediction->v_base_offset, 400u);
  EXPECT_EQ(back->prediction->predictor.step, -2e-3);
  EXPECT_EQ(back->prediction->predictor.base_step, -1e-3);
  EXPECT_EQ(back->source_digest, 0x1234u);
  // Without a prediction the same fields write version 3 (72 bytes).
  LossyChunkParams plain = PredictedParams();
  plain.prediction.reset();
  EXPECT_EQ(EncodeParams(plain).size(), LossyChunkParams::kEncodedSize);

  auto rejects = [&](const char* what, const std::function<void(std::vector<std::byte>&)>& edit) {
    std::vector<std::byte> b = bytes;
    edit(b);
    Result<LossyChunkParams> r = LossyChunkParams::DecodeFrom(b);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << what;
    }
  };
  rejects("version 3 in 144 bytes", [](auto& b) { b[0] = std::byte{3}; });
  rejects("predicted without delta", [](auto& b) { b[1] = std::byte{2}; });
  rejects("delta without predicted", [](auto& b) { b[1] = std::byte{1}; });
  rejects("unknown flag", [](auto& b) { b[1] = std::byte{7}; });
  rejects("state type 0", [](auto& b) { b[72] = std::byte{0}; });
  rejects("state type 4", [](auto& b) { b[72] = std::byte{4}; });
  rejects("unknown input bit", [](auto& b) { b[73] = std::byte{4 | 64}; });
  rejects("a ref that is no copy", [](auto& b) { b[73] = std::byte{4 | 16}; });
  rejects("binary32 steps without a step term", [](auto& b) { b[73] = std::byte{32}; });
  rejects("a copy with v and base step", [](auto& b) { b[73] = std::byte{15}; });
  rejects("reserved byte", [](auto& b) { b[75] = std::byte{1}; });
  rejects("v offset without v", [](auto& b) { b[73] = std::byte{6}; });
  rejects("step inputs without the step term", [](auto& b) { b[73] = std::byte{3}; });
  rejects("NaN coefficient", [](auto& b) { StoreLE64(b.data() + 112, std::bit_cast<uint64_t>(std::numeric_limits<double>::quiet_NaN())); });
  rejects("eps 0", [](auto& b) { StoreLE64(b.data() + 128, 0); });
  rejects("infinite scale", [](auto& b) { StoreLE64(b.data() + 136, std::bit_cast<uint64_t>(std::numeric_limits<double>::infinity())); });
  rejects("truncated", [](auto& b) { b.resize(100); });
  // A scaled base alone (a first moment): no ranges, no step.
  LossyChunkParams scaled = PredictedParams();
  scaled.prediction = StepPrediction{};
  scaled.prediction->predictor.scale = 0.6;
  std::vector<std::byte> sb = EncodeParams(scaled);
  Result<LossyChunkParams> scaled_back = LossyChunkParams::DecodeFrom(sb);
  ASSERT_TRUE(scaled_back.ok()) << scaled_back.status().ToString();
  EXPECT_FALSE(scaled_back->prediction->has_step);
  EXPECT_EQ(scaled_back->prediction->predictor.scale, 0.6);
  StoreLE64(sb.data() + 80, 8);  // an m offset without the step term
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(sb).ok());

  // Binary32 steps (inputs bit 5) round-trip; a copy (u = m) has none.
  LossyChunkParams f32 = PredictedParams();
  f32.prediction->predictor.f32_steps = true;
  std::vector<std::byte> fb = EncodeParams(f32);
  EXPECT_EQ(static_cast<uint8_t>(fb[73]), 1 | 2 | 4 | 32);
  Result<LossyChunkParams> f32_back = LossyChunkParams::DecodeFrom(fb);
  ASSERT_TRUE(f32_back.ok()) << f32_back.status().ToString();
  EXPECT_TRUE(f32_back->prediction->predictor.f32_steps);
  EXPECT_FALSE(back->prediction->predictor.f32_steps);
  LossyChunkParams copy = PredictedParams();
  copy.prediction->has_v = copy.prediction->has_base_step = false;
  copy.prediction->copy = true;
  copy.prediction->predictor = lossy::StepPredictor{0.0, 1.0, 0.0, 1e-8};
  copy.prediction->v_offset = copy.prediction->m_base_offset = copy.prediction->v_base_offset = 0;
  std::vector<std::byte> cb = EncodeParams(copy);
  ASSERT_TRUE(LossyChunkParams::DecodeFrom(cb).ok());
  cb[73] |= std::byte{32};
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(cb).ok()) << "a copy with binary32 steps";

  LossyChunkParams no_base = PredictedParams();
  no_base.prediction->has_base_step = false;
  no_base.prediction->predictor.base_step = 0;
  no_base.prediction->m_base_offset = no_base.prediction->v_base_offset = 0;
  std::vector<std::byte> nb = EncodeParams(no_base);
  ASSERT_TRUE(LossyChunkParams::DecodeFrom(nb).ok());
  StoreLE64(nb.data() + 104, 1);  // v_base offset without base inputs
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(nb).ok());
}

// A small Adam run: two weight tensors of the same shape whose optimizer
// state is listed in the other order (state 0 belongs to "b"), plus a bias.
struct ChainResult {
  uint64_t weight_bytes = 0;  // stored bytes of the model.* tensors after version 0
  uint32_t predicted = 0;          // weight chunks against a step prediction
  uint32_t predicted_moments = 0;  // exp_avg chunks against a scaled base
};

// Encodes `versions` checkpoints of the run as a chain, checks each one
// decodes (whole-file checksum) with its weights within their budgets.
ChainResult EncodeChain(bool predict, int versions, MapResolver* resolver, std::vector<ObjectId>* ids,
                        std::vector<std::vector<std::byte>>* blobs = nullptr) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, predict);
  AdamRun run;
  ChainResult result;
  std::shared_ptr<const BlobReader> previous;
  for (int version = 0; version < versions; ++version) {
    if (version > 0) run.Steps(5);
    FileBuilder f = run.File();
    std::optional<std::vector<std::byte>> got = AppendVersion(f, options, version, resolver, ids, &previous, blobs);
    if (!got) return result;
    const BlobReader* reader = previous.get();
    Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(*reader);
    EXPECT_TRUE(reports.ok());
    for (const TensorLossyReport& r : *reports) {
      const std::string& name = reader->tensors()[r.tensor].name;
      // The measured error of what was decoded, against the original.
      const Segment& seg = f.layout.segments[r.tensor + 1];
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < seg.length / 4; ++i) {
        const double x = F32At(ByteSpan(f.bytes).subspan(seg.offset), i);
        const double d = F32At(ByteSpan(*got).subspan(seg.offset), i) - x;
        err2 += d * d;
        ref2 += x * x;
      }
      if (name.starts_with("model.")) {
        EXPECT_LE(std::sqrt(err2 / ref2), r.budget_rel_l2 * (1 + 1e-9)) << name << " version " << version;
        EXPECT_LE(r.budget_rel_l2, 1e-2 * (1 + 1e-9)) << name;
        if (version > 0) result.predicted += r.predicted_chunks;
      } else if (name.ends_with("exp_avg")) {
        // Unbiased levels (a first moment) may add kUnbiasAllowance.
        EXPECT_LE(std::sqrt(err2 / ref2), r.budget_rel_l2 * lossy::kUnbiasAllowance * (1 + 1e-9))
            << name << " version " << version;
        if (version > 0) result.predicted_moments += r.predicted_chunks;
      } else {
        EXPECT_EQ(r.predicted_chunks, 0u) << name << ": a second moment is never predicted";
      }
    }
    if (version == 0) continue;
    for (uint32_t c = 0; c < reader->chunks().size(); ++c) {
      const ChunkInfo& chunk = reader->chunks()[c];
      const int32_t t = reader->segments()[chunk.segment].tensor;
      if (t >= 0 && reader->tensors()[t].name.starts_with("model.")) result.weight_bytes += chunk.stored_length;
    }
  }
  return result;
}

TEST(StepPrediction, AdamWeightsArePredictedFromTheirOwnStateAndStoreSmaller) {
  MapResolver with_resolver, without_resolver;
  std::vector<ObjectId> with_ids, without_ids;
  ChainResult with = EncodeChain(true, 5, &with_resolver, &with_ids);
  ChainResult without = EncodeChain(false, 5, &without_resolver, &without_ids);
  EXPECT_EQ(without.predicted + without.predicted_moments, 0u);
  EXPECT_GT(with.predicted, 0u);
  EXPECT_GT(with.predicted_moments, 0u);
  EXPECT_LT(static_cast<double>(with.weight_bytes), 0.9 * static_cast<double>(without.weight_bytes))
      << "with " << with.weight_bytes << " without " << without.weight_bytes;

  // Each predicted chunk of "model.a.weight" reads state 1 (a's), listed
  // after b's: the pairing follows the data, not the order.
  auto reader = with_resolver.OpenBlob(with_ids.back());
  ASSERT_TRUE(reader.ok());
  uint64_t a_m = 0, b_m = 0;
  for (const SegmentInfo& s : (*reader)->segments()) {
    if (s.tensor < 0) continue;
    if ((*reader)->tensors()[s.tensor].name == "optimizer.state.1.exp_avg") a_m = s.offset;
    if ((*reader)->tensors()[s.tensor].name == "optimizer.state.0.exp_avg") b_m = s.offset;
  }
  int checked = 0;
  for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) {
    const ChunkInfo& chunk = (*reader)->chunks()[c];
    if (chunk.codec != ChunkCodec::kLossy) continue;
    const std::string& name = (*reader)->tensors()[(*reader)->segments()[chunk.segment].tensor].name;
    Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom((*reader)->chunk_params(c));
    ASSERT_TRUE(p.ok());
    if (!p->prediction) continue;
    if (name.ends_with("exp_avg")) {  // m decays by beta1^5 between versions
      EXPECT_FALSE(p->prediction->has_step) << name;
      EXPECT_GT(p->prediction->predictor.scale, 0.3) << name;
      EXPECT_LT(p->prediction->predictor.scale, 0.9) << name;
      continue;
    }
    const uint64_t first = (chunk.logical_offset - (*reader)->segments()[chunk.segment].offset);
    if (name == "model.a.weight") {
      EXPECT_EQ(p->prediction->m_offset, a_m + first);
      ++checked;
    }
    if (name == "model.b.weight") {
      EXPECT_EQ(p->prediction->m_offset, b_m + first);
      ++checked;
    }
    EXPECT_TRUE(p->prediction->has_v && p->prediction->has_base_step);
  }
  EXPECT_GT(checked, 0);
}

TEST(StepPrediction, ABaseWithInfStillGivesABlobThatOpens) {
  // A run rolled back from a divergence: the previous version holds Inf
  // where this one is finite. No prediction may record an infinite update.
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, true);
  AdamRun run;
  FileBuilder first = run.File();
  const Segment& w = first.layout.segments[1];
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < 50; ++i) std::memcpy(first.bytes.data() + w.offset + 4 * i * 97, &inf, 4);
  MapResolver resolver;
  std::vector<std::byte> v0 = Encode(first.bytes, first.layout, options);
  const ObjectId id0 = resolver.Add(v0);
  auto base_reader = resolver.OpenBlob(id0);
  ASSERT_TRUE(base_reader.ok());
  run.Steps(5);
  FileBuilder second = run.File();
  BaseRef base{id0, *base_reader};
  std::vector<std::byte> v1 = Encode(second.bytes, second.layout, options, &base);
  auto reader = resolver.OpenBlob(resolver.Add(v1));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<std::vector<std::byte>> got = DecodeAll(**reader);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
}

TEST(StepPrediction, ACachedReaderDecodesTheSameBytes) {
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  EncodeChain(true, 3, &resolver, &ids, &blobs);
  // The mount's path: a chunk cache, read piece by piece from the start, so
  // that each predicted weight chunk pulls the state it reads (later in the
  // file) into the cache before the reader gets there.
  ExpectCachedReadOfNewest(&resolver, ids, blobs);
}

// Rewrites the parameters of the first predicted chunk of `blob`.
std::vector<std::byte> EditFirstPrediction(const std::vector<std::byte>& blob,
                                           const std::function<void(LossyChunkParams&, const BlobIndex&)>& edit) {
  return EditFirstLossyParams(
      blob, [](const LossyChunkParams& p) { return p.prediction.has_value(); },
      [&](LossyChunkParams& p, const BlobIndex& index, size_t) { edit(p, index); });
}

TEST(StepPrediction, OpenRejectsPredictionsThatReadPredictedOrMissingRanges) {
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  EncodeChain(true, 2, &resolver, &ids, &blobs);
  auto open = [&](std::vector<std::byte> bytes) { return testing::OpenBytes(std::move(bytes), std::nullopt, &resolver); };
  ASSERT_TRUE(open(blobs.back()).ok());

  // m read from a predicted chunk (here the chunk itself): a cycle.
  Result<std::shared_ptr<const BlobReader>> r = open(EditFirstPrediction(blobs.back(), [](LossyChunkParams& p, const BlobIndex& index) {
    for (size_t c = 0; c < index.chunks.size(); ++c) {
      Result<LossyChunkParams> q = LossyChunkParams::DecodeFrom(index.params[c]);
      if (q.ok() && q->prediction) {
        p.prediction->m_offset = index.chunks[c].logical_offset;
        return;
      }
    }
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("covers a step-predicted chunk"), std::string::npos) << r.status().ToString();

  // v past the end of the file.
  r = open(EditFirstPrediction(blobs.back(), [](LossyChunkParams& p, const BlobIndex& index) {
    p.prediction->v_offset = index.header.logical_size - 4;
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("past the logical size"), std::string::npos) << r.status().ToString();

  // A base range past the base's end opens (the base is not read at Open)
  // but the chunk then fails to decode, naming it; nothing is made up.
  r = open(EditFirstPrediction(blobs.back(), [](LossyChunkParams& p, const BlobIndex&) {
    p.prediction->m_base_offset = uint64_t{1} << 40;
  }));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<std::vector<std::byte>> decoded = DecodeAll(**r);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << decoded.status().ToString();

  // Other coefficients decode to other bytes: the decoded checksum catches it.
  r = open(EditFirstPrediction(blobs.back(), [](LossyChunkParams& p, const BlobIndex&) {
    p.prediction->predictor.step *= 2;
  }));
  ASSERT_TRUE(r.ok());
  decoded = DecodeAll(**r);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kChecksumMismatch) << decoded.status().ToString();
}

}  // namespace
}  // namespace ckptfs
