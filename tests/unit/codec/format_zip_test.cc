// The zip directory parser and CRC rewriting, on real torch.save files and
// on small archives built here to lie in specific ways.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "codec/common/hash.h"
#include "codec/format/layout.h"
#include "codec/format/zip_archive.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {

using testing::Bytes;
using testing::IsOpaque;
using testing::ReadFixture;

struct Member {
  std::string name;
  std::string payload;
  uint16_t method = 0;
};

// A plain zip: stored members, no data descriptors, CRCs computed. With
// `zip64`, the central directory saturates sizes and offsets and carries
// them in zip64 extra fields, and zip64 end records precede the end record,
// as a writer of files over 4 GiB must.
std::vector<std::byte> BuildZip(const std::vector<Member>& members, std::string_view comment = "",
                                bool zip64 = false) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  std::vector<uint64_t> offsets;
  for (const Member& m : members) {
    offsets.push_back(out.size());
    uint32_t crc = Crc32(AsBytes(m.payload));
    w.U32(0x04034b50); w.U16(20); w.U16(0); w.U16(m.method); w.U32(0);
    w.U32(crc); w.U32(m.payload.size()); w.U32(m.payload.size());
    w.U16(m.name.size()); w.U16(0);
    w.Bytes(AsBytes(m.name)); w.Bytes(AsBytes(m.payload));
  }
  uint64_t cd = out.size();
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    w.U32(0x02014b50); w.U16(20); w.U16(20); w.U16(0); w.U16(m.method); w.U32(0);
    w.U32(Crc32(AsBytes(m.payload)));
    w.U32(zip64 ? 0xffffffff : m.payload.size()); w.U32(zip64 ? 0xffffffff : m.payload.size());
    w.U16(m.name.size()); w.U16(zip64 ? 28 : 0); w.U16(0); w.U16(0); w.U16(0); w.U32(0);
    w.U32(zip64 ? 0xffffffff : offsets[i]);
    w.Bytes(AsBytes(m.name));
    if (zip64) {
      w.U16(1); w.U16(24); w.U64(m.payload.size()); w.U64(m.payload.size()); w.U64(offsets[i]);
    }
  }
  uint64_t cd_size = out.size() - cd;
  if (zip64) {
    uint64_t end64 = out.size();
    w.U32(0x06064b50); w.U64(44); w.U16(45); w.U16(45); w.U32(0); w.U32(0);
    w.U64(members.size()); w.U64(members.size()); w.U64(cd_size); w.U64(cd);
    w.U32(0x07064b50); w.U32(0); w.U64(end64); w.U32(1);
  }
  w.U32(0x06054b50); w.U16(0); w.U16(0);
  w.U16(zip64 ? 0xffff : members.size()); w.U16(zip64 ? 0xffff : members.size());
  w.U32(zip64 ? 0xffffffff : cd_size); w.U32(zip64 ? 0xffffffff : cd); w.U16(comment.size());
  w.Bytes(AsBytes(comment));
  return out;
}

// Central directory record offsets of an archive, in order.
std::vector<uint64_t> CentralRecords(ByteSpan file) {
  auto archive = ParseZipArchive(file, ParseLimits{});
  EXPECT_TRUE(archive.ok()) << archive.status().ToString();
  std::vector<uint64_t> out;
  uint64_t at = archive->central_directory_offset;
  for (size_t i = 0; i < archive->entries.size(); ++i) {
    out.push_back(at);
    at += 46 + LoadLE16(file.data() + at + 28) + LoadLE16(file.data() + at + 30) + LoadLE16(file.data() + at + 32);
  }
  return out;
}

// The central record of the first entry whose name contains "/data/".
uint64_t FirstDataRecord(ByteSpan file) {
  for (uint64_t at : CentralRecords(file)) {
    std::string_view name(reinterpret_cast<const char*>(file.data()) + at + 46, LoadLE16(file.data() + at + 28));
    if (name.find("/data/") != std::string_view::npos) return at;
  }
  ADD_FAILURE() << "no data record";
  return 0;
}

void ExpectOpaqueWithReason(const std::vector<std::byte>& file, std::string_view want_in_reason) {
  Layout layout = DetectLayout(file);
  EXPECT_TRUE(IsOpaque(layout, file.size()));
  EXPECT_NE(layout.fallback_reason.find(want_in_reason), std::string::npos)
      << "reason: " << layout.fallback_reason << " want it to mention: " << want_in_reason;
}

TEST(ZipArchiveTest, ParsesPlainZipWithCommentAndIsNotTorch) {
  std::vector<std::byte> zip = BuildZip({{"hello.txt", "hello"}, {"b/c.bin", "xyz"}}, "a comment");
  auto archive = ParseZipArchive(zip, ParseLimits{});
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  ASSERT_EQ(archive->entries.size(), 2u);
  EXPECT_EQ(archive->entries[1].name, "b/c.bin");
  EXPECT_EQ(AsChars(ByteSpan(zip).subspan(archive->entries[1].payload_offset, 3)), "xyz");
  Layout layout = DetectLayout(zip);
  EXPECT_TRUE(IsOpaque(layout, zip.size()));
  EXPECT_EQ(layout.fallback_reason, "");  // a valid zip, just not a checkpoint
}

TEST(ZipArchiveTest, Zip64DirectoryFieldsAreResolved) {
  std::vector<std::byte> zip = BuildZip({{"m/data.pkl", "N."}, {"m/extra.bin", "abcdef"}}, "", /*zip64=*/true);
  auto archive = ParseZipArchive(zip, ParseLimits{});
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  ASSERT_EQ(archive->entries.size(), 2u);
  EXPECT_EQ(archive->entries[1].compressed_size, 6u);
  EXPECT_EQ(AsChars(ByteSpan(zip).subspan(archive->entries[1].payload_offset, 6)), "abcdef");
  EXPECT_EQ(DetectLayout(zip).format, FileFormat::kTorchZip);
  // A saturated field whose zip64 extra is missing is a lie.
  uint64_t rec = CentralRecords(zip)[0];
  std::vector<std::byte> bad = zip;
  StoreLE16(bad.data() + rec + 46 + 10, 0x9999);  // the extra's id
  EXPECT_EQ(ParseZipArchive(bad, ParseLimits{}).status().code(), StatusCode::kCorruption);
  // A locator pointing past itself is a lie.
  bad = zip;
  uint64_t locator = bad.size() - 22 - 20;
  StoreLE64(bad.data() + locator + 8, locator);
  EXPECT_EQ(ParseZipArchive(bad, ParseLimits{}).status().code(), StatusCode::kCorruption);
}

TEST(ZipArchiveTest, EntryHiddenInsideAnotherEntryIsRejectedAsOverlap) {
  // Entry "a"'s payload holds a complete local header of "b"; the central
  // directory points "b" there. Each header alone is consistent.
  std::vector<std::byte> inner = BuildZip({{"b", "xy"}});
  std::string inner_local(reinterpret_cast<const char*>(inner.data()), 30 + 1 + 2);
  std::vector<std::byte> zip = BuildZip({{"a", inner_local}, {"b", "xy"}});
  uint64_t b_record = CentralRecords(zip)[1];
  StoreLE32(zip.data() + b_record + 42, 30 + 1);  // a's payload offset
  auto archive = ParseZipArchive(zip, ParseLimits{});
  ASSERT_FALSE(archive.ok());
  EXPECT_NE(archive.status().message().find("overlap"), std::string::npos) << archive.status().ToString();
}

TEST(ZipArchiveTest, LyingStructuresAreRejected) {
  std::vector<std::byte> good = BuildZip({{"x/data.pkl", "not a pickle"}, {"x/data/0", "12345678"}});
  ASSERT_TRUE(ParseZipArchive(good, ParseLimits{}).ok());
  uint64_t rec = CentralRecords(good)[1];
  struct Case {
    const char* what;
    uint64_t offset;
    uint32_t value;
  };
  for (const Case& c : {Case{"size larger", rec + 20, 9}, Case{"size smaller", rec + 24, 7},
                        Case{"size huge", rec + 20, 0x7fffffff}, Case{"offset past end", rec + 42, 100000},
                        Case{"offset onto other header", rec + 42, 0}, Case{"crc", rec + 16, 1234}}) {
    std::vector<std::byte> bad = good;
    StoreLE32(bad.data() + c.offset, c.value);
    EXPECT_FALSE(ParseZipArchive(bad, ParseLimits{}).ok()) << c.what;
    EXPECT_TRUE(IsOpaque(DetectLayout(bad), bad.size())) << c.what;
  }
  // End record claims a central directory that starts one byte late.
  std::vector<std::byte> bad = good;
  uint64_t eocd = bad.size() - 22;
  StoreLE32(bad.data() + eocd + 16, LoadLE32(bad.data() + eocd + 16) + 1);
  EXPECT_FALSE(ParseZipArchive(bad, ParseLimits{}).ok());
  // More entries than the directory can hold.
  bad = good;
  StoreLE16(bad.data() + eocd + 10, 500);
  EXPECT_FALSE(ParseZipArchive(bad, ParseLimits{}).ok());
  // Entry limit.
  ParseLimits tight;
  tight.max_zip_entries = 1;
  EXPECT_EQ(ParseZipArchive(good, tight).status().code(), StatusCode::kInvalidArgument);
}

TEST(ZipArchiveTest, TorchFileWithLyingSizeIsOpaqueWithReason) {
  std::vector<std::byte> file = ReadFixture("torch_dtypes.pt");
  uint64_t rec = FirstDataRecord(file);
  for (uint32_t delta : {1u, 64u}) {
    std::vector<std::byte> bad = file;
    StoreLE32(bad.data() + rec + 20, LoadLE32(bad.data() + rec + 20) + delta);
    StoreLE32(bad.data() + rec + 24, LoadLE32(bad.data() + rec + 24) + delta);
    ExpectOpaqueWithReason(bad, "zip");
  }
}

TEST(ZipArchiveTest, CompressedTensorRecordIsOpaqueWithReason) {
  std::vector<std::byte> file = ReadFixture("torch_dtypes.pt");
  uint64_t rec = FirstDataRecord(file);
  uint64_t local = LoadLE32(file.data() + rec + 42);
  StoreLE16(file.data() + rec + 10, 8);
  StoreLE16(file.data() + local + 8, 8);
  ExpectOpaqueWithReason(file, "compressed");
}

TEST(ZipArchiveTest, MissingStorageRecordIsOpaqueWithReason) {
  std::vector<std::byte> file = ReadFixture("torch_dtypes.pt");
  uint64_t rec = FirstDataRecord(file);
  uint64_t local = LoadLE32(file.data() + rec + 42);
  uint16_t name_length = LoadLE16(file.data() + rec + 28);
  // Rename the record in both headers so that its storage key is not found.
  file[rec + 46 + name_length - 1] = std::byte{'Q'};
  file[local + 30 + name_length - 1] = std::byte{'Q'};
  ExpectOpaqueWithReason(file, "has no record");
}

TEST(ZipArchiveTest, HostilePicklesInTorchZipAreOpaqueWithReason) {
  std::string deep(100000, '(');
  std::string wide;
  for (int i = 0; i < 100000; ++i) wide += "]";  // many lists, then no STOP
  std::string future_protocol = std::string("\x80\x07") + "N.";
  for (const std::string& pickle : {deep + "N.", wide, future_protocol}) {
    std::vector<std::byte> zip = BuildZip({{"m/data.pkl", pickle}, {"m/data/0", "12345678"}});
    Layout layout = DetectLayout(zip);
    EXPECT_TRUE(IsOpaque(layout, zip.size()));
    EXPECT_NE(layout.fallback_reason.find("pickle"), std::string::npos) << layout.fallback_reason;
  }
  // A pickle naming a callable is only ever a symbol: a torch file, no tensors.
  std::string proto2 = std::string("\x80\x02");
  std::string call_os_system =
      proto2 + "cos\nsystem\n" + "X" + std::string("\x02\x00\x00\x00", 4) + "ls" + std::string("\x85") + "R.";
  std::vector<std::byte> zip = BuildZip({{"m/data.pkl", call_os_system}});
  Layout layout = DetectLayout(zip);
  EXPECT_EQ(layout.format, FileFormat::kTorchZip) << layout.fallback_reason;
  EXPECT_TRUE(layout.tensors.empty());
}

bool HaveTool(const char* path) { return std::filesystem::exists(path); }

int Run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

void WriteFile(const std::string& path, ByteSpan data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// Alters every tensor payload, then checks that strict zip readers reject the
// file before RewriteZipCrc32 and accept it after.
void CheckRewrite(const char* fixture) {
  SCOPED_TRACE(fixture);
  std::vector<std::byte> file = ReadFixture(fixture);
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kTorchZip);
  for (const Segment& s : layout.segments)
    if (s.is_tensor())
      for (uint64_t i = 0; i < s.length; ++i) file[s.offset + i] ^= std::byte{0x11};
  std::string path = ::testing::TempDir() + "/rewrite_" + std::to_string(::getpid()) + "_" + fixture;
  std::string python =
      "/usr/bin/python3 -c \"import zipfile,sys; assert zipfile.ZipFile(sys.argv[1]).testzip() is None\" ";
  WriteFile(path, file);
  EXPECT_NE(Run(python + path), 0) << "altered payloads must fail the CRC check first";
  EXPECT_NE(Run("unzip -tq " + path), 0);
  ASSERT_TRUE(RewriteZipCrc32(file).ok());
  WriteFile(path, file);
  EXPECT_EQ(Run(python + path), 0);
  EXPECT_EQ(Run("unzip -tq " + path), 0);
  // The rewritten file parses to the same layout.
  EXPECT_EQ(testing::Summaries(DetectLayout(file)), testing::Summaries(layout));
  std::remove(path.c_str());
}

TEST(ZipArchiveTest, RewriteZipCrc32MakesAlteredFilesValidForStrictReaders) {
  if (!HaveTool("/usr/bin/python3") || !HaveTool("/usr/bin/unzip")) GTEST_SKIP() << "needs python3 and unzip";
  CheckRewrite("torch_optim.pt");
  CheckRewrite("torch_repacked_zip64.pt");
}

TEST(ZipArchiveTest, RewriteRefusesCompressedEntriesAndLeavesFileAlone) {
  std::vector<std::byte> zip = BuildZip({{"a", "abc"}, {"b", "def", 8}});
  std::vector<std::byte> before = zip;
  EXPECT_EQ(RewriteZipCrc32(zip).code(), StatusCode::kUnsupported);
  EXPECT_EQ(zip, before);
}

}  // namespace
}  // namespace ckptfs
