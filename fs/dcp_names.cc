#include "fs/dcp_names.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "codec/format/dcp_metadata.h"
#include "fs/version_role.h"
#include "fs/manifest.h"

namespace ckptfs::fs {
namespace {

std::string_view BaseName(std::string_view rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string_view::npos ? rel : rel.substr(slash + 1);
}

// The bytes of the file at `rel` (relative to the mount root) as the mount
// serves them: a committed manifest's content, or a plain file's bytes.
Result<std::vector<std::byte>> ReadStoreFile(Store& store, const std::string& rel) {
  const std::string path = store.backing() + "/" + rel;
  ASSIGN_OR_RETURN(std::unique_ptr<PosixFile> file, PosixFile::Open(path, O_NOFOLLOW));
  ASSIGN_OR_RETURN(std::optional<Manifest> manifest, ReadManifest(file->fd()));
  std::vector<std::byte> bytes;
  if (!manifest) {
    if (file->Size() > kMaxDcpMetadataBytes) return Status::InvalidArgument("larger than a DCP metadata file may be");
    bytes.resize(file->Size());
    RETURN_IF_ERROR(file->ReadAt(0, bytes));
    return bytes;
  }
  ASSIGN_OR_RETURN(FileContent content, FileContent::Open(store, *manifest));
  if (content.size() > kMaxDcpMetadataBytes) return Status::InvalidArgument("larger than a DCP metadata file may be");
  bytes.resize(content.size());
  RETURN_IF_ERROR(content.ReadAt(0, bytes));
  return bytes;
}

// The folder's metadata file, relative to the mount root.
std::string MetadataPath(std::string_view folder) {
  return folder.empty() ? std::string(".metadata") : std::string(folder) + "/.metadata";
}

}  // namespace

bool FolderHasDcpMetadata(const Store& store, std::string_view logical_path) {
  return ::faccessat(store.backing_fd(), MetadataPath(FolderOf(logical_path)).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

DcpNaming NameDcpShardTensors(Store& store, Layout* layout, std::string_view logical_path,
                              const std::vector<BaseCandidate>& candidates, const ParseLimits& limits, Logger* log) {
  if (layout->format != FileFormat::kDcp || logical_path.empty()) return DcpNaming::kUnmatched;
  bool found = false;
  const std::string_view name = BaseName(logical_path);
  std::vector<std::string> folders{std::string(FolderOf(logical_path))};
  for (auto c = candidates.rbegin(); c != candidates.rend(); ++c) {
    if (c->format != FileFormat::kDcp || c->rel_path.empty() || BaseName(c->rel_path) != name) continue;
    std::string folder(FolderOf(c->rel_path));
    if (std::find(folders.begin(), folders.end(), folder) == folders.end()) folders.push_back(std::move(folder));
  }
  for (size_t i = 0; i < folders.size(); ++i) {
    const std::string& folder = folders[i];
    const std::string rel = MetadataPath(folder);
    // The shard's own save's metadata may be being written right now (it
    // follows the shards): unreadable or not describing the shard yet, it
    // counts as not there.
    const bool own = i == 0;
    Result<std::vector<std::byte>> bytes = ReadStoreFile(store, rel);
    if (!bytes.ok()) {
      if (bytes.status().code() != StatusCode::kNotFound && log)
        log->Info("{}: {} not read: {}", logical_path, rel, bytes.status().ToString());
      found = found || (!own && bytes.status().code() != StatusCode::kNotFound);
      continue;
    }
    found = found || !own;
    Result<std::vector<DcpStorageItem>> items = ParseDcpMetadata(*bytes, limits);
    if (!items.ok()) {
      if (log) log->Info("{}: {} not used: {}", logical_path, rel, items.status().ToString());
      continue;
    }
    if (NameDcpShard(layout, name, *items)) {
      if (log) log->Debug("{}: tensors named by {}", logical_path, rel);
      return DcpNaming::kNamed;
    }
  }
  return found ? DcpNaming::kUnmatched : DcpNaming::kNoMetadata;
}

}  // namespace ckptfs::fs
