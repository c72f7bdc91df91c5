// Helpers for the fs/ unit tests: a temporary backing directory.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/io.h"
#include "fs/commit_pipeline.h"
#include "fs/manifest.h"
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

// A float32 .npy of `n` values (every 64th shifted by `shift`): the codec
// deltas one version against another.
inline std::vector<std::byte> Npy(size_t n, uint32_t seed, float shift) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string head = std::string("\x93NUMPY\x01\x00", 8);
  head += static_cast<char>(header.size() & 0xff);
  head += static_cast<char>(header.size() >> 8);
  head += header;
  std::vector<std::byte> out(head.size() + 4 * n);
  std::memcpy(out.data(), head.data(), head.size());
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    float v = static_cast<float>(x >> 8) / 16777216.0f - 0.5f + (i % 64 == 0 ? shift : 0.0f);
    std::memcpy(out.data() + head.size() + 4 * i, &v, 4);
  }
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

// Commits `bytes` as the file `rel` of the store (directories created).
inline Result<EncodedVersion> Commit(Store& store, const std::string& rel, const std::vector<std::byte>& bytes,
                                     const CommitOptions& options = {}, const std::vector<BaseCandidate>& bases = {}) {
  const std::string path = store.backing() + "/" + rel;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) return Status::Io(errno, "open " + path);
  Manifest manifest;
  auto m = ReadManifest(fd);
  if (m.ok() && m->has_value()) manifest = **m;
  else if (Status init = InitEmptyManifest(fd, false); !init.ok()) return init;
  else manifest.sequence = 2;
  auto staging = store.CreateStaging();
  if (!staging.ok()) return staging.status();
  EXPECT_EQ(::pwrite((*staging)->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  auto v = CommitStagedFile(store, fd, &manifest, **staging, bases, options, nullptr, rel);
  ::close(fd);
  return v;
}

}  // namespace ckptfs::fs::testing
