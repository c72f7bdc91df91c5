// Copies (codec/optimizer/master_copies.h, FORMAT.md "Step prediction",
// inputs bit `copy`): bf16 weights coded against their fp32 master copy in
// the same file. Pairing by evidence, the parameters' rules, whole chains
// (key frame included) within budget and smaller, and hostile indexes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/optimizer/master_copies.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

std::vector<std::byte> Bf16Of(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = lossy::FloatToBf16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// A mixed-precision checkpoint of AdamRun: the model's weights in bf16
// first, then the optimizer's fp32 masters (listed in the other order) and
// Adam's state, as a trainer with master weights saves it.
FileBuilder MixedFile(const AdamRun& run) {
  FileBuilder f;
  f.Verbatim(RandomBytes(40, 1))
      .Tensor("model.a.weight", DType::kBF16, {120, 200}, Bf16Of(run.a.w))
      .Tensor("model.b.weight", DType::kBF16, {120, 200}, Bf16Of(run.b.w))
      .Tensor("optimizer.fp32_master.0", DType::kF32, {120, 200}, F32Bytes(run.b.w))
      .Tensor("optimizer.fp32_master.1", DType::kF32, {120, 200}, F32Bytes(run.a.w))
      .Tensor("optimizer.state.0.exp_avg", DType::kF32, {120, 200}, F32Bytes(run.b.m))
      .Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(run.b.v))
      .Tensor("optimizer.state.1.exp_avg", DType::kF32, {120, 200}, F32Bytes(run.a.m))
      .Tensor("optimizer.state.1.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(run.a.v))
      .Verbatim(RandomBytes(24, 2));
  return f;
}

TEST(MasterCopies, PairsByValuesNotByOrderOrName) {
  AdamRun run;
  FileBuilder f = MixedFile(run);
  const size_t n = f.layout.tensors.size();
  std::vector<bool> eligible(n, true), excluded(n, false);
  std::vector<int32_t> master_of = FindMasterCopies(f.layout, f.bytes, eligible, excluded);
  EXPECT_EQ(master_of[0], 3);  // model.a.weight <- fp32_master.1
  EXPECT_EQ(master_of[1], 2);  // model.b.weight <- fp32_master.0
  for (size_t t = 2; t < n; ++t) EXPECT_EQ(master_of[t], -1) << t;
  // Not eligible (coded losslessly): no copy.
  eligible[0] = false;
  EXPECT_EQ(FindMasterCopies(f.layout, f.bytes, eligible, excluded)[0], -1);
  // Without its master (another run's values of the same size): no copy.
  AdamRun other;
  other.Steps(3);
  FileBuilder g;
  g.Tensor("model.a.weight", DType::kBF16, {120, 200}, Bf16Of(run.a.w))
      .Tensor("optimizer.fp32_master.0", DType::kF32, {120, 200}, F32Bytes(other.a.w));
  EXPECT_EQ(FindMasterCopies(g.layout, g.bytes, {true, true}, {false, false})[0], -1);
  // A master serves one copy only: two identical bf16 tensors, one master.
  FileBuilder h;
  h.Tensor("model.a.weight", DType::kBF16, {120, 200}, Bf16Of(run.a.w))
      .Tensor("model.tied.weight", DType::kBF16, {120, 200}, Bf16Of(run.a.w))
      .Tensor("optimizer.fp32_master.0", DType::kF32, {120, 200}, F32Bytes(run.a.w));
  const std::vector<int32_t> one = FindMasterCopies(h.layout, h.bytes, {true, true, true}, {false, false, false});
  EXPECT_EQ(one[0], 2);
  EXPECT_EQ(one[1], -1);
}

TEST(MasterCopies, CopyParamsRoundTripAndRejectOtherInputs) {
  LossyChunkParams p = DeltaParams();
  StepPrediction s;
  s.predictor = {0.0, 1.0, 0.0, 1e-8};
  s.has_step = s.copy = true;
  s.m_offset = 64;
  p.prediction = s;
  std::vector<std::byte> bytes = EncodeParams(p);
  EXPECT_EQ(static_cast<uint8_t>(bytes[73]), 4 | 8);
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->prediction->copy);
  EXPECT_EQ(back->prediction->m_offset, 64u);
  auto rejects = [&](const char* what, const std::function<void(std::vector<std::byte>&)>& edit) {
    std::vector<std::byte> b = bytes;
    edit(b);
    EXPECT_FALSE(LossyChunkParams::DecodeFrom(b).ok()) << what;
  };
  rejects("copy without the step term", [](auto& b) { b[73] = std::byte{8}; StoreLE64(b.data() + 80, 0); StoreLE64(b.data() + 112, 0); });
  rejects("copy with v", [](auto& b) { b[73] = std::byte{4 | 8 | 1}; StoreLE64(b.data() + 88, 8); });
  rejects("copy with a scale", [](auto& b) { StoreLE64(b.data() + 136, std::bit_cast<uint64_t>(1.0)); });
  rejects("copy with a base step", [](auto& b) { b[73] = std::byte{4 | 8 | 2}; StoreLE64(b.data() + 96, 8); });
  rejects("copy with another step coefficient", [](auto& b) { StoreLE64(b.data() + 112, std::bit_cast<uint64_t>(0.5)); });
  rejects("copy of a bf16 master", [](auto& b) { b[72] = std::byte{3}; });
  rejects("unknown input bit", [](auto& b) { b[73] = std::byte{4 | 16}; });
}

struct CopyChain {
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  MapResolver resolver;
  uint64_t copy_bytes[3] = {};    // stored bytes of the bf16 weights per version
  uint64_t master_bytes[3] = {};  // of the fp32 masters
  uint32_t copy_chunks = 0;       // bf16 chunks coded as copies
  uint32_t bf16_chunks = 0;
  uint32_t predicted_masters[3] = {};  // master chunks step-predicted (a copy then reads a prediction)
};

// Three versions, 5 steps apart: each decodes whole, every bf16 weight
// within its budget of its own values. With `step_space`, Adam's first
// moments are coded in step space, as the mount does: a copy then reads
// a master that reads a first moment that reads a second moment.
void EncodeCopyChain(CopyChain* chain, bool step_space = false) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  EncodeOptions options = DefaultLossy(policy, true);
  options.momentum_step_space = step_space;
  AdamRun run;
  std::shared_ptr<const BlobReader> previous;
  for (int version = 0; version < 3; ++version) {
    if (version > 0) run.Steps(5);
    FileBuilder f = MixedFile(run);
    std::optional<std::vector<std::byte>> got =
        AppendVersion(f, options, version, &chain->resolver, &chain->ids, &previous, &chain->blobs);
    ASSERT_TRUE(got.has_value());
    for (int t : {0, 1}) {
      const Segment& seg = f.layout.segments[t + 1];
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < seg.length / 2; ++i) {
        uint16_t x, y;
        std::memcpy(&x, f.bytes.data() + seg.offset + 2 * i, 2);
        std::memcpy(&y, got->data() + seg.offset + 2 * i, 2);
        const double d = static_cast<double>(lossy::Bf16ToFloat(y)) - lossy::Bf16ToFloat(x);
        err2 += d * d;
        ref2 += static_cast<double>(lossy::Bf16ToFloat(x)) * lossy::Bf16ToFloat(x);
      }
      EXPECT_LE(std::sqrt(err2 / ref2), 1e-2 * (1 + 1e-9)) << "tensor " << t << " version " << version;
    }
    for (uint32_t c = 0; c < previous->chunks().size(); ++c) {
      const ChunkInfo& chunk = previous->chunks()[c];
      const int32_t t = previous->segments()[chunk.segment].tensor;
      if (t == 0 || t == 1) {
        chain->copy_bytes[version] += chunk.stored_length;
        ++chain->bf16_chunks;
        if (chunk.codec != ChunkCodec::kLossy) continue;
        Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(previous->chunk_params(c));
        ASSERT_TRUE(p.ok());
        if (!p->prediction || !p->prediction->copy) continue;
        ++chain->copy_chunks;
        // It reads its own master: a's from fp32_master.1 (tensor 3), b's from .0.
        const uint64_t element = (chunk.logical_offset - f.layout.segments[t + 1].offset) / 2;
        const Segment& master = f.layout.segments[(t == 0 ? 3 : 2) + 1];
        EXPECT_EQ(p->prediction->m_offset, master.offset + 4 * element);
      } else if (t == 2 || t == 3) {
        chain->master_bytes[version] += chunk.stored_length;
        if (chunk.codec != ChunkCodec::kLossy) continue;
        Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(previous->chunk_params(c));
        ASSERT_TRUE(p.ok());
        if (p->prediction && p->prediction->has_step) ++chain->predicted_masters[version];
      }
    }
  }
}

// Every bf16 chunk a copy, of a step-predicted master in the deltas, and
// small; the key frame reads no base; a cached read decodes the same.
void ExpectCopiesOfPredictedMasters(CopyChain& chain) {
  EXPECT_EQ(chain.copy_chunks, chain.bf16_chunks);
  // The deltas' masters are step-predicted themselves: the copies read
  // predictions (the one nesting FORMAT.md allows).
  EXPECT_GT(chain.predicted_masters[1], 0u);
  EXPECT_GT(chain.predicted_masters[2], 0u);
  for (int v = 0; v < 3; ++v) {
    // Coded alone, bf16 weights cost about as much as their fp32 masters
    // (the same budget); as copies a small fraction.
    EXPECT_LT(static_cast<double>(chain.copy_bytes[v]), 0.2 * static_cast<double>(chain.master_bytes[v]))
        << "version " << v << ": bf16 " << chain.copy_bytes[v] << " masters " << chain.master_bytes[v];
  }
  // The key frame reads no base even with copies in it.
  Result<std::shared_ptr<const BlobReader>> key = OpenBytes(chain.blobs[0]);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_FALSE((*key)->base().has_value());
  EXPECT_TRUE(DecodeAll(**key).ok());
  // The mount's path (a chunk cache, read from the start: each bf16 chunk
  // pulls its master, later in the file, into the cache) reads the same.
  ExpectCachedReadOfNewest(&chain.resolver, chain.ids, chain.blobs);
}

TEST(MasterCopies, Bf16WeightsCostLittleNextToTheirMastersInKeyAndDeltaFrames) {
  for (bool step_space : {false, true}) {
    SCOPED_TRACE(step_space ? "first moments in step space" : "first moments as they are");
    CopyChain chain;
    EncodeCopyChain(&chain, step_space);
    ExpectCopiesOfPredictedMasters(chain);
  }
}

TEST(MasterCopies, OpenRejectsCopiesThatReadCopiesOrABase) {
  CopyChain chain;
  EncodeCopyChain(&chain);
  auto open = [&](std::vector<std::byte> bytes) { return OpenBytes(std::move(bytes), std::nullopt, &chain.resolver); };
  auto is_copy = [](const LossyChunkParams& p) { return p.prediction && p.prediction->copy; };
  ASSERT_TRUE(open(chain.blobs.back()).ok());
  // Its m range over a copy (here itself): a cycle.
  Result<std::shared_ptr<const BlobReader>> r =
      open(EditFirstLossyParams(chain.blobs.back(), is_copy, [](LossyChunkParams& p, const BlobIndex& index, size_t c) {
        p.prediction->m_offset = index.chunks[c].logical_offset;
      }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("covers a copy-predicted chunk"), std::string::npos) << r.status().ToString();
  // A copy with a base offset: it reads no base.
  r = open(RewriteBlob(chain.blobs.back(), [&](BlobIndex& index, std::vector<std::vector<std::byte>>&) {
    for (size_t c = 0; c < index.chunks.size(); ++c) {
      if (index.chunks[c].codec != ChunkCodec::kLossy) continue;
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(index.params[c]);
      if (p.ok() && is_copy(*p)) {
        index.base_offsets[c] = 64;
        return;
      }
    }
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("copy prediction"), std::string::npos) << r.status().ToString();
  // A master's step range over a copy: the copy reads that master, a cycle.
  r = open(EditFirstLossyParams(
      chain.blobs.back(), [](const LossyChunkParams& p) { return p.prediction && p.prediction->has_step && !p.prediction->copy; },
      [&](LossyChunkParams& p, const BlobIndex& index, size_t) {
        for (size_t c = 0; c < index.chunks.size(); ++c) {
          Result<LossyChunkParams> q = LossyChunkParams::DecodeFrom(index.params[c]);
          if (q.ok() && is_copy(*q)) {
            p.prediction->m_offset = index.chunks[c].logical_offset;
            return;
          }
        }
      }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("covers a step-predicted chunk"), std::string::npos) << r.status().ToString();
  // A copy on an f32 tensor (here a master's chunk): copies are bf16 or f16.
  r = open(EditFirstLossyParams(
      chain.blobs.back(), [](const LossyChunkParams& p) { return p.prediction && p.prediction->has_step && !p.prediction->copy; },
      [](LossyChunkParams& p, const BlobIndex&, size_t) {
        p.prediction->copy = true;
        p.prediction->has_v = p.prediction->has_base_step = false;
        p.prediction->v_offset = p.prediction->m_base_offset = p.prediction->v_base_offset = 0;
        p.prediction->predictor = {0.0, 1.0, 0.0, 1e-8};
      }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("want bf16 or f16"), std::string::npos) << r.status().ToString();
  // Another range of its master (120 elements on): other bytes, which the
  // decoded checksum rejects.
  r = open(EditFirstLossyParams(chain.blobs.back(), is_copy, [](LossyChunkParams& p, const BlobIndex&, size_t) {
    p.prediction->m_offset += 4 * 120;
  }));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<std::vector<std::byte>> decoded = DecodeAll(**r);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kChecksumMismatch) << decoded.status().ToString();
}

}  // namespace
}  // namespace ckptfs
