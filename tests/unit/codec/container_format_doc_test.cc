// Keeps codec/FORMAT.md honest: its worked example, byte for byte where the
// document gives bytes.
#include <gtest/gtest.h>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

TEST(FormatDoc, WorkedExampleHasTheDocumentedLayout) {
  std::vector<std::byte> w(1024);
  for (size_t i = 0; i < 256; ++i) StoreLE32(w.data() + 4 * i, 0x3f800000);
  testing::FileBuilder f;
  f.Verbatim(std::vector<std::byte>(64)).Tensor("w", DType::kF32, {256}, w).Verbatim(AsBytes("end of file, 22 bytes"));
  ASSERT_EQ(f.bytes.size(), 1109u);
  EncodeOptions v1;
  v1.blob_version = kBlobVersionRawIndex;  // the example shows the index's bytes
  std::vector<std::byte> blob = testing::Encode(f.bytes, f.layout, v1);
  ASSERT_EQ(blob.size(), 453u);

  const uint8_t header[16] = {0x89, 'C', 'K', 'B', '\r', '\n', 0x1a, '\n', 1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(blob.data(), header, 16), 0);
  const uint8_t planes[25] = {4, 2, 1, 0, 0, 0, 2, 1, 0, 0, 0, 2, 1, 0, 0, 0, 2, 1, 0, 0, 0, 0x00, 0x00, 0x80, 0x3f};
  EXPECT_EQ(std::memcmp(blob.data() + 16, planes, 25), 0);
  EXPECT_EQ(std::memcmp(blob.data() + 41, "end of file, 22 bytes", 21), 0);
  EXPECT_EQ(LoadLE64(blob.data() + 62), 1109u);                 // logical_size
  EXPECT_EQ(LoadLE64(blob.data() + 70), Checksum64(f.bytes));   // file_checksum
  EXPECT_EQ(LoadLE32(blob.data() + 62 + 20), 1u);               // tensor_count
  EXPECT_EQ(LoadLE32(blob.data() + 62 + 24), 3u);               // segment_count
  EXPECT_EQ(LoadLE32(blob.data() + 62 + 28), 3u);               // chunk_count
  EXPECT_EQ(LoadLE16(blob.data() + 110), 1u);                   // name_length
  EXPECT_EQ(static_cast<char>(blob[116]), 'w');
  EXPECT_EQ(LoadLE64(blob.data() + 117), 256u);                 // shape[0]
  EXPECT_EQ(LoadLE64(blob.data() + 125 + 32 + 0), 64u);         // segment 1 offset
  EXPECT_EQ(LoadLE32(blob.data() + 125 + 32 + 16), 0u);         // segment 1 tensor
  EXPECT_EQ(LoadLE32(blob.data() + 125 + 16), 0xffffffffu);     // segment 0 is verbatim
  EXPECT_EQ(static_cast<uint8_t>(blob[221 + 56]), 4);           // chunk 0 codec: zeros
  EXPECT_EQ(static_cast<uint8_t>(blob[221 + 64 + 56]), 2);      // chunk 1 codec: byte-plane
  EXPECT_EQ(static_cast<uint8_t>(blob[221 + 128 + 56]), 0);     // chunk 2 codec: raw
  EXPECT_EQ(LoadLE64(blob.data() + 221 + 128 + 16), 41u);       // chunk 2 stored_offset
  EXPECT_EQ(LoadLE64(blob.data() + 413), 62u);                  // index_offset
  EXPECT_EQ(LoadLE64(blob.data() + 421), 351u);                 // index_length
  EXPECT_EQ(LoadLE64(blob.data() + 429), Checksum64(ByteSpan(blob).subspan(62, 351)));
  const uint8_t footer_magic[8] = {0x89, 'C', 'K', 'F', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(std::memcmp(blob.data() + 445, footer_magic, 8), 0);

  // Version 2 (the default): the same payloads, the index's 351 bytes as a
  // 165-byte zstd frame at offset 62, which decompresses to them.
  std::vector<std::byte> v2 = testing::Encode(f.bytes, f.layout);
  ASSERT_EQ(v2.size(), 267u);
  EXPECT_EQ(LoadLE16(v2.data() + 8), 2u);
  EXPECT_EQ(std::memcmp(v2.data() + 16, blob.data() + 16, 46), 0);
  EXPECT_EQ(LoadLE64(v2.data() + 227), 62u);   // index_offset
  EXPECT_EQ(LoadLE64(v2.data() + 235), 165u);  // index_length
  EXPECT_EQ(LoadLE16(v2.data() + 251), 2u);    // footer version
  BlobFooter footer = *BlobFooter::DecodeFrom(ByteSpan(v2).last(40));
  Result<std::vector<std::byte>> index = IndexFromStored(footer, ByteSpan(v2).subspan(62, 165), 1 << 20);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(std::equal(index->begin(), index->end(), blob.begin() + 62, blob.begin() + 413));
}

}  // namespace
}  // namespace ckptfs
