// EncodeBlob with a lossy budget: round trips, achieved error per tensor,
// closed-loop delta chains, zip CRCs of reconstructed torch files, exact
// non-float bytes, hostile parameters.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "format_test_util.h"

namespace ckptfs {
namespace {

using testing::Encode;
using testing::FileBuilder;
using testing::MapResolver;
using testing::NormalBF16;
using testing::NormalF32;
using testing::OpenBytes;
using testing::RandomBytes;

EncodeOptions LossyOptions(double rel_l2, uint64_t chunk_bytes = 64 << 10) {
  EncodeOptions o;
  o.chunk_bytes = chunk_bytes;
  o.lossy_budget = [rel_l2](FileFormat, const TensorInfo&) { return lossy::Budget{rel_l2, 0}; };
  return o;
}

// Relative L2 error of segment `s` of `got` against `want` (f32/bf16).
double SegmentRelL2(DType dtype, const Segment& s, ByteSpan want, ByteSpan got) {
  ErrorSums e = MeasureError(dtype, want.subspan(s.offset, s.length), got.subspan(s.offset, s.length));
  return e.ref2 > 0 ? std::sqrt(e.err2 / e.ref2) : 0.0;
}

FileBuilder MixedFile(uint32_t seed) {
  FileBuilder f;
  std::vector<std::byte> header = RandomBytes(300, seed);
  std::vector<std::byte> ints = RandomBytes(8 * 1000, seed + 1);
  std::vector<std::byte> bools(777);
  for (size_t i = 0; i < bools.size(); ++i) bools[i] = std::byte(i % 3 == 0);
  f.Verbatim(header)
      .Tensor("w", DType::kF32, {200, 300}, NormalF32(60000, seed + 2))
      .Tensor("steps", DType::kI64, {1000}, ints)
      .Tensor("h", DType::kBF16, {50000}, NormalBF16(50000, seed + 3))
      .Tensor("mask", DType::kBool, {777}, bools)
      .Verbatim(RandomBytes(100, seed + 4));
  return f;
}

// With trellis-coded quantization on (EncodeOptions::trellis) the f32
// tensor's chunks are in trellis mode, the blob is smaller, and every tensor
// is within its budget; the report counts the chunks.
TEST(ContainerLossy, TrellisChunksRoundTripSmaller) {
  FileBuilder f = MixedFile(11);
  EncodeOptions on = LossyOptions(0.3);
  on.trellis = true;
  std::vector<std::byte> with = Encode(f.bytes, f.layout, on);
  std::vector<std::byte> without = Encode(f.bytes, f.layout, LossyOptions(0.3));
  EXPECT_LT(with.size(), 0.95 * without.size());
  auto reader = OpenBytes(with);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<std::vector<std::byte>> got = DecodeAll(**reader);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (const Segment& s : f.layout.segments) {
    if (!s.is_tensor() || !IsCodecFloat(f.layout.tensors[s.tensor].dtype)) continue;
    EXPECT_LE(SegmentRelL2(f.layout.tensors[s.tensor].dtype, s, f.bytes, *got), 0.3 * (1 + 1e-9));
  }
  Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**reader);
  ASSERT_TRUE(reports.ok());
  uint32_t trellis = 0;
  for (const TensorLossyReport& r : *reports) {
    if (f.layout.tensors[r.tensor].name == "w") {
      EXPECT_EQ(r.trellis_chunks, r.chunks) << "every chunk of w";
    }
    trellis += r.trellis_chunks;
  }
  EXPECT_GT(trellis, 0u);
}

TEST(ContainerLossy, RoundTripWithinBudgetAndExactElsewhere) {
  FileBuilder f = MixedFile(1);
  EncodeStats stats;
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, LossyOptions(1e-2), nullptr, &stats);
  EXPECT_GT(stats.lossy_chunks, 0u);
  EXPECT_GT(stats.max_rel_l2, 0.0);
  EXPECT_LE(stats.max_rel_l2, 1e-2);
  std::vector<std::byte> lossless = Encode(f.bytes, f.layout);
  EXPECT_LT(blob.size() * 2, lossless.size()) << "lossy should be far smaller than lossless";

  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<std::vector<std::byte>> once = DecodeAll(**reader);
  ASSERT_TRUE(once.ok()) << once.status().ToString();
  Result<std::vector<std::byte>> twice = DecodeAll(**reader);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(*once, *twice);
  ASSERT_EQ(once->size(), f.bytes.size());
  EXPECT_NE(*once, f.bytes);

  for (const Segment& s : f.layout.segments) {
    ByteSpan want = ByteSpan(f.bytes).subspan(s.offset, s.length);
    ByteSpan got = ByteSpan(*once).subspan(s.offset, s.length);
    if (!s.is_tensor() || !IsCodecFloat(f.layout.tensors[s.tensor].dtype)) {
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "segment at " << s.offset;
      continue;
    }
    const double err = SegmentRelL2(f.layout.tensors[s.tensor].dtype, s, f.bytes, *once);
    EXPECT_GT(err, 0.0);
    EXPECT_LE(err, 1e-2 * (1 + 1e-9));
  }

  Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**reader);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 2u);  // w and h
  for (const TensorLossyReport& r : *reports) {
    const Segment& s = f.layout.segments[r.tensor + 1];
    ASSERT_EQ(s.tensor, r.tensor);
    EXPECT_NEAR(r.rel_l2, SegmentRelL2(f.layout.tensors[r.tensor].dtype, s, f.bytes, *once), 1e-9);
    EXPECT_GT(r.max_bits, 0);
    EXPECT_GT(r.max_abs, 0.0);
  }
}

TEST(ContainerLossy, OutputDoesNotDependOnTheThreadCount) {
  FileBuilder f = MixedFile(4);
  EncodeOptions one = LossyOptions(1e-2, 16 << 10);
  EncodeOptions three = one;
  three.threads = 3;
  std::vector<std::byte> a = Encode(f.bytes, f.layout, one);
  std::vector<std::byte> b = Encode(f.bytes, f.layout, three);
  EXPECT_EQ(a, b);
}

// The encoder reuses its reconstruction buffer from one file to the next
// without clearing it: chunks stored exactly (all zeros, non-float) must
// still put their own bytes there, or the stored file checksum and the
// bytes read back would carry the previous file's values.
TEST(ContainerLossy, ExactChunksAfterAnEarlierEncodeOnTheSameThread) {
  FileBuilder first = MixedFile(5);
  ASSERT_FALSE(Encode(first.bytes, first.layout, LossyOptions(1e-2)).empty());
  FileBuilder f;
  f.Verbatim(RandomBytes(300, 6))
      .Tensor("w", DType::kF32, {200, 300}, std::vector<std::byte>(240000))
      .Tensor("steps", DType::kI64, {1000}, RandomBytes(8000, 7))
      .Tensor("h", DType::kBF16, {50000}, NormalBF16(50000, 8))
      .Tensor("mask", DType::kBool, {777}, std::vector<std::byte>(777, std::byte{1}))
      .Verbatim(RandomBytes(100, 9));
  ASSERT_EQ(f.bytes.size(), first.bytes.size());
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, LossyOptions(1e-2));
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<std::vector<std::byte>> all = DecodeAll(**reader);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  for (const Segment& s : f.layout.segments) {
    if (s.is_tensor() && f.layout.tensors[s.tensor].name == "h") continue;  // lossy
    EXPECT_TRUE(std::equal(f.bytes.begin() + s.offset, f.bytes.begin() + s.offset + s.length,
                           all->begin() + s.offset))
        << "segment at " << s.offset;
  }
}

TEST(ContainerLossy, ZeroBudgetIsBitExact) {
  FileBuilder f = MixedFile(2);
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, LossyOptions(0));
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok());
  Result<std::vector<std::byte>> all = DecodeAll(**reader);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, f.bytes);
  for (const ChunkInfo& c : (*reader)->chunks()) EXPECT_NE(c.codec, ChunkCodec::kLossy);
}

TEST(ContainerLossy, DeltaChainStaysWithinBudget) {
  // 20 versions, each a small step from the previous one; every version is
  // encoded against the previous blob, whose reconstruction is the base.
  constexpr double kBudget = 2e-2;
  MapResolver resolver;
  std::vector<std::byte> weights = NormalF32(40000, 7, 0.05f);
  std::shared_ptr<const BlobReader> previous;
  std::optional<ObjectId> previous_id;
  uint32_t delta_versions = 0;
  uint64_t total_stored = 0;
  for (int v = 0; v < 20; ++v) {
    std::vector<std::byte> step = NormalF32(40000, 100 + v, 0.001f);
    for (size_t i = 0; i < 40000; ++i) {
      float a, d;
      std::memcpy(&a, weights.data() + 4 * i, 4);
      std::memcpy(&d, step.data() + 4 * i, 4);
      a += d;
      std::memcpy(weights.data() + 4 * i, &a, 4);
    }
    FileBuilder f;
    f.Verbatim(RandomBytes(64, 5)).Tensor("w", DType::kF32, {40000}, weights);
    BaseRef base{previous_id.value_or(ObjectId{}), previous};
    EncodeStats stats;
    std::vector<std::byte> blob =
        Encode(f.bytes, f.layout, LossyOptions(kBudget, 32 << 10), previous ? &base : nullptr, &stats);
    total_stored += blob.size();
    if (stats.uses_base) ++delta_versions;
    ObjectId id = resolver.Add(blob);
    auto reader = resolver.OpenBlob(id);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    Result<std::vector<std::byte>> got = DecodeAll(**reader);
    ASSERT_TRUE(got.ok()) << "version " << v << ": " << got.status().ToString();
    const double err = SegmentRelL2(DType::kF32, f.layout.segments[1], f.bytes, *got);
    EXPECT_LE(err, kBudget * (1 + 1e-9)) << "version " << v;
    previous = *reader;
    previous_id = id;
  }
  EXPECT_GT(delta_versions, 10u) << "small steps should be stored as lossy deltas";
  EXPECT_LT(total_stored, 20u * 40000u * 4u / 4u);
}

bool HaveTool(const char* path) { return std::filesystem::exists(path); }

TEST(ContainerLossy, TorchZipCrcsOfTheReconstructionAreValid) {
  // A larger npz than the fixture (whose arrays are too small to quantize).
  const std::string big_npz = ::testing::TempDir() + "/lossy_big_" + std::to_string(::getpid()) + ".npz";
  const bool have_numpy =
      HaveTool("/usr/bin/python3") &&
      std::system(("/usr/bin/python3 -c \"import numpy as n; r = n.random.RandomState(0); n.savez('" + big_npz +
                   "', w=r.randn(60000).astype('f4'), ids=n.arange(100))\" >/dev/null 2>&1")
                      .c_str()) == 0;
  for (const char* name : {"torch_large.pt", "torch_optim.pt", "torch_dtypes.pt", "arrays.npz", "big.npz"}) {
    SCOPED_TRACE(name);
    const bool big = std::string(name) == "big.npz";
    if (big && !have_numpy) continue;
    std::vector<std::byte> file;
    if (big) {
      Result<std::vector<std::byte>> read = ReadWholeFile(big_npz);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      file = std::move(*read);
    } else {
      file = testing::ReadFixture(name);
    }
    Layout layout = DetectLayout(file);
    const FileFormat format = layout.format;
    ASSERT_TRUE(format == FileFormat::kTorchZip || format == FileFormat::kNpz);
    ASSERT_FALSE(layout.zip_crcs.empty());
    EncodeOptions options = LossyOptions(5e-2, 16 << 10);
    EncodeStats stats;
    std::vector<std::byte> blob = Encode(file, layout, options, nullptr, &stats);
    if (std::string(name) == "torch_large.pt" || big) {
      EXPECT_GT(stats.lossy_chunks, 0u);
    }
    auto reader = OpenBytes(blob);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    Result<std::vector<std::byte>> got = DecodeAll(**reader);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (stats.lossy_chunks > 0) {
      EXPECT_NE(*got, file);
    }
    // Every zip entry's CRC fields match its (reconstructed) payload.
    for (const ZipCrcField& field : layout.zip_crcs) {
      const uint32_t crc = Crc32(ByteSpan(*got).subspan(field.payload_offset, field.payload_length));
      for (uint64_t at : field.crc_offsets) EXPECT_EQ(LoadLE32(got->data() + at), crc) << "crc at " << at;
    }
    // Outside float tensors only the CRC fields may differ.
    std::vector<bool> is_crc(file.size());
    for (const ZipCrcField& field : layout.zip_crcs)
      for (uint64_t at : field.crc_offsets)
        for (uint64_t k = 0; k < 4; ++k) is_crc[at + k] = true;
    for (const Segment& s : layout.segments) {
      if (s.is_tensor() && IsCodecFloat(layout.tensors[s.tensor].dtype)) continue;
      for (uint64_t at = s.offset; at < s.offset + s.length; ++at) {
        if (!is_crc[at]) {
          ASSERT_EQ((*got)[at], file[at]) << "byte " << at;
        }
      }
    }
    Layout again = DetectLayout(*got);
    EXPECT_EQ(again.format, format) << again.fallback_reason;
    const std::string path = ::testing::TempDir() + "/lossy_" + std::to_string(::getpid()) + "_" + name;
    { std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(got->data()), got->size()); }
    if (HaveTool("/usr/bin/python3")) {
      EXPECT_EQ(std::system(("/usr/bin/python3 -m zipfile -t " + path + " >/dev/null 2>&1").c_str()), 0);
    }
    if (HaveTool("/usr/bin/unzip")) {
      EXPECT_EQ(std::system(("/usr/bin/unzip -tq " + path + " >/dev/null 2>&1").c_str()), 0);
    }
    std::filesystem::remove(path);
  }
  std::filesystem::remove(big_npz);
}

TEST(ContainerLossy, HostileParamsAreRejected) {
  FileBuilder f = MixedFile(3);
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, LossyOptions(1e-2));
  size_t lossy_chunk = 0;
  {
    auto reader = OpenBytes(blob);
    ASSERT_TRUE(reader.ok());
    while ((*reader)->chunks()[lossy_chunk].codec != ChunkCodec::kLossy) ++lossy_chunk;
  }
  using Edit = std::function<void(BlobIndex&, std::vector<std::vector<std::byte>>&)>;
  const std::vector<Edit> edits = {
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk].clear(); },
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk].push_back(std::byte{0}); },
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk][0] = std::byte{9}; },            // version
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk][1] = std::byte{0x80}; },         // flags
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk][1] = std::byte{1}; },            // delta, no base
      [&](BlobIndex& i, auto&) { i.params[lossy_chunk][15] = std::byte{0xff}; },        // NaN sum
      [&](BlobIndex& i, auto&) { i.params[0].assign(64, std::byte{0}); },               // params on verbatim
      [&](BlobIndex& i, auto&) { i.chunks[0].codec = ChunkCodec::kLossy; },             // lossy on verbatim
  };
  for (size_t e = 0; e < edits.size(); ++e) {
    Result<std::shared_ptr<const BlobReader>> r = OpenBytes(testing::RewriteBlob(blob, edits[e]));
    EXPECT_FALSE(r.ok()) << "edit " << e;
  }
  // A damaged stream with intact checksums is Corruption on read, not a crash.
  std::vector<std::byte> bad = testing::RewriteBlob(blob, [&](BlobIndex&, auto& payloads) {
    for (size_t k = 20; k < payloads[lossy_chunk].size(); k += 7) payloads[lossy_chunk][k] ^= std::byte{0x5a};
  });
  auto reader = OpenBytes(bad);
  ASSERT_TRUE(reader.ok());
  std::vector<std::byte> out((*reader)->chunks()[lossy_chunk].logical_length);
  Status s = (*reader)->ReadAt((*reader)->chunks()[lossy_chunk].logical_offset, out);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace ckptfs
