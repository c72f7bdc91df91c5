// Where a daemon keeps the raw bytes of files being written (-o staging=):
// in the store, or on a node-local directory when the store is shared
// (fs/STORE.md §3: the raw bytes then never cross the network, and fsync
// commits to the store).
#pragma once

#include <string>

#include "codec/common/status.h"
#include "fs/options.h"

namespace ckptfs::fs {

// The node-local staging directory staging=auto picks for a shared store.
inline constexpr char kDefaultLocalStaging[] = "/var/tmp/ckptfs-staging";

// True when `path` is on a network or FUSE filesystem (NFS, SMB, Ceph,
// Lustre, GPFS, BeeGFS, GlusterFS's client, ...): a store other machines
// may share, where writing raw bytes costs network traffic.
bool IsSharedFilesystem(const std::string& path);

// staging= resolved for the (real) backing directory: "" for staging in
// the store, else the local directory's absolute path. `*why` says how it
// was chosen, for the log. InvalidArgument for a directory inside the
// store.
Result<std::string> ResolveStaging(const MountOptions& options, const std::string& backing, std::string* why);

}  // namespace ckptfs::fs
