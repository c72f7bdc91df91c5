// DetectLayout against fixtures written by scripts/make-format-fixtures.py:
// names, dtypes and shapes must equal what torch/numpy/the writer reported,
// and every layout must cover its file exactly once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "codec/common/hash.h"
#include "codec/format/layout.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {

using testing::FormatsDir;
using testing::IsOpaque;
using testing::ReadFixture;
using testing::Summaries;

std::vector<std::string> ExpectedSummaries(const nlohmann::json& expected) {
  std::vector<std::string> out;
  for (const auto& t : expected["tensors"]) {
    std::string s = t["name"].get<std::string>() + " " + t["dtype"].get<std::string>() + " [";
    for (size_t i = 0; i < t["shape"].size(); ++i) s += (i ? "," : "") + std::to_string(t["shape"][i].get<uint64_t>());
    out.push_back(s + "]");
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FormatDetectTest, FixturesMatchWhatTheirWritersReported) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(FormatsDir())) {
    std::string path = entry.path().string();
    if (!path.ends_with(".json")) continue;
    std::string fixture = entry.path().stem().string();  // drops ".json"
    SCOPED_TRACE(fixture);
    std::ifstream in(path);
    nlohmann::json expected = nlohmann::json::parse(in);
    std::vector<std::byte> file = ReadFixture(fixture);
    Layout layout = DetectLayout(file);
    ASSERT_TRUE(ValidateLayout(layout, file.size()).ok()) << ValidateLayout(layout, file.size()).ToString();
    EXPECT_EQ(FileFormatName(layout.format), expected["format"].get<std::string>()) << layout.fallback_reason;
    EXPECT_EQ(layout.fallback_reason, "");
    EXPECT_EQ(Summaries(layout), ExpectedSummaries(expected));
    // Every tensor owns exactly one segment.
    std::vector<int> owners(layout.tensors.size(), 0);
    for (const Segment& s : layout.segments)
      if (s.is_tensor()) ++owners[s.tensor];
    for (int n : owners) EXPECT_EQ(n, 1);
    ++checked;
  }
  EXPECT_GE(checked, 19);
}

TEST(FormatDetectTest, TorchZipRecordsCrcLocationsOfEachTensor) {
  std::vector<std::byte> file = ReadFixture("torch_optim.pt");
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kTorchZip);
  ASSERT_EQ(layout.zip_crcs.size(), layout.tensors.size());
  for (size_t i = 0; i < layout.zip_crcs.size(); ++i) {
    const ZipCrcField& f = layout.zip_crcs[i];
    // torch writes a data descriptor: the CRC sits in it and in the central
    // directory (the local header holds zero).
    EXPECT_EQ(f.crc_offsets.size(), 2u);
    for (uint64_t at : f.crc_offsets) {
      ASSERT_LE(at + 4, file.size());
      EXPECT_EQ(LoadLE32(file.data() + at), Crc32(ByteSpan(file).subspan(f.payload_offset, f.payload_length)));
    }
  }
  // Tensor payloads are 64-byte aligned in torch files.
  for (const Segment& s : layout.segments) {
    if (s.is_tensor()) {
      EXPECT_EQ(s.offset % 64, 0u);
    }
  }
}

TEST(FormatDetectTest, RepackedZipWithoutDescriptorsHasCrcInLocalHeader) {
  std::vector<std::byte> file = ReadFixture("torch_repacked_zip64.pt");
  Layout layout = DetectLayout(file);
  ASSERT_EQ(layout.format, FileFormat::kTorchZip) << layout.fallback_reason;
  ASSERT_FALSE(layout.zip_crcs.empty());
  for (const ZipCrcField& f : layout.zip_crcs) {
    EXPECT_EQ(f.crc_offsets.size(), 2u);  // local header and central directory
    for (uint64_t at : f.crc_offsets)
      EXPECT_EQ(LoadLE32(file.data() + at), Crc32(ByteSpan(file).subspan(f.payload_offset, f.payload_length)));
  }
}

TEST(FormatDetectTest, BytesIoSaveUsesArchivePrefix) {
  std::vector<std::byte> file = ReadFixture("torch_bytesio.pt");
  EXPECT_NE(std::string_view(reinterpret_cast<const char*>(file.data()) + 30, 8), "torch_by");
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(file.data()) + 30, 8), "archive/");
  EXPECT_EQ(DetectLayout(file).format, FileFormat::kTorchZip);
}

TEST(FormatDetectTest, UnsupportedNumpyDtypesAreOpaqueWithReason) {
  for (const char* name : {"object.npy", "structured.npy", "compressed.npz"}) {
    std::vector<std::byte> file = ReadFixture(name);
    Layout layout = DetectLayout(file);
    EXPECT_TRUE(IsOpaque(layout, file.size())) << name;
    EXPECT_NE(layout.fallback_reason, "") << name;
  }
}

TEST(FormatDetectTest, TinyAndRandomInputsAreOpaque) {
  for (size_t n : {0, 1, 2, 7, 8, 9}) {
    std::vector<std::byte> file(n, std::byte{0});
    Layout layout = DetectLayout(file);
    EXPECT_TRUE(IsOpaque(layout, n)) << n;
    EXPECT_EQ(layout.fallback_reason, "");
  }
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::byte> file(rng() % 4096);
    for (auto& b : file) b = std::byte(rng() & 0xff);
    Layout layout = DetectLayout(file);
    EXPECT_TRUE(IsOpaque(layout, file.size()));
  }
}

// Every prefix of a torch file, and the file with one byte flipped at every
// position, must give a valid layout and never crash.
TEST(FormatDetectTest, TruncatedAndFlippedTorchFilesNeverCrash) {
  std::vector<std::byte> file = ReadFixture("torch_bytesio.pt");
  ASSERT_EQ(DetectLayout(file).format, FileFormat::kTorchZip);
  for (size_t n = 0; n < file.size(); ++n) {
    ByteSpan prefix(file.data(), n);
    Layout layout = DetectLayout(prefix);
    ASSERT_TRUE(IsOpaque(layout, n)) << n;
    if (n >= 4) {
      EXPECT_NE(layout.fallback_reason, "") << n;  // it starts like a zip
    }
  }
  for (size_t i = 0; i < file.size(); ++i) {
    std::vector<std::byte> bad = file;
    bad[i] ^= std::byte{0x5a};
    Layout layout = DetectLayout(bad);
    ASSERT_TRUE(ValidateLayout(layout, bad.size()).ok()) << i;
  }
}

TEST(FormatDetectTest, TruncatedSafetensorsAndNpyAreOpaque) {
  for (const char* name : {"model.safetensors", "v1_f32.npy", "v3_i64.npy"}) {
    std::vector<std::byte> file = ReadFixture(name);
    ASSERT_NE(DetectLayout(file).format, FileFormat::kOpaque) << name;
    for (size_t n = 0; n < file.size(); ++n) {
      Layout layout = DetectLayout(ByteSpan(file.data(), n));
      ASSERT_TRUE(IsOpaque(layout, n)) << name << " " << n;
    }
  }
}

TEST(FormatDetectTest, DetectionIgnoresNamesAndIsDeterministic) {
  std::vector<std::byte> file = ReadFixture("torch_dtypes.pt");
  Layout a = DetectLayout(file);
  Layout b = DetectLayout(file);
  ASSERT_EQ(a.segments.size(), b.segments.size());
  for (size_t i = 0; i < a.segments.size(); ++i) {
    EXPECT_EQ(a.segments[i].offset, b.segments[i].offset);
    EXPECT_EQ(a.segments[i].tensor, b.segments[i].tensor);
  }
  EXPECT_EQ(Summaries(a), Summaries(b));
}

}  // namespace
}  // namespace ckptfs
