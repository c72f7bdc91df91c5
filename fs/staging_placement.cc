#include "fs/staging_placement.h"

#include <sys/vfs.h>

#include <array>
#include <cstdint>

#include "fs/store.h"

namespace ckptfs::fs {
namespace {

// statfs(2) f_type values of filesystems that other machines may share.
constexpr std::array<uint64_t, 11> kSharedMagics = {
    0x65735546,  // FUSE (GlusterFS, CephFS-fuse, s3fs, JuiceFS, ...)
    0x6969,      // NFS
    0xff534d42,  // CIFS
    0xfe534d42,  // SMB2
    0x517b,      // SMB
    0x00c36400,  // CephFS
    0x0bd00bd0,  // Lustre
    0x47504653,  // GPFS
    0x19830326,  // BeeGFS
    0x01021997,  // 9p
    0x5346414f,  // AFS
};

bool IsInsideDir(const std::string& dir, const std::string& path) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

}  // namespace

bool IsSharedFilesystem(const std::string& path) {
  struct statfs st;
  if (::statfs(path.c_str(), &st) != 0) return false;
  for (uint64_t magic : kSharedMagics)
    if (static_cast<uint64_t>(static_cast<uint32_t>(st.f_type)) == magic) return true;
  return false;
}

Result<std::string> ResolveStaging(const MountOptions& options, const std::string& backing, std::string* why) {
  if (options.staging == "store") {
    *why = "staging=store";
    return std::string();
  }
  std::string dir;
  if (options.staging == "auto") {
    if (!IsSharedFilesystem(backing)) {
      *why = "the backing directory is on a local filesystem";
      return std::string();
    }
    dir = kDefaultLocalStaging;
    *why = "the backing directory is on a shared (network or FUSE) filesystem: raw bytes stay on this node";
  } else {
    dir = options.staging;
    *why = "staging=" + dir;
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (IsInsideDir(backing, dir))
    return Status::InvalidArgument("-o staging=" + dir + " is inside the backing directory " + backing +
                                   " (use staging=store for that)");
  return dir;
}

}  // namespace ckptfs::fs
