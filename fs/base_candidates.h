// Delta-base candidates of a directory, rebuilt from the store. The daemon
// remembers the versions it committed in each directory (the newest few are
// the delta bases of the next checkpoint there); after a remount that memory
// is empty, so the first commit in a directory scans its manifests instead
// of writing a key frame.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "codec/format/layout.h"
#include "fs/commit_pipeline.h"
#include "fs/log.h"
#include "fs/store.h"

namespace ckptfs::fs {

// "name|dtype|shape" of every tensor, sorted: what ChooseBase matches on.
std::vector<std::string> TensorKeys(const std::vector<TensorInfo>& tensors);

// The delta-base candidates of the file at `rel_path` (relative to the
// backing root): the committed blob versions among the other files of its
// directory, newest `max_count` by modification time, returned oldest first
// like the daemon's in-memory list. The file itself is skipped: it is not
// its own base. Files whose manifest or blob cannot be read are skipped with
// a debug line: a missing candidate only costs a key frame.
std::vector<BaseCandidate> ScanBaseCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log);

}  // namespace ckptfs::fs
