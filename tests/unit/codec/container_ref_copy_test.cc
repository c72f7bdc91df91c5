// Ref copies (codec/optimizer/ref_copies.h, FORMAT.md "Step prediction",
// inputs bit `ref`, and "Index header", the ref): f32 weights that an
// earlier file of the same save holds too (DeepSpeed's flat partitions of
// the model file's weights) coded against that file's blob. Matching by
// sampled values, whole chains within budget and small, and hostile blobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <vector>

// GCC says it builds with ASan by __SANITIZE_ADDRESS__, clang by
// __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define CKPTFS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPTFS_TEST_ASAN 1
#endif
#endif
#if defined(CKPTFS_TEST_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/optimizer/ref_copies.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

constexpr size_t kRows = 400, kCols = 500;  // 200k elements a matrix
constexpr size_t kN = kRows * kCols;

std::vector<float> FloatsOf(const std::vector<std::byte>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// A model whose weights drift by small steps between saves.
struct Model {
  std::vector<float> l1 = FloatsOf(NormalF32(kN, 1)), l2 = FloatsOf(NormalF32(kN, 2));
  std::vector<float> bias = FloatsOf(NormalF32(500, 3));
  std::vector<float> m = FloatsOf(NormalF32(2 * kN, 4, 1e-3f)), v = FloatsOf(NormalF32(2 * kN, 5, 1e-3f));
  void Step(uint32_t seed) {
    const std::vector<float> d = FloatsOf(NormalF32(2 * kN, seed, 2e-4f));
    for (size_t i = 0; i < kN; ++i) l1[i] += d[i], l2[i] += d[kN + i];
    for (size_t i = 0; i < 2 * kN; ++i) m[i] = 0.9f * m[i] + d[i], v[i] = 0.999f * v[i] + d[i] * d[i];
  }
};

// DeepSpeed's model file: the module's weights, each storage behind a
// header of its own (as in a torch zip).
FileBuilder ModelFile(const Model& model) {
  FileBuilder f;
  f.Verbatim(RandomBytes(64, 1))
      .Tensor("module.l1.weight", DType::kF32, {kRows, kCols}, F32Bytes(model.l1))
      .Verbatim(RandomBytes(64, 5))
      .Tensor("module.l2.weight", DType::kF32, {kRows, kCols}, F32Bytes(model.l2))
      .Tensor("module.l2.bias", DType::kF32, {500}, F32Bytes(model.bias))
      .Verbatim(RandomBytes(32, 2));
  return f;
}

// A rank's optimizer file: its flat fp32 partition of the weights (the
// second half of l1, then l2) with Adam's state of the same elements.
FileBuilder OptimizerFile(const Model& model) {
  std::vector<float> flat(model.l1.begin() + kN / 2, model.l1.end());
  flat.insert(flat.end(), model.l2.begin(), model.l2.end());
  const std::vector<float> m(model.m.begin() + kN / 2, model.m.end()), v(model.v.begin() + kN / 2, model.v.end());
  FileBuilder f;
  f.Verbatim(RandomBytes(48, 3))
      .Tensor("optimizer_state_dict.base_optimizer_state.0.exp_avg", DType::kF32, {flat.size()}, F32Bytes(m))
      .Tensor("optimizer_state_dict.base_optimizer_state.0.exp_avg_sq", DType::kF32, {flat.size()}, F32Bytes(v))
      .Tensor("optimizer_state_dict.single_partition_of_fp32_groups.0", DType::kF32, {flat.size()}, F32Bytes(flat))
      .Verbatim(RandomBytes(16, 4));
  return f;
}

EncodeOptions Options(const policy::Policy& policy) {
  EncodeOptions options = DefaultLossy(policy, true);
  options.chunk_bytes = 256 << 10;  // 64k elements: about 32 sampled values a chunk
  return options;
}

double RelL2(ByteSpan want, ByteSpan got) {
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size() / 4; ++i) {
    const double d = static_cast<double>(F32At(got, i)) - F32At(want, i);
    err2 += d * d;
    ref2 += static_cast<double>(F32At(want, i)) * F32At(want, i);
  }
  return std::sqrt(err2 / ref2);
}

TEST(RefCopies, SampleKeepsValuesOfLargeF32TensorsOnce) {
  Model model;
  FileBuilder f = ModelFile(model);
  const ValueSample sample = SampleValues(f.layout, f.bytes);
  // Two matrices of 200k elements, one in 2048 sampled; the bias is too small.
  EXPECT_EQ(sample.extents.size(), 2u);
  EXPECT_GT(sample.entries.size(), 2 * kN / kValueSampleRate / 2);
  EXPECT_LT(sample.entries.size(), 2 * kN / kValueSampleRate * 2);
  for (const auto& [bits, offset] : sample.entries) {
    uint32_t here;
    std::memcpy(&here, f.bytes.data() + offset, 4);
    EXPECT_EQ(here, bits);
    EXPECT_TRUE(IsSampledValue(bits));
  }
  // An optimizer's state is never another file's weights: not sampled.
  FileBuilder opt = OptimizerFile(model);
  const ValueSample flat_only = SampleValues(opt.layout, opt.bytes);
  ASSERT_EQ(flat_only.extents.size(), 1u);
  EXPECT_EQ(flat_only.extents[0].first, opt.layout.segments[3].offset);
  // A value held twice says nothing about where a range lies: dropped.
  FileBuilder twice;
  twice.Tensor("a", DType::kF32, {kN}, F32Bytes(model.l1)).Tensor("b", DType::kF32, {kN}, F32Bytes(model.l1));
  EXPECT_TRUE(SampleValues(twice.layout, twice.bytes).entries.empty());
}

// The vector scan finds exactly the values the scalar test samples, at
// every rate, across the ends of 32-element blocks, and stops when asked.
TEST(RefCopies, SampledScanIsTheScalarTest) {
  std::mt19937 rng(5);
  std::vector<uint32_t> words(4096 + 17);
  for (auto& w : words) w = rng();
  // Sampled words at the base rate, zeros of either sign (never sampled),
  // and the words a multiply could confuse with them.
  uint32_t found = 0;
  for (uint32_t w = 1; found < 64; ++w)
    if (IsSampledValue(w)) words[(found++ * 61) % words.size()] = w;
  for (size_t i = 0; i < words.size(); i += 97) words[i] = 0;
  for (size_t i = 50; i < words.size(); i += 101) words[i] = 0x80000000u;
  const auto* data = reinterpret_cast<const std::byte*>(words.data());
  for (uint32_t shift = 1; shift <= 31; ++shift) {
    SCOPED_TRACE(shift);
    for (size_t at = 0; at + 32 <= words.size(); at += 29) {
      uint32_t want = 0;
      for (uint32_t j = 0; j < 32; ++j) want |= static_cast<uint32_t>(IsSampledValue(words[at + j], shift)) << j;
      ASSERT_EQ(SampledMask32(data + 4 * at, shift, SimdLevel::kScalar), want);
      ASSERT_EQ(SampledMask32(data + 4 * at, shift, SimdLevel::kAvx2), want);
    }
    for (const uint64_t n : {uint64_t{0}, uint64_t{31}, uint64_t{32}, uint64_t{33}, uint64_t{words.size()}}) {
      std::vector<std::pair<uint64_t, uint32_t>> want, have;
      for (uint64_t i = 0; i < n; ++i)
        if (IsSampledValue(words[i], shift)) want.emplace_back(i, words[i]);
      ScanSampledValues(data, n, shift, [&](uint64_t i, uint32_t bits) {
        have.emplace_back(i, bits);
        return true;
      });
      ASSERT_EQ(have, want);
      if (want.size() < 2) continue;
      have.clear();
      ScanSampledValues(data, n, shift, [&](uint64_t i, uint32_t bits) {
        have.emplace_back(i, bits);
        return have.size() < 2;
      });
      const std::vector<std::pair<uint64_t, uint32_t>> first_two(want.begin(), want.begin() + 2);
      ASSERT_EQ(have, first_two);
    }
  }
  EXPECT_GT(found, 0u);
}

struct RefChain {
  MapResolver resolver;
  std::vector<std::vector<std::byte>> blobs;  // model 0, optimizer 0, model 1, optimizer 1
  std::vector<ObjectId> ids;
  std::vector<FileBuilder> files;
  std::vector<EncodeStats> stats;
};

// Two saves of a model file and an optimizer file, each version a delta
// frame of its own file's previous one; the optimizer files get the model
// file of their save as a ref candidate when `refs`.
void EncodeSaves(RefChain* chain, bool refs) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = Options(policy);
  Model model;
  for (int save = 0; save < 2; ++save) {
    if (save > 0) model.Step(10 + save);
    for (int kind = 0; kind < 2; ++kind) {
      FileBuilder f = kind == 0 ? ModelFile(model) : OptimizerFile(model);
      BaseRef base;
      if (save > 0) {
        base.id = chain->ids[chain->ids.size() - 2];
        base.reader = *chain->resolver.OpenBlob(base.id);
      }
      std::vector<RefCandidate> candidates;
      if (kind == 1 && refs) {
        const FileBuilder& m = chain->files.back();
        candidates.push_back(RefCandidate{chain->ids.back(), *chain->resolver.OpenBlob(chain->ids.back()),
                                          std::make_shared<ValueSample>(SampleValues(m.layout, m.bytes))});
      }
      VectorSink sink;
      Result<EncodeStats> stats =
          EncodeBlob(f.bytes, f.layout, save > 0 ? &base : nullptr, &candidates, options, &sink);
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      chain->stats.push_back(*stats);
      chain->blobs.push_back(sink.bytes);
      chain->ids.push_back(chain->resolver.Add(sink.bytes));
      chain->files.push_back(std::move(f));
    }
  }
}

// Stored bytes of tensor `t`'s chunks in `reader`.
uint64_t TensorBytes(const BlobReader& reader, int32_t t) {
  uint64_t bytes = 0;
  for (const ChunkInfo& c : reader.chunks())
    if (reader.segments()[c.segment].tensor == t) bytes += c.stored_length;
  return bytes;
}

TEST(RefCopies, FlatPartitionsAreCodedAgainstTheModelFileWithinBudget) {
  RefChain with, without;
  EncodeSaves(&with, true);
  EncodeSaves(&without, false);
  constexpr int32_t kFlat = 2;
  for (int save = 0; save < 2; ++save) {
    SCOPED_TRACE(save == 0 ? "key frames" : "delta frames");
    const size_t o = 2 * save + 1;
    Result<std::shared_ptr<const BlobReader>> reader = with.resolver.OpenBlob(with.ids[o]);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    // The optimizer file names its save's model file as its ref; the delta
    // frame its own previous version as its base too.
    ASSERT_TRUE((*reader)->ref().has_value());
    EXPECT_EQ(*(*reader)->ref(), with.ids[o - 1]);
    EXPECT_EQ((*reader)->base().has_value(), save > 0);
    EXPECT_EQ(with.stats[o].ref, with.ids[o - 1]);
    // Every chunk of the flat weights is a ref copy of the right range (a
    // chunk is cut where l1's values end and l2's begin).
    const FileBuilder& model = with.files[o - 1];
    const FileBuilder& opt = with.files[o];
    const uint64_t flat_at = opt.layout.segments[3].offset;
    uint32_t copies = 0, flat_chunks = 0;
    for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) {
      const ChunkInfo& chunk = (*reader)->chunks()[c];
      if ((*reader)->segments()[chunk.segment].tensor != kFlat) continue;
      ++flat_chunks;
      const uint64_t first = (chunk.logical_offset - flat_at) / 4, last = first + chunk.logical_length / 4;
      EXPECT_TRUE(last <= kN / 2 || first >= kN / 2) << "chunk " << c << " across l1's end";
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom((*reader)->chunk_params(c));
      ASSERT_TRUE(p.ok());
      EXPECT_TRUE(p->ref_copy()) << "chunk " << c;
      if (!p->ref_copy()) continue;
      ++copies;
      const uint64_t want = first < kN / 2 ? model.layout.segments[1].offset + 4 * (kN / 2 + first)
                                           : model.layout.segments[3].offset + 4 * (first - kN / 2);
      EXPECT_EQ(p->prediction->m_offset, want) << "chunk " << c;
    }
    EXPECT_EQ(copies, flat_chunks);
    EXPECT_EQ(with.stats[o].ref_chunks, copies);
    // Within its budget of its own values, and a small part of what the
    // flat weights cost coded alone (key frame) or step-predicted (delta).
    Result<std::vector<std::byte>> got = DecodeAll(**reader);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const Segment& flat = opt.layout.segments[3];
    EXPECT_LE(RelL2(ByteSpan(opt.bytes).subspan(flat.offset, flat.length),
                    ByteSpan(*got).subspan(flat.offset, flat.length)),
              1e-2 * (1 + 1e-9));
    Result<std::shared_ptr<const BlobReader>> alone = without.resolver.OpenBlob(without.ids[o]);
    ASSERT_TRUE(alone.ok());
    EXPECT_FALSE((*alone)->ref().has_value());
    EXPECT_LT(static_cast<double>(TensorBytes(**reader, kFlat)), 0.25 * static_cast<double>(TensorBytes(**alone, kFlat)))
        << "with refs " << TensorBytes(**reader, kFlat) << " without " << TensorBytes(**alone, kFlat);
    // The mount's path reads the same.
    ExpectCachedReadEquals(with.blobs[o], with.ids[o], &with.resolver, *got);
  }
}

TEST(RefCopies, RunsEndWhereTheModelsTensorsEndAndAnotherRunsValuesAreNoRef) {
  Model model;
  Model unrelated;  // another run: other values
  for (float& x : unrelated.l1) x *= 1.5f;
  for (float& x : unrelated.l2) x *= 1.5f;
  FileBuilder other = ModelFile(unrelated);
  FileBuilder own = ModelFile(model);
  FileBuilder opt = OptimizerFile(model);
  auto candidate = [](const FileBuilder& f) {
    return RefCandidate{ObjectId{}, nullptr, std::make_shared<ValueSample>(SampleValues(f.layout, f.bytes))};
  };
  const std::vector<bool> flat_only{false, false, true};
  EXPECT_EQ(FindRefRuns(opt.layout, opt.bytes, flat_only, {candidate(other)}).candidate, -1);
  // The model's own values: two runs, the second half of l1 and all of l2,
  // found among other candidates.
  const RefRuns runs = FindRefRuns(opt.layout, opt.bytes, flat_only, {candidate(other), candidate(own)});
  EXPECT_EQ(runs.candidate, 1);
  ASSERT_EQ(runs.runs.size(), 2u);
  const uint64_t flat_at = opt.layout.segments[3].offset;
  EXPECT_EQ(runs.runs[0].offset, flat_at);
  EXPECT_EQ(runs.runs[0].length, 4 * kN / 2);
  EXPECT_EQ(runs.runs[0].ref_offset, own.layout.segments[1].offset + 4 * kN / 2);
  EXPECT_EQ(runs.runs[1].offset, flat_at + 4 * kN / 2);
  EXPECT_EQ(runs.runs[1].length, 4 * kN);
  EXPECT_EQ(runs.runs[1].ref_offset, own.layout.segments[3].offset);
  // Not where a tensor is not eligible (Adam's state is never a ref copy).
  EXPECT_EQ(FindRefRuns(opt.layout, opt.bytes, {true, true, false}, {candidate(own)}).candidate, -1);
}

TEST(RefCopies, ParamsRoundTripAndRefNeedsCopy) {
  LossyChunkParams p = DeltaParams();
  StepPrediction s;
  s.predictor = {0.0, 1.0, 0.0, 1e-8};
  s.has_step = s.copy = s.ref = true;
  s.m_offset = 4096;
  p.prediction = s;
  std::vector<std::byte> bytes = EncodeParams(p);
  EXPECT_EQ(static_cast<uint8_t>(bytes[73]), 4 | 8 | 16);
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->ref_copy());
  EXPECT_FALSE(back->reads_base());
  bytes[73] = std::byte{4 | 16};
  EXPECT_FALSE(LossyChunkParams::DecodeFrom(bytes).ok());
}

TEST(RefCopies, HostileRefsAreRejectedOrFailTheRead) {
  RefChain chain;
  EncodeSaves(&chain, true);
  const std::vector<std::byte>& blob = chain.blobs[1];
  const ObjectId model_id = chain.ids[0];
  auto is_ref = [](const LossyChunkParams& p) { return p.ref_copy(); };
  // Without its ref in the index: rejected at Open.
  Result<std::shared_ptr<const BlobReader>> r =
      OpenBytes(RewriteBlob(blob, [](BlobIndex& index, auto&) { index.header.ref.reset(); }), std::nullopt,
                &chain.resolver);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ref copy in a blob without a ref"), std::string::npos) << r.status().ToString();
  // Naming itself as its ref.
  const ObjectId self = chain.ids[1];
  r = OpenBytes(blob, self, &chain.resolver);
  ASSERT_TRUE(r.ok());
  r = OpenBytes(RewriteBlob(blob, [&](BlobIndex& index, auto&) { index.header.ref = self; }), self, &chain.resolver);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("names itself as its ref"), std::string::npos) << r.status().ToString();
  // The ref missing from the store: the read fails naming it.
  MapResolver empty;
  r = OpenBytes(blob, std::nullopt, &empty);
  ASSERT_TRUE(r.ok());
  Result<std::vector<std::byte>> read = DecodeAll(**r);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().ToString().find(model_id.Hex()), std::string::npos) << read.status().ToString();
  // A range past the ref's size: Corruption, not a read out of bounds.
  r = OpenBytes(EditFirstLossyParams(blob, is_ref,
                                     [](LossyChunkParams& p, const BlobIndex&, size_t) {
                                       p.prediction->m_offset = uint64_t{1} << 40;
                                     }),
                std::nullopt, &chain.resolver);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  read = DecodeAll(**r);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().ToString().find("past the ref's size"), std::string::npos) << read.status().ToString();
  // Another range of the ref: the chunk's checksum catches it.
  r = OpenBytes(EditFirstLossyParams(blob, is_ref,
                                     [](LossyChunkParams& p, const BlobIndex&, size_t) { p.prediction->m_offset += 4; }),
                std::nullopt, &chain.resolver);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  read = DecodeAll(**r);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kChecksumMismatch) << read.status().ToString();
}

// Resolves ids to blobs held in memory, one cached reader per id sharing
// one chunk cache (the store's way): a chunk decoded by two reads is
// decoded once, and a read waits for another's decode of the same chunk.
class CachingResolver final : public BlobResolver {
 public:
  void AddAs(const ObjectId& id, std::vector<std::byte> blob) { blobs_[id] = std::move(blob); }
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = readers_.find(id); it != readers_.end()) return it->second;
    auto it = blobs_.find(id);
    if (it == blobs_.end()) return Status::NotFound("no blob " + id.Hex());
    ASSIGN_OR_RETURN(auto reader, BlobReader::Open(std::make_shared<MemoryFile>(it->second), id, this, &cache_));
    readers_[id] = reader;
    return reader;
  }

 private:
  std::mutex mu_;
  ChunkCache cache_{64 << 20};
  std::map<ObjectId, std::vector<std::byte>> blobs_;
  std::map<ObjectId, std::shared_ptr<const BlobReader>> readers_;
};

TEST(RefCopies, LinksThatLoopOrChainFailInsteadOfHanging) {
  RefChain chain;
  EncodeSaves(&chain, true);
  // A ref whose range covers a predicted chunk there (here the next
  // optimizer file under the model file's name: its flat weights are ref
  // copies): refs do not chain.
  {
    CachingResolver resolver;
    resolver.AddAs(chain.ids[1], chain.blobs[1]);
    resolver.AddAs(chain.ids[0], chain.blobs[3]);
    resolver.AddAs(chain.ids[2], chain.blobs[2]);
    Result<std::shared_ptr<const BlobReader>> r = resolver.OpenBlob(chain.ids[1]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto is_ref = [](const LossyChunkParams& p) { return p.ref_copy(); };
    const std::vector<std::byte> edited =
        EditFirstLossyParams(chain.blobs[1], is_ref, [&](LossyChunkParams& p, const BlobIndex& index, size_t c) {
          p.prediction->m_offset = index.chunks[c].logical_offset;  // the chunk itself, in the "ref"
        });
    r = OpenBytes(edited, std::nullopt, &resolver);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Result<std::vector<std::byte>> read = DecodeAll(**r);
    ASSERT_FALSE(read.ok());
    EXPECT_NE(read.status().ToString().find("covers a predicted chunk of the ref"), std::string::npos)
        << read.status().ToString();
  }
  // A cycle of bases between cached readers (objects stored under names
  // that are not theirs): the model file's second version deltas on an
  // object that is itself with its base named back. Its decode reaches its
  // own chunk again and fails: it does not wait for itself.
  {
#if defined(CKPTFS_TEST_ASAN)
    // The two readers hold each other as bases (the loop): never freed,
    // as in such a store.
    __lsan::ScopedDisabler loop_readers_are_never_freed;
#endif
    CachingResolver resolver;
    const ObjectId a = chain.ids[2], b = chain.ids[0];
    resolver.AddAs(a, chain.blobs[2]);  // base b
    resolver.AddAs(b, RewriteBlob(chain.blobs[2], [&](BlobIndex& index, auto&) { index.header.base = a; }));
    Result<std::shared_ptr<const BlobReader>> r = resolver.OpenBlob(a);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::byte> out((*r)->logical_size());
    const Status read = (*r)->ReadAt(0, out);
    ASSERT_FALSE(read.ok());
    EXPECT_NE(read.ToString().find("(a cycle)"), std::string::npos) << read.ToString();
  }
}

}  // namespace
}  // namespace ckptfs
