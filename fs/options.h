// Mount options: ckptfs's own (-o compress=...,threads=...) and the subset
// of libfuse/kernel mount options passed through to libfuse.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/common/status.h"
#include "fs/log.h"

namespace ckptfs::fs {

struct MountOptions {
  std::string backing;
  std::string mountpoint;
  bool foreground = false;
  bool debug_fuse = false;       // -o debug: libfuse's request trace
  bool compress = true;          // compress=on|off
  unsigned threads = 2;          // threads=N encode workers
  unsigned fuse_threads = 16;    // fuse_threads=N request threads
  uint32_t keyframe = 10;        // keyframe=N
  uint64_t cache_mib = 256;      // cache=MiB decoded chunk cache
  int zstd_level = 3;            // zstd=LEVEL
  std::string log_file;          // log=FILE (default stderr; /dev/null once daemonized)
  LogLevel log_level = LogLevel::kInfo;  // loglevel=debug|info|warn|error
  std::string crash_at;          // crash_at=<commit step>: abort() there (tests)
  int64_t gc_grace_seconds = 3600;   // gc_grace=SECONDS
  int64_t gc_interval_seconds = 3600;  // gc_interval=SECONDS (0: no background GC)
  uint32_t read_ahead_kb = 1024; // readahead=KiB for the mount's bdi
  std::vector<std::string> fuse_options;  // passed to libfuse (-o ...)
};

// Parses one comma-separated -o list into `opts`. InvalidArgument names the
// first unknown or malformed option. Mount-helper options that only matter
// to mount(8) (defaults, _netdev, noauto, user, nofail...) are ignored.
Status ParseMountOptionList(const std::string& list, MountOptions* opts);

}  // namespace ckptfs::fs
