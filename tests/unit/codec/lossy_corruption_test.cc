// Corrupt or truncated lossy streams give an error status, never a crash and
// never silently wrong values (LevelDB corruption_test style).
#include <gtest/gtest.h>

#include <cstring>

#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/symbol_stream.h"
#include "codec/tensor/rans.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

std::vector<std::byte> Encode(ElementType type, const std::vector<std::byte>& values, const Budget& budget,
                              Scratch* scratch) {
  Result<EncodedChunk> c = EncodeChunk(type, values, {}, budget, scratch);
  EXPECT_TRUE(c.ok());
  return c.ok() ? c->bytes : std::vector<std::byte>{};
}

TEST(LossyCorruptionTest, EveryByteFlipAndTruncationIsAnError) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kHeavyTail, 3000, 1));
  for (const Budget& budget : {Budget{1e-1, 0}, Budget{}}) {
    std::vector<std::byte> good = Encode(ElementType::kF32, values, budget, &scratch);
    ASSERT_FALSE(good.empty());
    std::vector<std::byte> out(values.size());
    ASSERT_TRUE(DecodeChunk(ElementType::kF32, good, {}, out, &scratch).ok());
    for (size_t i = 0; i < good.size(); ++i) {
      std::vector<std::byte> bad = good;
      bad[i] ^= std::byte{0x41};
      EXPECT_FALSE(DecodeChunk(ElementType::kF32, bad, {}, out, &scratch).ok()) << "flip at " << i;
    }
    for (size_t len = 0; len < good.size(); len += 1 + len / 8) {
      std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(len));
      EXPECT_FALSE(DecodeChunk(ElementType::kF32, cut, {}, out, &scratch).ok()) << "truncated to " << len;
    }
  }
}

// Structural checks behind the checksum: edit fields, reseal, expect
// Corruption (the parser itself must reject them).
TEST(LossyCorruptionTest, ResealedBadFieldsAreCorruption) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kHeavyTail, 5000, 2));
  std::vector<std::byte> good = Encode(ElementType::kF32, values, Budget{1e-1, 0}, &scratch);
  ASSERT_FALSE(good.empty());
  std::vector<std::byte> out(values.size());
  struct Edit {
    size_t offset;
    uint8_t value;
  };
  // Offsets follow the header layout of LOSSY.md: the fixed prefix, then
  // every byte of the compact header's varints.
  const size_t header = StreamHeader::DecodeFrom(good)->size;
  ASSERT_LT(header, StreamHeader::kEncodedSize) << "the encoder writes compact headers";
  std::vector<Edit> edits = {Edit{1, 7}, Edit{2, 9}, Edit{3, 0}, Edit{3, 9}, Edit{4, 0x80}, Edit{5, 1}};
  for (size_t at = StreamHeader::kFixedPrefix; at < header; ++at)
    for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) edits.push_back(Edit{at, v});
  for (Edit e : edits) {
    std::vector<std::byte> bad = good;
    bad[e.offset] = std::byte{e.value};
    if (bad == good) continue;
    testing::Reseal(&bad);
    Status st = DecodeChunk(ElementType::kF32, bad, {}, out, &scratch);
    EXPECT_FALSE(st.ok()) << "edit at " << e.offset << " to " << int{e.value};
    EXPECT_TRUE(st.code() == StatusCode::kCorruption || st.code() == StatusCode::kUnsupported) << st.ToString();
  }
  // A level that is not finite, and levels out of order.
  std::vector<std::byte> bad = good;
  StoreLE32(bad.data() + header, 0x7fc00000u);
  testing::Reseal(&bad);
  EXPECT_EQ(DecodeChunk(ElementType::kF32, bad, {}, out, &scratch).code(), StatusCode::kCorruption);
  // Levels out of order (needs a codebook of at least two levels).
  std::vector<std::byte> normal = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kNormal, 5000, 3));
  std::vector<std::byte> many = Encode(ElementType::kF32, normal, Budget{1e-2, 0}, &scratch);
  const StreamHeader many_header = *StreamHeader::DecodeFrom(many);
  ASSERT_GE(many_header.num_levels, 2u) << "want a multi-level codebook";
  std::memcpy(many.data() + many_header.size + 4, many.data() + many_header.size, 4);
  testing::Reseal(&many);
  std::vector<std::byte> out2(normal.size());
  EXPECT_EQ(DecodeChunk(ElementType::kF32, many, {}, out2, &scratch).code(), StatusCode::kCorruption);
}

TEST(LossyCorruptionTest, HeaderRoundTrips) {
  StreamHeader h;
  h.mode = StreamMode::kQuantized;
  h.type = ElementType::kBF16;
  h.bits = 5;
  h.flags = kFlagDelta;
  h.num_levels = 31;
  h.element_count = 123456;
  h.exact_count = 7;
  h.main_size = 999;
  h.exact_raw_size = 50;
  h.exact_size = 40;
  std::vector<std::byte> bytes;
  h.EncodeTo(&bytes);
  ASSERT_EQ(bytes.size(), StreamHeader::kEncodedSize);
  Result<StreamHeader> back = StreamHeader::DecodeFrom(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->bits, 5);
  EXPECT_EQ(back->num_levels, 31u);
  EXPECT_EQ(back->element_count, 123456u);
  EXPECT_EQ(back->exact_size, 40u);
  EXPECT_FALSE(StreamHeader::DecodeFrom(ByteSpan(bytes).first(51)).ok());
}

TEST(LossyCorruptionTest, VarintRejectsOverlongAndTruncated) {
  std::byte buf[8];
  size_t len = PutVarint32(buf, 0xffffffffu);
  EXPECT_EQ(len, 5u);
  size_t pos = 0;
  uint32_t v = 0;
  EXPECT_TRUE(GetVarint32(ByteSpan(buf, len), &pos, &v));
  EXPECT_EQ(v, 0xffffffffu);
  pos = 0;
  EXPECT_FALSE(GetVarint32(ByteSpan(buf, 3), &pos, &v));
  std::byte overlong[6] = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff},
                           std::byte{0xff}, std::byte{0xff}, std::byte{0x01}};
  pos = 0;
  EXPECT_FALSE(GetVarint32(overlong, &pos, &v));
}

// A rANS plane's symbols are dequantized as bytes (decoder.cc): a symbol
// above the level count, within the header's width or wider than it, is
// Corruption, not a read past the levels or a silently other value.
TEST(LossyCorruptionTest, RansSymbolsAboveTheLevelsAreCorruption) {
  Scratch scratch;
  std::vector<std::byte> values = testing::ToElements(ElementType::kF32, testing::Generate(Dist::kLaplace, 1 << 16, 4));
  std::vector<std::byte> good = Encode(ElementType::kF32, values, Budget{3e-2, 0}, &scratch);
  const StreamHeader h = *StreamHeader::DecodeFrom(good);
  ASSERT_EQ(h.version, kStreamVersionRans) << "want a rANS plane";
  ASSERT_LT(h.num_levels, (1u << h.bits) - 1) << "want room for a symbol within the width above the levels";
  std::vector<std::byte> out(values.size());
  ASSERT_TRUE(DecodeChunk(ElementType::kF32, good, {}, out, &scratch).ok());
  const size_t levels_at = h.size, main_at = levels_at + 4 * h.num_levels;
  Scratch::Buffers& s = scratch.buffers();
  Result<ByteSpan> decoded = DecodeSymbolBytes(s, ByteSpan(good).subspan(main_at, h.main_size), h.bits,
                                               h.element_count, "test");
  ASSERT_TRUE(decoded.ok());
  const std::vector<uint8_t> symbols(reinterpret_cast<const uint8_t*>(decoded->data()),
                                     reinterpret_cast<const uint8_t*>(decoded->data()) + h.element_count);
  for (uint32_t bad_symbol : {h.num_levels + 1, 1u << h.bits, 255u}) {
    SCOPED_TRACE("symbol " + std::to_string(bad_symbol));
    std::vector<uint8_t> edited = symbols;
    edited[12345] = static_cast<uint8_t>(bad_symbol);
    std::vector<std::byte> plane(2 * edited.size());
    Result<size_t> size = RansEncode(edited.data(), edited.size(), CountBytes(edited.data(), edited.size()),
                                     plane.data(), plane.size());
    ASSERT_TRUE(size.ok());
    StreamHeader bad_header = h;
    bad_header.main_size = *size;
    std::vector<std::byte> bad;
    bad_header.EncodeTo(&bad);
    bad.insert(bad.end(), good.begin() + static_cast<ptrdiff_t>(levels_at),
               good.begin() + static_cast<ptrdiff_t>(main_at));
    bad.insert(bad.end(), plane.begin(), plane.begin() + static_cast<ptrdiff_t>(*size));
    bad.insert(bad.end(), good.begin() + static_cast<ptrdiff_t>(main_at + h.main_size), good.end());
    testing::Reseal(&bad);
    EXPECT_EQ(DecodeChunk(ElementType::kF32, bad, {}, out, &scratch).code(), StatusCode::kCorruption);
  }
}

}  // namespace
}  // namespace ckptfs::lossy
