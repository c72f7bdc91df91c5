// The blobs a blob reads while it is decoded: its base version and its ref
// (another file's blob that its ref copies read; codec/FORMAT.md "Index
// header"). Whatever keeps a blob (GC's marking, a commit's touch, fsck)
// keeps every blob it links to, transitively.
#pragma once

#include <unordered_set>
#include <vector>

#include "codec/common/hash.h"
#include "codec/common/status.h"
#include "codec/container/blob.h"
#include "fs/store.h"

namespace ckptfs::fs {

// The base, then the ref, of `blob` (those it names).
std::vector<ObjectId> BlobLinks(const BlobReader& blob);

// Refreshes the mtime of every blob `top` links to, transitively, each
// touched before it is opened (GC's grace period then covers it until a
// manifest names a blob that reads it); stops at the first that fails
// (NotFound when GC took it away). At most kMaxLinkedBlobs blobs.
inline constexpr size_t kMaxLinkedBlobs = 1 << 16;
Status TouchLinked(Store& store, const BlobReader& top);

}  // namespace ckptfs::fs
