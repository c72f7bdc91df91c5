// Parsing must read only structure (zip directory, data.pkl, JSON and npy
// headers), never tensor payloads: the payload pages are made unreadable
// and DetectLayout must still succeed (any touch would fault).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "codec/format/layout.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {

// An anonymous mapping, unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::byte* data() const { return data_; }

  // Makes the whole pages inside [offset, offset + length) unreadable.
  void ProtectInterior(uint64_t offset, uint64_t length) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    uint64_t begin = (offset + page - 1) / page * page;
    uint64_t end = (offset + length) / page * page;
    if (end > begin) {
      ASSERT_EQ(mprotect(data_ + begin, end - begin, PROT_NONE), 0);
    }
  }

 private:
  std::byte* data_;
  size_t size_;
};

TEST(FormatNoTouchTest, TorchPayloadsAreNotRead) {
  std::vector<std::byte> file = testing::ReadFixture("torch_large.pt");
  Layout reference = DetectLayout(file);
  ASSERT_EQ(reference.format, FileFormat::kTorchZip);
  Mapping map(file.size());
  ASSERT_NE(map.data(), nullptr);
  std::memcpy(map.data(), file.data(), file.size());
  int protected_segments = 0;
  for (const Segment& s : reference.segments) {
    if (s.is_tensor() && s.length >= 2 * 4096) {
      map.ProtectInterior(s.offset, s.length);
      ++protected_segments;
    }
  }
  ASSERT_GE(protected_segments, 1);
  Layout layout = DetectLayout(ByteSpan(map.data(), file.size()));
  EXPECT_EQ(layout.format, FileFormat::kTorchZip);
  EXPECT_EQ(testing::Summaries(layout), testing::Summaries(reference));
}

TEST(FormatNoTouchTest, OneGigabyteSafetensorsParsesInMilliseconds) {
  const uint64_t buffer = 1ull << 30;
  std::string json = R"({"w":{"dtype":"BF16","shape":[32768,16384],"data_offsets":[0,1073741824]}})";
  const uint64_t header = 8 + json.size();
  Mapping map(header + buffer);
  ASSERT_NE(map.data(), nullptr);
  StoreLE64(map.data(), json.size());
  std::memcpy(map.data() + 8, json.data(), json.size());
  map.ProtectInterior(header, buffer);
  auto start = std::chrono::steady_clock::now();
  Layout layout = DetectLayout(ByteSpan(map.data(), header + buffer));
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(layout.format, FileFormat::kSafetensors) << layout.fallback_reason;
  EXPECT_EQ(testing::Summaries(layout), (std::vector<std::string>{"w bf16 [32768,16384]"}));
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 100);
}

TEST(FormatNoTouchTest, NpyPayloadIsNotRead) {
  const uint64_t data = 64ull << 20;
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4096, 4096), }";
  dict.resize(118, ' ');
  dict += '\n';
  Mapping map(10 + dict.size() + data);
  ASSERT_NE(map.data(), nullptr);
  std::memcpy(map.data(), "\x93NUMPY\x01\x00", 8);
  StoreLE16(map.data() + 8, static_cast<uint16_t>(dict.size()));
  std::memcpy(map.data() + 10, dict.data(), dict.size());
  map.ProtectInterior(10 + dict.size(), data);
  Layout layout = DetectLayout(ByteSpan(map.data(), 10 + dict.size() + data));
  ASSERT_EQ(layout.format, FileFormat::kNpy) << layout.fallback_reason;
  EXPECT_EQ(testing::Summaries(layout), (std::vector<std::string>{"array f32 [4096,4096]"}));
}

}  // namespace
}  // namespace ckptfs
