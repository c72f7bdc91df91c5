#include "fs/gc.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

namespace ckptfs::fs {

void ForEachObject(Store& store, const std::function<void(const ObjectId&, const std::string&)>& fn) {
  std::string objects = store.MetaPath("objects");
  DIR* top = ::opendir(objects.c_str());
  if (top == nullptr) return;
  while (struct dirent* e = ::readdir(top)) {
    std::string prefix = e->d_name;
    if (prefix.size() != 2) continue;
    std::string dir = objects + "/" + prefix;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    while (struct dirent* f = ::readdir(d)) {
      auto id = ObjectId::FromHex(f->d_name);
      if (!id.ok() || id->Hex().substr(0, 2) != prefix) continue;
      fn(*id, dir + "/" + f->d_name);
    }
    ::closedir(d);
  }
  ::closedir(top);
}

Result<std::unordered_set<ObjectId, ObjectIdHash>> MarkLiveObjects(Store& store,
                                                                    const std::vector<ObjectId>& extra,
                                                                    std::vector<std::string>* problems,
                                                                    uint64_t* manifests) {
  std::unordered_set<ObjectId, ObjectIdHash> live;
  std::vector<ObjectId> blobs(extra.begin(), extra.end());
  Status walk = ForEachUserFile(store.backing(), [&](const std::string& rel) {
    int fd = ::open((store.backing() + "/" + rel).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    auto m = ReadManifest(fd);
    ::close(fd);
    if (!m.ok()) {
      problems->push_back(fmt::format("{}: {}", rel, m.status().ToString()));
      return;
    }
    if (!m->has_value()) return;  // a plain file
    if (manifests) ++*manifests;
    const Manifest& man = **m;
    if (man.kind == ManifestKind::kRaw) live.insert(man.object);
    if (man.kind == ManifestKind::kBlob) blobs.push_back(man.object);
  });
  RETURN_IF_ERROR(walk);
  // Follow each chain; a chain stops at a key frame or an object already marked.
  for (ObjectId id : blobs) {
    for (uint32_t depth = 0; depth < 1024; ++depth) {
      if (!live.insert(id).second) break;
      auto reader = store.OpenBlob(id);
      if (!reader.ok()) {
        if (::access(store.ObjectPath(id).c_str(), F_OK) == 0) {
          problems->push_back(fmt::format("object {}: {}", id.Hex(), reader.status().ToString()));
        } else {
          problems->push_back(fmt::format("object {} is referenced but missing", id.Hex()));
        }
        break;
      }
      if (!(*reader)->base()) break;
      id = *(*reader)->base();
    }
  }
  return live;
}

Result<GcReport> CollectGarbage(Store& store, const GcOptions& options, Logger* log) {
  GcReport report;
  ASSIGN_OR_RETURN(auto live, MarkLiveObjects(store, options.extra_live, &report.problems, &report.manifests));
  report.live_objects = live.size();
  int64_t now = ::time(nullptr);
  ForEachObject(store, [&](const ObjectId& id, const std::string& path) {
    ++report.objects;
    if (live.count(id)) return;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return;
    if (now - st.st_mtime < options.grace_seconds) {
      ++report.kept_young;
      return;
    }
    if (!options.dry_run && ::unlink(path.c_str()) != 0) return;
    ++report.removed;
    report.removed_bytes += static_cast<uint64_t>(st.st_size);
    if (log) log->Debug("gc: removed object {} ({} bytes)", id.Hex(), st.st_size);
  });
  if (log)
    log->Info("gc: {} objects, {} live, {} removed ({} bytes), {} kept within the grace period", report.objects,
              report.live_objects, report.removed, report.removed_bytes, report.kept_young);
  return report;
}

}  // namespace ckptfs::fs
