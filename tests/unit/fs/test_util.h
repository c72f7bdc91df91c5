// Helpers for the fs/ unit tests: a temporary backing directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/io.h"
#include "fs/store.h"

namespace ckptfs::fs::testing {

// A fresh directory under $TMPDIR, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ckptfs-fs-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = std::byte(rng() & 0xff);
  return out;
}

// Opens (creating) the store of `backing` as a daemon does: with a claimed
// staging area.
inline std::unique_ptr<Store> OpenDaemonStore(const std::string& backing) {
  auto store = Store::Open(backing, StoreOptions{});
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->ClaimStagingArea().ok());
  return std::move(*store);
}

}  // namespace ckptfs::fs::testing
