// Delta frames: XOR against the base version through a resolver, chains,
// mismatched tensor sets, and the chain depth limit.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

using testing::Encode;
using testing::FileBuilder;
using testing::MapResolver;
using testing::OpenBytes;

// Perturbs every `stride`-th f32 element's low mantissa bits.
std::vector<std::byte> Perturb(std::vector<std::byte> w, size_t stride, uint8_t bits) {
  for (size_t i = 0; i < w.size() / 4; i += stride) w[4 * i] ^= std::byte{bits};
  return w;
}

FileBuilder Version(const std::vector<std::byte>& w1, const std::vector<std::byte>& w2, std::string_view tag) {
  FileBuilder f;
  f.Verbatim(AsBytes(tag))
      .Tensor("layer1.weight", DType::kF32, {w1.size() / 4}, w1)
      .Verbatim(AsBytes("--"))
      .Tensor("layer2.weight", DType::kF32, {w2.size() / 4}, w2);
  return f;
}

TEST(BlobDelta, ChainOfThreeRoundTripsThroughTheResolver) {
  const EncodeOptions options{3, 8192, 1};
  MapResolver resolver;
  std::vector<std::byte> w1 = testing::NormalF32(10000, 1), w2 = testing::NormalF32(6000, 2);
  std::vector<FileBuilder> versions;
  versions.push_back(Version(w1, w2, "v0"));
  std::optional<BaseRef> base;
  std::vector<ObjectId> ids;
  std::vector<size_t> sizes;
  for (int v = 0; v < 3; ++v) {
    if (v > 0) {
      w1 = Perturb(w1, 13, 3);  // training updates layer 1; layer 2 is frozen
      versions.push_back(Version(w1, w2, "v" + std::to_string(v)));
    }
    EncodeStats stats;
    std::vector<std::byte> blob =
        Encode(versions[v].bytes, versions[v].layout, options, base ? &*base : nullptr, &stats);
    sizes.push_back(blob.size());
    ObjectId id = resolver.Add(blob);
    ids.push_back(id);
    EXPECT_EQ(stats.uses_base, v > 0);
    if (v > 0) {
      EXPECT_EQ(stats.delta_chunks, stats.chunks - 2) << "every tensor chunk deltas";
    }
    auto reader = OpenBytes(blob, id, &resolver);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    if (v > 0) {
      ASSERT_TRUE((*reader)->base().has_value());
      EXPECT_EQ(*(*reader)->base(), ids[v - 1]);
    }
    if (v > 0) {
      // The frozen layer's chunks are all-zero residuals: constant planes.
      const SegmentInfo& frozen = (*reader)->segments()[3];
      for (uint32_t c = frozen.first_chunk; c < frozen.first_chunk + frozen.chunk_count; ++c) {
        EXPECT_EQ((*reader)->chunks()[c].codec, ChunkCodec::kBytePlaneXorZstd);
        EXPECT_LE((*reader)->chunks()[c].stored_length, 25u);
      }
    }
    base = BaseRef{id, *reader};
  }
  EXPECT_LT(sizes[2] * 4, sizes[0]) << "deltas of small updates are much smaller than the key frame";
  for (int v = 0; v < 3; ++v) {
    auto reader = resolver.OpenBlob(ids[v]);
    ASSERT_TRUE(reader.ok());
    auto all = DecodeAll(**reader);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_EQ(*all, versions[v].bytes) << "version " << v;
    // Streamed in pieces of one or more chunks, on threads (the chain's
    // bases decoded by several threads at once).
    for (unsigned threads : {1u, 2u, 3u}) {
      for (uint64_t piece : {uint64_t{1}, uint64_t{20000}, kDecodePieceBytes}) {
        VectorSink sink;
        Status s = DecodeToSink(**reader, &sink, threads, piece);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(sink.bytes, versions[v].bytes) << "version " << v << " threads " << threads << " piece " << piece;
      }
    }
    std::vector<std::byte> part(5000);
    ASSERT_TRUE((*reader)->ReadAt(1234, part).ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), versions[v].bytes.begin() + 1234));
  }
}

TEST(BlobDelta, BaseWithDifferentTensorsOnlyMatchesEqualOnes) {
  MapResolver resolver;
  std::vector<std::byte> w = testing::NormalF32(4000, 3);
  FileBuilder old_file;
  old_file.Tensor("kept", DType::kF32, {4000}, w)
      .Tensor("reshaped", DType::kF32, {10, 400}, w)
      .Tensor("retyped", DType::kF32, {4000}, w)
      .Tensor("dropped", DType::kF32, {4000}, w);
  std::vector<std::byte> old_blob = Encode(old_file.bytes, old_file.layout);
  ObjectId old_id = resolver.Add(old_blob);
  auto old_reader = OpenBytes(old_blob, old_id, &resolver);
  ASSERT_TRUE(old_reader.ok());

  FileBuilder new_file;
  new_file.Verbatim(AsBytes("a longer header moves every offset"))
      .Tensor("new", DType::kF32, {4000}, w)
      .Tensor("reshaped", DType::kF32, {400, 10}, w)
      .Tensor("retyped", DType::kBF16, {8000}, w)
      .Tensor("kept", DType::kF32, {4000}, Perturb(w, 5, 1));
  BaseRef base{old_id, *old_reader};
  EncodeStats stats;
  std::vector<std::byte> blob = Encode(new_file.bytes, new_file.layout, EncodeOptions{}, &base, &stats);
  EXPECT_EQ(stats.delta_chunks, 1u) << "only 'kept' matches by name, dtype and shape";
  auto reader = OpenBytes(blob, ObjectId::Of(blob), &resolver);
  ASSERT_TRUE(reader.ok());
  for (const ChunkInfo& c : (*reader)->chunks())
    EXPECT_EQ(c.codec == ChunkCodec::kBytePlaneXorZstd,
              (*reader)->segments()[c.segment].tensor == 3);
  EXPECT_EQ(*DecodeAll(**reader), new_file.bytes);
}

// A save of a model writes its pickle, an RNG state and integer buffers
// again each time, nearly or exactly as before: against the base they cost
// a few bytes (codec zstd-base), also when the pickle changed length.
TEST(BlobDelta, VerbatimAndIntegerChunksCodeAgainstTheBase) {
  MapResolver resolver;
  const std::vector<std::byte> w = testing::NormalF32(4000, 3);
  const std::vector<std::byte> rng = testing::RandomBytes(5056, 7);
  std::vector<std::byte> pickle = testing::RandomBytes(3000, 8);
  FileBuilder v0;
  v0.Verbatim(pickle).Tensor("w", DType::kF32, {4000}, w).Tensor("rng", DType::kU8, {5056}, rng)
      .Verbatim(AsBytes("end of the archive"));
  std::vector<std::byte> base_blob = Encode(v0.bytes, v0.layout);
  ObjectId base_id = resolver.Add(base_blob);
  BaseRef base{base_id, *OpenBytes(base_blob, base_id, &resolver)};

  std::vector<std::byte> next_pickle = pickle;
  next_pickle[100] ^= std::byte{1};                                   // a number changed
  next_pickle.insert(next_pickle.begin() + 2000, std::byte{0x4b});    // and grew by a byte
  FileBuilder v1;
  v1.Verbatim(next_pickle).Tensor("w", DType::kF32, {4000}, Perturb(w, 5, 1))
      .Tensor("rng", DType::kU8, {5056}, rng).Verbatim(AsBytes("end of the archive"));
  EncodeStats stats;
  std::vector<std::byte> blob = Encode(v1.bytes, v1.layout, EncodeOptions{}, &base, &stats);
  auto reader = OpenBytes(blob, ObjectId::Of(blob), &resolver);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const std::vector<ChunkInfo>& chunks = (*reader)->chunks();
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].codec, ChunkCodec::kZstdWithBase);
  EXPECT_LT(chunks[0].stored_length, 100u) << "3000 random bytes, two of them changed";
  EXPECT_EQ(chunks[2].codec, ChunkCodec::kZstdWithBase);
  EXPECT_LT(chunks[2].stored_length, 30u) << "an RNG state saved again";
  EXPECT_EQ(*DecodeAll(**reader), v1.bytes);
  EXPECT_LT(blob.size() * 3, base_blob.size());

  // A base whose verbatim segment is much shorter than the chunk gives it
  // none (its bytes would come from the base's tensors).
  FileBuilder v2;
  std::vector<std::byte> long_pickle = next_pickle;
  long_pickle.resize(12000, std::byte{0x11});
  v2.Verbatim(long_pickle).Tensor("w", DType::kF32, {4000}, w);
  blob = Encode(v2.bytes, v2.layout, EncodeOptions{}, &base, &stats);
  reader = OpenBytes(blob, ObjectId::Of(blob), &resolver);
  ASSERT_TRUE(reader.ok());
  EXPECT_NE((*reader)->chunks()[0].codec, ChunkCodec::kZstdWithBase);
  EXPECT_EQ(*DecodeAll(**reader), v2.bytes);
}

TEST(BlobDelta, UnrelatedBaseIsNotReferenced) {
  MapResolver resolver;
  FileBuilder a, b;
  a.Tensor("t", DType::kF32, {1000}, testing::NormalF32(1000, 4));
  b.Tensor("t", DType::kF32, {1000}, testing::NormalF32(1000, 5));
  std::vector<std::byte> blob_a = Encode(a.bytes, a.layout);
  ObjectId id_a = resolver.Add(blob_a);
  BaseRef base{id_a, *OpenBytes(blob_a, id_a)};
  EncodeStats stats;
  std::vector<std::byte> blob_b = Encode(b.bytes, b.layout, {}, &base, &stats);
  EXPECT_FALSE(stats.uses_base);
  EXPECT_FALSE((*OpenBytes(blob_b))->base().has_value());
}

TEST(BlobDelta, MissingResolverOrBaseIsNotFound) {
  MapResolver resolver;
  std::vector<std::byte> w = testing::NormalF32(2000, 6);
  FileBuilder v0 = Version(w, w, "a"), v1 = Version(Perturb(w, 7, 1), w, "b");
  std::vector<std::byte> base_blob = Encode(v0.bytes, v0.layout);
  ObjectId base_id = ObjectId::Of(base_blob);
  BaseRef base{base_id, *OpenBytes(base_blob, base_id)};
  std::vector<std::byte> blob = Encode(v1.bytes, v1.layout, {}, &base);
  auto no_resolver = OpenBytes(blob);
  ASSERT_TRUE(no_resolver.ok());
  EXPECT_EQ(DecodeAll(**no_resolver).status().code(), StatusCode::kNotFound);
  auto empty_resolver = OpenBytes(blob, std::nullopt, &resolver);
  EXPECT_EQ(DecodeAll(**empty_resolver).status().code(), StatusCode::kNotFound);
  resolver.AddAs(base_id, base_blob);
  EXPECT_EQ(*DecodeAll(**OpenBytes(blob, std::nullopt, &resolver)), v1.bytes);
}

TEST(BlobDelta, ChainDepthIsBoundedAndCyclesEndThere) {
  // v0 <- v1 <- v2: with max_chain_depth 1 reading v2 must fail, with 2 it works.
  MapResolver resolver;
  std::vector<std::byte> w = testing::NormalF32(3000, 7);
  std::optional<BaseRef> base;
  std::vector<std::byte> last;
  std::vector<FileBuilder> versions;
  for (int v = 0; v < 3; ++v) {
    w = Perturb(w, 11, 1);
    versions.push_back(Version(w, w, "x"));
    last = Encode(versions.back().bytes, versions.back().layout, {}, base ? &*base : nullptr);
    ObjectId id = resolver.Add(last);
    base = BaseRef{id, *OpenBytes(last, id, &resolver)};
  }
  for (uint32_t depth : {1u, 2u}) {
    resolver.limits.max_chain_depth = depth;
    DecodeLimits limits;
    limits.max_chain_depth = depth;
    auto reader = OpenBytes(last, std::nullopt, &resolver, nullptr, limits);
    ASSERT_TRUE(reader.ok());
    auto all = DecodeAll(**reader);
    if (depth == 1) {
      EXPECT_EQ(all.status().code(), StatusCode::kCorruption);
      EXPECT_NE(all.status().message().find("chain"), std::string::npos) << all.status().message();
    } else {
      ASSERT_TRUE(all.ok()) << all.status().ToString();
      EXPECT_EQ(*all, versions.back().bytes);
    }
  }

  // An unreadable base is not fatal to the encoder: the chunks become key frames.
  {
    MapResolver empty;
    auto orphan = OpenBytes(last, std::nullopt, &empty);  // its base cannot be found
    ASSERT_TRUE(orphan.ok());
    BaseRef broken{ObjectId::Of(last), *orphan};
    EncodeStats stats;
    std::vector<std::byte> blob = Encode(versions[0].bytes, versions[0].layout, {}, &broken, &stats);
    EXPECT_EQ(stats.delta_chunks, 0u);
    EXPECT_EQ(*DecodeAll(**OpenBytes(blob)), versions[0].bytes);
  }

  // A cycle: blob B names A as its base, and the resolver hands out B for A.
  resolver.limits.max_chain_depth = 16;
  ObjectId fake_a = ObjectId::Of(AsBytes("a"));
  std::vector<std::byte> cyclic = testing::RewriteBlob(last, [&](BlobIndex& index, auto&) { index.header.base = fake_a; });
  resolver.AddAs(fake_a, cyclic);
  DecodeLimits limits;
  limits.max_chain_depth = 16;
  auto reader = OpenBytes(cyclic, std::nullopt, &resolver, nullptr, limits);
  ASSERT_TRUE(reader.ok());
  EXPECT_FALSE(DecodeAll(**reader).ok());
  // And a blob cannot name itself.
  EXPECT_EQ(OpenBytes(cyclic, fake_a, &resolver).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST(BlobDelta, DeltaEncodingIsDeterministicAcrossThreadCounts) {
  std::vector<std::byte> w = testing::NormalF32(20000, 21);
  FileBuilder v0 = Version(w, w, "a"), v1 = Version(Perturb(w, 3, 1), w, "b");
  std::vector<std::byte> base_blob = Encode(v0.bytes, v0.layout, EncodeOptions{3, 4096, 1});
  ObjectId base_id = ObjectId::Of(base_blob);
  BaseRef base{base_id, *OpenBytes(base_blob, base_id)};
  std::vector<std::byte> one = Encode(v1.bytes, v1.layout, EncodeOptions{3, 4096, 1}, &base);
  EXPECT_EQ(one, Encode(v1.bytes, v1.layout, EncodeOptions{3, 4096, 2}, &base));
  EXPECT_EQ(one, Encode(v1.bytes, v1.layout, EncodeOptions{3, 4096, 3}, &base));
}

TEST(BlobDelta, ConcurrentReadersThroughASharedCacheAgree) {
  MapResolver resolver;
  std::vector<std::byte> w = testing::NormalF32(30000, 22);
  FileBuilder v0 = Version(w, w, "a"), v1 = Version(Perturb(w, 5, 2), w, "b");
  std::vector<std::byte> base_blob = Encode(v0.bytes, v0.layout, EncodeOptions{3, 4096, 1});
  ObjectId base_id = resolver.Add(base_blob);
  BaseRef base{base_id, *OpenBytes(base_blob, base_id)};
  std::vector<std::byte> blob = Encode(v1.bytes, v1.layout, EncodeOptions{3, 4096, 1}, &base);
  ChunkCache cache(64 << 10);  // small: entries are evicted while others read
  auto reader = OpenBytes(blob, ObjectId::Of(blob), &resolver, &cache);
  ASSERT_TRUE(reader.ok());
  std::atomic<int> mismatches{0};
  auto work = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 200; ++i) {
      uint64_t off = rng() % v1.bytes.size();
      uint64_t len = std::min<uint64_t>(rng() % 10000, v1.bytes.size() - off);
      std::vector<std::byte> out(len);
      if (!(*reader)->ReadAt(off, out).ok() || !std::equal(out.begin(), out.end(), v1.bytes.begin() + off))
        ++mismatches;
    }
  };
  {
    std::jthread a(work, 1), b(work, 2), c(work, 3);
  }
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_LE(cache.size_bytes(), 64u << 10);
}

}  // namespace
}  // namespace ckptfs
