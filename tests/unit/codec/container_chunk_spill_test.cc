// A chunk cache's spill (codec/container/chunk_spill.h): readers take a
// chunk from it instead of decoding, but only bytes that match the chunk's
// checksum.
#include "codec/container/chunk_spill.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>

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
  // In memory too when `in_memory`, as the daemon's spill keeps the
  // newest reconstructions.
  std::optional<View> ViewInMemory(const ObjectId& blob, uint64_t offset, uint64_t length) override {
    if (!in_memory || blob != id_ || offset > bytes_.size() || length > bytes_.size() - offset) return std::nullopt;
    ++views;
    return View{owner_, ByteSpan(bytes_.data() + offset, length)};
  }
  std::vector<std::byte>& bytes() { return bytes_; }
  bool in_memory = false;
  std::atomic<int> views{0};
  std::atomic<int> reads{0};
  std::atomic<int> forgotten{0};

 private:
  ObjectId id_;
  std::vector<std::byte> bytes_;
  std::shared_ptr<const void> owner_ = std::make_shared<int>(0);
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

// A reconstruction the spill keeps in memory is read in place (a base
// read of the next version's encode, BlobReader::ViewAt), not copied, and
// checked like a copy.
TEST(ChunkSpill, ViewsReadTheSpillsMemoryInPlace) {
  FileBuilder f = File();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 16384, 1});
  const ObjectId id = ObjectId::Of(blob);
  FakeSpill spill(id, f.bytes);
  spill.in_memory = true;
  ChunkCache cache(1 << 20);
  cache.SetSpill(&spill);
  auto reader = OpenBytes(blob, id, nullptr, &cache);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const std::vector<ChunkInfo>& chunks = (*reader)->chunks();
  std::vector<std::byte> buffer(f.bytes.size());
  for (const ChunkInfo& c : chunks) {
    SCOPED_TRACE(c.logical_offset);
    std::shared_ptr<const void> hold;
    const uint64_t from = c.logical_offset + (c.logical_length > 8 ? 4 : 0);
    const uint64_t n = c.logical_length - (from - c.logical_offset);
    Result<ByteSpan> view = (*reader)->ViewAt(from, MutableByteSpan(buffer.data(), n), &hold);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(view->data(), spill.bytes().data() + from) << "in the spill's memory";
    EXPECT_NE(hold, nullptr);
    EXPECT_TRUE(std::equal(view->begin(), view->end(), f.bytes.begin() + static_cast<ptrdiff_t>(from)));
  }
  EXPECT_EQ(spill.views.load(), static_cast<int>(chunks.size()));
  EXPECT_EQ(spill.reads.load(), 0) << "nothing copied";

  // A range across two chunks is read into the buffer, as ReadAt would.
  ASSERT_GE(chunks.size(), 2u);
  const uint64_t across = chunks[1].logical_offset - 8;
  std::shared_ptr<const void> hold;
  Result<ByteSpan> joined = (*reader)->ViewAt(across, MutableByteSpan(buffer.data(), 16), &hold);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->data(), buffer.data());
  EXPECT_TRUE(std::equal(joined->begin(), joined->end(), f.bytes.begin() + static_cast<ptrdiff_t>(across)));

  // Memory whose bytes are not the chunk's is not believed: the chunk is
  // decoded from the blob, and the spill told to let go.
  spill.bytes()[chunks[0].logical_offset + 1] ^= std::byte{1};
  ChunkCache second(1 << 20);
  second.SetSpill(&spill);
  auto fresh = OpenBytes(blob, id, nullptr, &second);
  ASSERT_TRUE(fresh.ok());
  Result<ByteSpan> first =
      (*fresh)->ViewAt(chunks[0].logical_offset, MutableByteSpan(buffer.data(), chunks[0].logical_length), &hold);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(std::equal(first->begin(), first->end(), f.bytes.begin() + static_cast<ptrdiff_t>(chunks[0].logical_offset)));
  EXPECT_GE(spill.forgotten.load(), 1);
}

}  // namespace
}  // namespace ckptfs
