// DCP shard files (codec/format/dcp.h): torch.save archives back to back,
// found from the bytes alone, each archive's tensors and CRC fields moved to
// its offset.
#include <gtest/gtest.h>

#include "codec/common/hash.h"
#include "codec/format/dcp.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {
using testing::ReadFixture;

std::vector<std::byte> Concat(const std::vector<std::vector<std::byte>>& parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(FormatDcpTest, ArchivesBackToBackAreOneLayout) {
  const auto a = ReadFixture("torch_optim.pt"), b = ReadFixture("torch_root.pt"), c = ReadFixture("torch_bytesio.pt");
  const auto file = Concat({a, b, c});
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kDcp) << layout.fallback_reason;
  ASSERT_TRUE(ValidateLayout(layout, file.size()).ok());
  const Layout la = DetectLayout(a), lb = DetectLayout(b), lc = DetectLayout(c);
  ASSERT_EQ(layout.tensors.size(), la.tensors.size() + lb.tensors.size() + lc.tensors.size());
  EXPECT_EQ(layout.tensors[0].name, "0/" + la.tensors[0].name);
  EXPECT_EQ(layout.tensors[la.tensors.size()].name, "1/" + lb.tensors[0].name);
  // Each archive's tensor segments are its own layout's, moved to where the
  // archive starts.
  std::vector<Segment> want;
  uint64_t start = 0;
  int32_t first = 0;
  for (const Layout* part : {&la, &lb, &lc}) {
    for (Segment s : part->segments)
      if (s.is_tensor()) want.push_back({s.offset + start, s.length, s.tensor + first});
    start += part == &la ? a.size() : part == &lb ? b.size() : c.size();
    first += static_cast<int32_t>(part->tensors.size());
  }
  std::vector<Segment> have;
  for (const Segment& s : layout.segments)
    if (s.is_tensor()) have.push_back(s);
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < have.size(); ++i) {
    EXPECT_EQ(have[i].offset, want[i].offset) << i;
    EXPECT_EQ(have[i].length, want[i].length) << i;
    EXPECT_EQ(have[i].tensor, want[i].tensor) << i;
  }
  // Every CRC field still holds the CRC of its payload.
  ASSERT_EQ(layout.zip_crcs.size(), la.zip_crcs.size() + lb.zip_crcs.size() + lc.zip_crcs.size());
  for (const ZipCrcField& f : layout.zip_crcs)
    for (uint64_t at : f.crc_offsets)
      EXPECT_EQ(LoadLE32(file.data() + at), Crc32(ByteSpan(file).subspan(f.payload_offset, f.payload_length)));
  // Deterministic.
  EXPECT_EQ(DetectLayout(file).segments.size(), layout.segments.size());
}

TEST(FormatDcpTest, SingleArchiveStaysATorchZip) {
  EXPECT_EQ(DetectLayout(ReadFixture("torch_optim.pt")).format, FileFormat::kTorchZip);
  EXPECT_EQ(ParseTorchZipSequence(ReadFixture("torch_optim.pt"), {}).status().code(), StatusCode::kNotFound);
}

TEST(FormatDcpTest, DamagedSequencesAreOpaqueNeverCrash) {
  const auto a = ReadFixture("torch_optim.pt"), b = ReadFixture("torch_root.pt");
  const auto file = Concat({a, b});
  // Truncated anywhere, bytes between archives, a flipped byte.
  for (size_t cut : {a.size() + 10, a.size() + b.size() / 2, file.size() - 1}) {
    std::vector<std::byte> t(file.begin(), file.begin() + static_cast<ptrdiff_t>(cut));
    Layout l = DetectLayout(t);
    EXPECT_TRUE(ValidateLayout(l, t.size()).ok());
    EXPECT_NE(l.format, FileFormat::kDcp) << cut;
  }
  std::vector<std::byte> gap = a;
  gap.push_back(std::byte{0});
  gap.insert(gap.end(), b.begin(), b.end());
  EXPECT_TRUE(testing::IsOpaque(DetectLayout(gap), gap.size()));
  for (size_t i = 0; i < file.size(); i += 97) {
    std::vector<std::byte> f = file;
    f[i] ^= std::byte{0x5a};
    Layout l = DetectLayout(f);
    EXPECT_TRUE(ValidateLayout(l, f.size()).ok()) << i;
  }
  // A file of end signatures costs a bounded number of parses.
  std::vector<std::byte> sigs = a;
  for (int i = 0; i < 100000; ++i)
    for (char ch : {'P', 'K', '\x05', '\x06'}) sigs.push_back(static_cast<std::byte>(ch));
  EXPECT_TRUE(ValidateLayout(DetectLayout(sigs), sigs.size()).ok());
}

}  // namespace
}  // namespace ckptfs
