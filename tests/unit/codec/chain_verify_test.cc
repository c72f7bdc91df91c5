// Decoded checksums along a delta chain: a chunk decoded as the input of a
// newer version is not hashed (the newer version's own checksum covers what
// it gave), and is checked once it is read for itself.
#include <gtest/gtest.h>

#include <map>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/container/blob.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

// Opens every blob of the chain through one chunk cache, as the mount does.
class CachedResolver final : public BlobResolver {
 public:
  explicit CachedResolver(ChunkCache* cache) : cache_(cache) {}
  void AddAs(const ObjectId& id, std::vector<std::byte> blob) { blobs_[id] = std::move(blob); }
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    auto it = blobs_.find(id);
    if (it == blobs_.end()) return Status::NotFound("no blob " + id.Hex());
    return BlobReader::Open(std::make_shared<MemoryFile>(it->second), id, this, cache_);
  }

 private:
  ChunkCache* cache_;
  std::map<ObjectId, std::vector<std::byte>> blobs_;
};

Result<std::vector<std::byte>> ReadWhole(const BlobReader& reader) {
  std::vector<std::byte> out(reader.logical_size());
  RETURN_IF_ERROR(reader.ReadAt(0, out));
  return out;
}

// The middle version's index claims a wrong decoded checksum for every
// chunk (its stored bytes intact): the newest version, which reads it,
// still reads back right, and the middle one fails once it is read for
// itself, whether its chunks were cached as inputs first or not.
TEST(ChainVerify, AnInputIsCheckedWhenItIsReadForItself) {
  AdamChain chain;
  BuildAdamChain(&chain);
  ASSERT_EQ(chain.blobs.size(), 3u);
  const std::vector<std::byte> middle = RewriteBlob(chain.blobs[1], [](BlobIndex& index, auto&) {
    for (ChunkInfo& c : index.chunks) c.checksum ^= 1;
  });
  ChunkCache cache(64 << 20);
  CachedResolver resolver(&cache);
  for (size_t v = 0; v < 3; ++v) resolver.AddAs(chain.ids[v], v == 1 ? middle : chain.blobs[v]);

  Result<std::shared_ptr<const BlobReader>> newest = resolver.OpenBlob(chain.ids[2]);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  Result<std::vector<std::byte>> got = DecodeAll(**newest);  // the whole-file checksum too
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == chain.decoded[2]);

  Result<std::shared_ptr<const BlobReader>> mid = resolver.OpenBlob(chain.ids[1]);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  uint32_t cached = 0;
  for (uint32_t c = 0; c < (*mid)->chunks().size(); ++c) cached += cache.Get(chain.ids[1], c) != nullptr;
  ASSERT_GT(cached, 0u) << "the newest version read none of the middle one";
  Result<std::vector<std::byte>> read = ReadWhole(**mid);
  ASSERT_FALSE(read.ok()) << "a cached input was returned unchecked";
  EXPECT_EQ(read.status().code(), StatusCode::kChecksumMismatch) << read.status().ToString();
  EXPECT_NE(read.status().message().find("decoded as an input first"), std::string::npos) << read.status().ToString();
  // Dropped, not kept for the next reader; decoded again, it fails again.
  Result<std::vector<std::byte>> again = ReadWhole(**mid);
  EXPECT_EQ(again.status().code(), StatusCode::kChecksumMismatch) << again.status().ToString();

  // Through a fresh cache (nothing decoded as an input first) the same.
  ChunkCache fresh(64 << 20);
  CachedResolver other(&fresh);
  for (size_t v = 0; v < 3; ++v) other.AddAs(chain.ids[v], v == 1 ? middle : chain.blobs[v]);
  Result<std::shared_ptr<const BlobReader>> mid_fresh = other.OpenBlob(chain.ids[1]);
  ASSERT_TRUE(mid_fresh.ok());
  EXPECT_EQ(ReadWhole(**mid_fresh).status().code(), StatusCode::kChecksumMismatch);
}

// An intact chain read newest first, then each older version through the
// same cache: every chunk an input left cached checks out.
TEST(ChainVerify, IntactInputsReadForThemselvesCheckOut) {
  AdamChain chain;
  BuildAdamChain(&chain);
  ChunkCache cache(64 << 20);
  CachedResolver resolver(&cache);
  for (size_t v = 0; v < 3; ++v) resolver.AddAs(chain.ids[v], chain.blobs[v]);
  for (int v = 2; v >= 0; --v) {
    SCOPED_TRACE(v);
    Result<std::shared_ptr<const BlobReader>> reader = resolver.OpenBlob(chain.ids[v]);
    ASSERT_TRUE(reader.ok());
    Result<std::vector<std::byte>> got = ReadWhole(**reader);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == chain.decoded[v]);
  }
}

}  // namespace
}  // namespace ckptfs
