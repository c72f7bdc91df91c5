// Garbage collection of objects: mark from every manifest of the user tree,
// following each blob's delta base down to its key frame, then sweep the
// unmarked objects that are older than the grace period.
//
// The grace period is what keeps several daemons on one backing directory
// safe: a daemon publishes an object before its manifest names it, so an
// object younger than the grace period may belong to a commit in flight and
// is never deleted. Republishing an existing object refreshes its mtime
// (Store::PublishObject) for the same reason.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "fs/log.h"
#include "fs/store.h"

namespace ckptfs::fs {

struct GcOptions {
  int64_t grace_seconds = 3600;
  // Objects live in memory (open files, delta base candidates) that no
  // manifest names (e.g. an unlinked file still open).
  std::vector<ObjectId> extra_live;
  bool dry_run = false;
};

struct GcReport {
  uint64_t manifests = 0;
  uint64_t live_objects = 0;
  uint64_t objects = 0;        // objects found in the store
  uint64_t removed = 0;
  uint64_t removed_bytes = 0;
  uint64_t kept_young = 0;     // unreferenced but within the grace period
  uint64_t removed_content_entries = 0;  // content index entries naming removed objects
  std::vector<std::string> problems;  // e.g. a manifest naming a missing object
  // The mark was incomplete (MarkLiveObjects): nothing was removed.
  bool swept = true;
};

// The set of objects reachable from the user tree (plus `extra`), following
// delta bases and refs. Problems found on the way are appended to
// `problems`; *incomplete (when given) is set when the set may miss live
// objects: a manifest that cannot be read, or a marked blob that exists
// but does not open (damaged, or of a newer format whose links this build
// cannot see). A missing object is a problem but hides nothing.
Result<std::unordered_set<ObjectId, ObjectIdHash>> MarkLiveObjects(Store& store,
                                                                    const std::vector<ObjectId>& extra,
                                                                    std::vector<std::string>* problems,
                                                                    uint64_t* manifests, bool* incomplete = nullptr);

// Collects garbage. Thread safety: safe to run while daemons commit (see the
// grace period above).
Result<GcReport> CollectGarbage(Store& store, const GcOptions& options, Logger* log);

// Calls fn(id, path) for every object file in the store.
void ForEachObject(Store& store, const std::function<void(const ObjectId&, const std::string&)>& fn);

}  // namespace ckptfs::fs
