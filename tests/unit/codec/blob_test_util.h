// Helpers shared by the container tests: synthetic tensor data, layouts,
// encode/open shortcuts, an in-memory resolver, and a blob rewriter that
// re-checksums a modified index (to build hostile but well-checksummed
// blobs).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "codec/container/blob.h"
#include "codec/container/blob_format.h"

namespace ckptfs::testing {

// `count` f32 values like trained weights: normal with sigma `scale`.
inline std::vector<std::byte> NormalF32(size_t count, uint32_t seed, float scale = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::byte> out(count * 4);
  for (size_t i = 0; i < count; ++i) {
    float v = dist(rng);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

// 16-bit floats: the high halves of NormalF32 (bf16), which is also a
// plausible bit pattern distribution for f16 tests.
inline std::vector<std::byte> NormalBF16(size_t count, uint32_t seed) {
  std::vector<std::byte> f = NormalF32(count, seed);
  std::vector<std::byte> out(count * 2);
  for (size_t i = 0; i < count; ++i) std::memcpy(out.data() + 2 * i, f.data() + 4 * i + 2, 2);
  return out;
}

// The bytes of f32 values (host order, little-endian here).
inline std::vector<std::byte> F32Bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = std::byte(rng() & 0xff);
  return out;
}

// Builds a file and its layout piece by piece.
struct FileBuilder {
  std::vector<std::byte> bytes;
  Layout layout;

  FileBuilder& Verbatim(ByteSpan data) {
    if (!data.empty()) layout.segments.push_back(Segment{bytes.size(), data.size(), -1});
    bytes.insert(bytes.end(), data.begin(), data.end());
    return *this;
  }
  FileBuilder& Tensor(std::string name, DType dtype, std::vector<uint64_t> shape, ByteSpan data) {
    layout.tensors.push_back(TensorInfo{std::move(name), dtype, std::move(shape), false});
    layout.segments.push_back(Segment{bytes.size(), data.size(), static_cast<int32_t>(layout.tensors.size() - 1)});
    bytes.insert(bytes.end(), data.begin(), data.end());
    return *this;
  }
};

inline std::vector<std::byte> Encode(ByteSpan file, const Layout& layout, const EncodeOptions& options = {},
                                     const BaseRef* base = nullptr, EncodeStats* stats = nullptr) {
  VectorSink sink;
  Result<EncodeStats> r = EncodeBlob(file, layout, base, options, &sink);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (stats != nullptr && r.ok()) *stats = *r;
  return std::move(sink.bytes);
}

inline Result<std::shared_ptr<const BlobReader>> OpenBytes(std::vector<std::byte> blob,
                                                           std::optional<ObjectId> id = std::nullopt,
                                                           BlobResolver* resolver = nullptr,
                                                           ChunkCache* cache = nullptr,
                                                           const DecodeLimits& limits = {}) {
  return BlobReader::Open(std::make_shared<MemoryFile>(std::move(blob)), id, resolver, cache, limits);
}

// A blob encoded from `file`, opened with a chunk cache of its own.
// `reader` is null (and the test has failed) when it does not open.
struct CachedBlob {
  CachedBlob(const FileBuilder& file, const EncodeOptions& options, uint64_t cache_bytes = 1 << 20)
      : bytes(Encode(file.bytes, file.layout, options)), id(ObjectId::Of(bytes)), cache(cache_bytes) {
    Result<std::shared_ptr<const BlobReader>> opened = OpenBytes(bytes, id, nullptr, &cache);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) reader = *opened;
  }
  std::vector<std::byte> bytes;
  ObjectId id;
  ChunkCache cache;
  std::shared_ptr<const BlobReader> reader;  // after `cache`: let go first
};

// Resolves ids to blobs held in memory; counts opens.
class MapResolver final : public BlobResolver {
 public:
  ObjectId Add(std::vector<std::byte> blob) {
    ObjectId id = ObjectId::Of(blob);
    blobs_[id] = std::move(blob);
    return id;
  }
  void AddAs(const ObjectId& id, std::vector<std::byte> blob) { blobs_[id] = std::move(blob); }
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    ++opens;
    auto it = blobs_.find(id);
    if (it == blobs_.end()) return Status::NotFound("no blob " + id.Hex());
    return BlobReader::Open(std::make_shared<MemoryFile>(it->second), id, this, nullptr, limits);
  }
  DecodeLimits limits;
  int opens = 0;

 private:
  std::map<ObjectId, std::vector<std::byte>> blobs_;
};

// Parses a valid blob, lets `edit` change its index and payloads, and
// writes it back with the index offset, stored offsets and every checksum
// recomputed, so that only the edit itself is wrong.
inline std::vector<std::byte> RewriteBlob(
    const std::vector<std::byte>& blob,
    const std::function<void(BlobIndex&, std::vector<std::vector<std::byte>>&)>& edit,
    bool fix_stored_checksums = true) {
  ByteSpan all(blob);
  BlobFooter footer = *BlobFooter::DecodeFrom(all.last(BlobFooter::kEncodedSize));
  DecodeLimits limits;
  Result<std::vector<std::byte>> raw_index =
      IndexFromStored(footer, all.subspan(footer.index_offset, footer.index_length), limits.max_index_bytes);
  EXPECT_TRUE(raw_index.ok()) << raw_index.status().ToString();
  Result<BlobIndex> parsed = BlobIndex::DecodeFrom(*raw_index, footer.index_offset, limits);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  BlobIndex index = std::move(*parsed);
  std::vector<std::vector<std::byte>> payloads;
  for (const ChunkInfo& c : index.chunks) {
    ByteSpan p = all.subspan(c.stored_offset, c.stored_length);
    payloads.emplace_back(p.begin(), p.end());
  }
  edit(index, payloads);
  std::vector<std::byte> out;
  ByteWriter w(&out);
  BlobHeader{footer.version}.EncodeTo(w);  // the same version: the same index storage
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (i < index.chunks.size()) {
      index.chunks[i].stored_offset = out.size();
      index.chunks[i].stored_length = payloads[i].size();
      if (fix_stored_checksums) index.stored_checksums[i] = Checksum64(payloads[i]);
    }
    w.Bytes(payloads[i]);
  }
  const uint64_t index_offset = out.size();
  std::vector<std::byte> index_bytes;
  ByteWriter iw(&index_bytes);
  index.EncodeTo(iw);
  EXPECT_TRUE(AppendIndexAndFooter(index_bytes, index_offset, footer.version, &out).ok());
  return out;
}

}  // namespace ckptfs::testing
