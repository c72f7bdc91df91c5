// A chunk cache's spill (codec/container/chunk_spill.h): readers take a
// chunk from it instead of decoding, but only bytes that match the chunk's
// checksum.
#include "codec/container/chunk_spill.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

using testing::Encode;
using testing::FileBuilder;
using testing::OpenBytes;

// Serves `bytes` as the reconstruction of `id`, counting the reads.
class FakeSpill final : public ChunkSpill {
 public:
  FakeSpill(ObjectId id, std::vector<std::byte> bytes) : id_(id), bytes_(std::move(bytes)) {}
  bool Read(const ObjectId& blob, uint64_t offset, MutableByteSpan out) override {
    if (blob != id_ || offset > bytes_.size() || out.size() > bytes_.size() - offset) return false;
    ++reads;
    std::copy_n(bytes_.begin() + static_cast<ptrdiff_t>(offset), out.size(), out.begin());
    return true;
  }
  void Forget(const ObjectId& blob) override {
    EXPECT_EQ(blob, id_);
    ++forgotten;
  }
  std::vector<std::byte>& bytes() { return bytes_; }
  std::atomic<int> reads{0};
  std::atomic<int> forgotten{0};

 private:
  ObjectId id_;
  std::vector<std::byte> bytes_;
};

FileBuilder File() {
  FileBuilder f;
  f.Verbatim(testing::RandomBytes(100, 1))
      .Tensor("w", DType::kF32, {64, 500}, testing::NormalF32(32000, 2))
      .Verbatim(testing::RandomBytes(50, 3));
  return f;
}

TEST(ChunkSpill, ReadersTakeChunksWhoseChecksumMatches) {
  FileBuilder f = File();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 16384, 1});
  const ObjectId id = ObjectId::Of(blob);
  // The stored chunks destroyed (past the header): only the spill can
  // give the bytes.
  std::vector<std::byte> broken = blob;
  auto clean = OpenBytes(blob);
  ASSERT_TRUE(clean.ok());
  for (const ChunkInfo& c : (*clean)->chunks())
    if (c.stored_length > 0) broken[c.stored_offset] ^= std::byte{0xff};
  FakeSpill spill(id, f.bytes);
  ChunkCache cache(1 << 20);
  cache.SetSpill(&spill);
  auto reader = OpenBytes(broken, id, nullptr, &cache);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto all = DecodeAll(**reader);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, f.bytes);
  EXPECT_EQ(spill.reads.load(), static_cast<int>((*reader)->chunks().size()));
  EXPECT_EQ(spill.forgotten.load(), 0);

  // A spill whose bytes are not the chunk's is not believed: the chunk is
  // decoded (and here, destroyed, found out).
  ChunkCache second(1 << 20);
  spill.bytes()[200] ^= std::byte{1};
  second.SetSpill(&spill);
  auto wrong = OpenBytes(broken, id, nullptr, &second);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(DecodeAll(**wrong).status().code(), StatusCode::kChecksumMismatch);
  EXPECT_GE(spill.forgotten.load(), 1) << "told to let go of the blob whose bytes were wrong";
  ChunkCache third(1 << 20);
  third.SetSpill(&spill);
  auto decoded = OpenBytes(blob, id, nullptr, &third);
  ASSERT_TRUE(decoded.ok());
  auto good = DecodeAll(**decoded);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(*good, f.bytes) << "the chunk the spill got wrong was decoded";
}

}  // namespace
}  // namespace ckptfs
