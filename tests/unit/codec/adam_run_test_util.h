// A small Adam run (two weight matrices and a bias with their exp_avg and
// exp_avg_sq, per-element gradient scales over several octaves) written as
// a torch-like checkpoint, for the container tests of step prediction and
// step space.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "blob_test_util.h"
#include "codec/container/blob.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/schedule.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs::testing {

// Element i of a little-endian f32 span.
inline float F32At(ByteSpan bytes, size_t i) {
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

// Parameters of a quantized delta-frame chunk with made-up error sums.
inline LossyChunkParams DeltaParams() {
  LossyChunkParams p;
  p.flags = LossyChunkParams::kFlagDelta;
  p.bits = 3;
  p.mode = 1;
  p.err2_sum = 1.0;
  p.ref2_sum = 4.0;
  return p;
}

// The bytes of a lossy chunk's parameters area.
inline std::vector<std::byte> EncodeParams(const LossyChunkParams& p) {
  std::vector<std::byte> bytes;
  ByteWriter w(&bytes);
  p.EncodeTo(w);
  return bytes;
}

struct AdamRun {
  static constexpr size_t kN = 24000;
  static constexpr size_t kBias = 300;
  std::mt19937 rng{7};
  std::normal_distribution<float> normal{0.0f, 1.0f};
  struct Param {
    std::vector<float> w, m, v, scale;
  };
  Param a, b, bias;
  int t = 0;

  AdamRun() {
    for (Param* p : {&a, &b, &bias}) {
      const size_t n = p == &bias ? kBias : kN;
      p->w.resize(n);
      p->m.assign(n, 0.0f);
      p->v.assign(n, 0.0f);
      p->scale.resize(n);
      for (size_t i = 0; i < n; ++i) {
        p->w[i] = 0.05f * normal(rng);
        p->scale[i] = std::exp(normal(rng));
      }
    }
    Steps(30);
  }
  void Steps(int k) {
    for (int s = 0; s < k; ++s) {
      ++t;
      for (Param* p : {&a, &b, &bias})
        for (size_t i = 0; i < p->w.size(); ++i) {
          const float g = p->scale[i] * (0.5f * p->w[i] + 0.2f * normal(rng));
          p->m[i] = 0.9f * p->m[i] + 0.1f * g;
          p->v[i] = 0.999f * p->v[i] + 0.001f * g * g;
          p->w[i] -= 1e-3f * p->m[i] / (std::sqrt(p->v[i]) + 1e-8f);
        }
    }
  }
  FileBuilder File() const {
    FileBuilder f;
    f.Verbatim(RandomBytes(40, 1))
        .Tensor("model.a.weight", DType::kF32, {120, 200}, F32Bytes(a.w))
        .Tensor("model.b.weight", DType::kF32, {120, 200}, F32Bytes(b.w))
        .Tensor("model.bias", DType::kF32, {kBias}, F32Bytes(bias.w))
        .Tensor("optimizer.state.0.exp_avg", DType::kF32, {120, 200}, F32Bytes(b.m))
        .Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(b.v))
        .Tensor("optimizer.state.1.exp_avg", DType::kF32, {120, 200}, F32Bytes(a.m))
        .Tensor("optimizer.state.1.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(a.v))
        .Tensor("optimizer.state.2.exp_avg", DType::kF32, {kBias}, F32Bytes(bias.m))
        .Tensor("optimizer.state.2.exp_avg_sq", DType::kF32, {kBias}, F32Bytes(bias.v))
        .Verbatim(RandomBytes(24, 2));
    return f;
  }
};

inline EncodeOptions DefaultLossy(const policy::Policy& policy, bool predict) {
  EncodeOptions options;
  options.chunk_bytes = 32 << 10;  // several chunks per tensor
  options.lossy_budget = [&policy](FileFormat, const TensorInfo& t) {
    return policy.BudgetFor("ckpt.pt", FileFormat::kTorchZip, t);
  };
  options.budget_schedule = *lossy::ParseBudgetSchedule("dsq");
  options.step_prediction = predict;
  return options;
}

// Rewrites the parameters of the first lossy chunk of `blob` that `pick`
// accepts (a test failure when none does).
inline std::vector<std::byte> EditFirstLossyParams(
    const std::vector<std::byte>& blob, const std::function<bool(const LossyChunkParams&)>& pick,
    const std::function<void(LossyChunkParams&, const BlobIndex&, size_t)>& edit) {
  return RewriteBlob(blob, [&](BlobIndex& index, std::vector<std::vector<std::byte>>&) {
    for (size_t c = 0; c < index.chunks.size(); ++c) {
      if (index.chunks[c].codec != ChunkCodec::kLossy) continue;
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(index.params[c]);
      if (!p.ok() || !pick(*p)) continue;
      edit(*p, index, c);
      index.params[c].clear();
      ByteWriter w(&index.params[c]);
      p->EncodeTo(w);
      return;
    }
    ADD_FAILURE() << "no chunk to edit";
  });
}

// The blob `bytes` opened through a chunk cache and read from the start
// piece by piece, `step` bytes at a time (the mount's path: each chunk that
// reads other ranges of the file pulls them into the cache first); checks
// every chunk too. Compares with `want`.
inline void ExpectCachedReadEquals(const std::vector<std::byte>& bytes, const ObjectId& id, MapResolver* resolver,
                                   const std::vector<std::byte>& want, uint64_t step = 10000) {
  ChunkCache cache(64 << 20);
  Result<std::shared_ptr<const BlobReader>> cached = OpenBytes(bytes, id, resolver, &cache);
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  std::vector<std::byte> got;
  for (uint64_t at = 0; at < (*cached)->logical_size(); at += step) {
    std::vector<BlobReader::Piece> pieces;
    ASSERT_TRUE((*cached)->ReadPieces(at, std::min<uint64_t>(step, (*cached)->logical_size() - at), &pieces).ok());
    for (const BlobReader::Piece& p : pieces) got.insert(got.end(), p.data.begin(), p.data.end());
  }
  EXPECT_TRUE(got == want);
  for (uint32_t c = 0; c < (*cached)->chunks().size(); ++c) EXPECT_TRUE((*cached)->VerifyChunk(c).ok()) << c;
}

// The newest blob of a chain (`ids`, `blobs`) read through a chunk cache
// equals its plain whole-file decode.
inline void ExpectCachedReadOfNewest(MapResolver* resolver, const std::vector<ObjectId>& ids,
                                     const std::vector<std::vector<std::byte>>& blobs) {
  Result<std::shared_ptr<const BlobReader>> plain = resolver->OpenBlob(ids.back());
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  Result<std::vector<std::byte>> want = DecodeAll(**plain);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ExpectCachedReadEquals(blobs.back(), ids.back(), resolver, *want);
}

// Appends version `version` of a chain: encodes `f` against the newest blob
// (`*previous`, the last of `ids`; none for a key frame), adds it to
// `resolver` and `ids` (and `blobs`), opens it as the new `*previous` and
// decodes it whole (whole-file checksum). Its decoded bytes, or nothing
// after a failed expectation.
inline std::optional<std::vector<std::byte>> AppendVersion(const FileBuilder& f, const EncodeOptions& options,
                                                           int version, MapResolver* resolver,
                                                           std::vector<ObjectId>* ids,
                                                           std::shared_ptr<const BlobReader>* previous,
                                                           std::vector<std::vector<std::byte>>* blobs) {
  BaseRef base{ids->empty() ? ObjectId{} : ids->back(), *previous};
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, options, *previous ? &base : nullptr);
  if (blobs != nullptr) blobs->push_back(blob);
  const ObjectId id = resolver->Add(blob);
  ids->push_back(id);
  Result<std::shared_ptr<const BlobReader>> reader = resolver->OpenBlob(id);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return std::nullopt;
  *previous = *reader;
  Result<std::vector<std::byte>> got = DecodeAll(**reader);
  EXPECT_TRUE(got.ok()) << "version " << version << ": " << got.status().ToString();
  if (!got.ok()) return std::nullopt;
  return std::move(*got);
}

// Versions of an AdamRun five steps apart, encoded with the default lossy
// policy: a key frame, then step-predicted deltas (their weights read the
// optimizer state listed after them).
struct AdamChain {
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  std::vector<std::vector<std::byte>> decoded;  // each version's decoded bytes
  const std::vector<std::byte>& newest() const { return decoded.back(); }
};

inline void BuildAdamChain(AdamChain* chain, int versions = 3) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, /*predict=*/true);
  AdamRun run;
  std::shared_ptr<const BlobReader> previous;
  for (int version = 0; version < versions; ++version) {
    if (version > 0) run.Steps(5);
    auto got = AppendVersion(run.File(), options, version, &chain->resolver, &chain->ids, &previous, &chain->blobs);
    ASSERT_TRUE(got.has_value());
    chain->decoded.push_back(std::move(*got));
  }
}

}  // namespace ckptfs::testing
