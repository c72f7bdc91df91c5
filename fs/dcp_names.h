// Naming a DCP shard's tensors before it is encoded: the daemon finds the
// `.metadata` of the shard's own save or, since the coordinator writes it
// only after every rank's shard, of the save its previous version belongs
// to (codec/format/dcp_metadata.h).
#pragma once

#include <string_view>
#include <vector>

#include "codec/format/layout.h"
#include "fs/commit_pipeline.h"
#include "fs/log.h"
#include "fs/store.h"

namespace ckptfs::fs {

// The largest `.metadata` read (a save of a model with millions of items
// stays far below).
inline constexpr uint64_t kMaxDcpMetadataBytes = uint64_t{64} << 20;

enum class DcpNaming {
  kNamed,        // a .metadata described the shard: its tensors have their FQNs
  kNoMetadata,   // no earlier save's folder has a .metadata, and the shard's own
                 // folder has none that describes it (yet: a run's first save)
  kUnmatched,    // an earlier save's metadata exists but describes no shard of this plan
};

// Names `layout`'s tensors (a DCP shard at `logical_path`, relative to the
// mount root) by the first `.metadata` that describes a file of its name
// exactly: its own folder's, then the folders of `candidates` (newest
// first) that hold a shard of the same name. Leaves them positional when
// none does; a metadata file that cannot be read or parsed is skipped
// (logged).
DcpNaming NameDcpShardTensors(Store& store, Layout* layout, std::string_view logical_path,
                         const std::vector<BaseCandidate>& candidates, const ParseLimits& limits, Logger* log);

// Whether the folder of `logical_path` holds a `.metadata` (written or
// being written): what a waiting shard's commit checks before it maps and
// parses the shard again.
bool FolderHasDcpMetadata(const Store& store, std::string_view logical_path);

}  // namespace ckptfs::fs
