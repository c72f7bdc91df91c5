// Mount-time recovery: finishes every commit a dead daemon left behind and
// removes its orphans. A daemon is dead when the flock on its staging
// area's .lock can be taken (the kernel drops it when the process dies), so
// two daemons on one backing directory never recover each other's live
// files.
#pragma once

#include <cstdint>
#include <vector>

#include "fs/commit_pipeline.h"
#include "fs/log.h"
#include "fs/store.h"

namespace ckptfs::fs {

struct RecoveryReport {
  uint32_t dead_areas = 0;
  uint32_t finished = 0;         // staging manifests re-encoded and committed
  uint32_t lost = 0;             // staging manifests whose staging file is gone
  uint32_t orphans_removed = 0;  // staging files no manifest referenced
  uint32_t temps_removed = 0;    // temp files of dead daemons
};

// Recovers `store`. For each manifest of kind staging in a dead area: the
// staging file (complete: it was fsynced before the manifest named it) is
// encoded and committed. Then each dead area is emptied and removed.
// REQUIRES: no other thread uses the store's user tree meanwhile (the
// daemon runs this before it serves requests).
Result<RecoveryReport> RecoverStore(Store& store, const CommitOptions& options, Logger* log);

}  // namespace ckptfs::fs
