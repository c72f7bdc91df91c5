// Blobs frozen from earlier builds (tests/data/golden/README.md) still open,
// verify and decode to the file their writer recorded.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "blob_test_util.h"
#include "codec/container/lossy_report.h"

namespace ckptfs {
namespace {

std::vector<std::byte> ReadGolden(const std::string& dir, const std::string& name) {
  const std::string path = std::string(CKPTFS_SOURCE_DIR) + "/tests/data/golden/" + dir + "/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

struct Golden {
  const char* dir;
  uint64_t file_checksum;      // of version 1's reconstructed file, as written
  uint32_t predicted_chunks;   // in version 1
  uint32_t step_space_chunks = 0;  // in version 1
  uint64_t logical_size = 116387;
};

TEST(GoldenBlobs, EarlierFormatVersionsStillDecode) {
  for (const Golden& g : {Golden{"lossy-params-v3", 0x4573aacc5533c5dbull, 0},
                          Golden{"lossy-params-v4", 0x96f56eb3fda91c66ull, 2},
                          Golden{"log-zero-carry", 0xffce141ace25c38bull, 1},
                          Golden{"lossy-params-v5", 0x0224a245092db4a4ull, 1, 1},
                          Golden{"rans-symbols", 0xd431f9d9442634a7ull, 2, 1, 228515}}) {
    SCOPED_TRACE(g.dir);
    testing::MapResolver resolver;
    resolver.Add(ReadGolden(g.dir, "version0.blob"));
    const ObjectId id = resolver.Add(ReadGolden(g.dir, "version1.blob"));
    Result<std::shared_ptr<const BlobReader>> reader = resolver.OpenBlob(id);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->file_checksum(), g.file_checksum);
    EXPECT_EQ((*reader)->logical_size(), g.logical_size);
    for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c)
      EXPECT_TRUE((*reader)->VerifyChunk(c).ok()) << "chunk " << c;
    Result<std::vector<std::byte>> file = DecodeAll(**reader);  // checks the whole-file checksum
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(**reader);
    ASSERT_TRUE(reports.ok());
    uint32_t predicted = 0, step_space = 0;
    for (const TensorLossyReport& r : *reports) {
      predicted += r.predicted_chunks;
      step_space += r.step_space_chunks;
      if (r.log_chunks == 0) {  // (log mode has a per-element bound instead)
        EXPECT_LE(r.rel_l2, r.budget_rel_l2 * (1 + 1e-9));
      }
    }
    EXPECT_EQ(predicted, g.predicted_chunks);
    EXPECT_EQ(step_space, g.step_space_chunks);
  }
}

}  // namespace
}  // namespace ckptfs
