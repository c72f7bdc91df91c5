#include "fs/gc.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <string_view>

#include "fs/blob_links.h"
#include "fs/content_index.h"

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
                                                                    uint64_t* manifests, bool* incomplete) {
  bool unsure = false;
  std::unordered_set<ObjectId, ObjectIdHash> live;
  std::vector<ObjectId> blobs(extra.begin(), extra.end());
  Status walk = ForEachUserFile(store.backing(), [&](const std::string& rel) {
    int fd = OpenNoAtime(AT_FDCWD, (store.backing() + "/" + rel).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    auto m = ReadManifest(fd);
    ::close(fd);
    if (!m.ok()) {
      problems->push_back(fmt::format("{}: {}", rel, m.status().ToString()));
      unsure = true;
      return;
    }
    if (!m->has_value()) return;  // a plain file
    if (manifests) ++*manifests;
    const Manifest& man = **m;
    if (man.kind == ManifestKind::kRaw) live.insert(man.object);
    if (man.kind == ManifestKind::kBlob) blobs.push_back(man.object);
  });
  RETURN_IF_ERROR(walk);
  // Follow what each blob reads (its base chain, refs); a walk stops at a
  // key frame or an object already marked.
  while (!blobs.empty()) {
    const ObjectId id = blobs.back();
    blobs.pop_back();
    if (!live.insert(id).second) continue;
    auto reader = store.OpenBlob(id);
    if (!reader.ok()) {
      if (::access(store.ObjectPath(id).c_str(), F_OK) == 0) {
        problems->push_back(fmt::format("object {}: {}", id.Hex(), reader.status().ToString()));
        unsure = true;
      } else {
        problems->push_back(fmt::format("object {} is referenced but missing", id.Hex()));
      }
      continue;
    }
    for (const ObjectId& below : BlobLinks(**reader))
      if (!live.count(below)) blobs.push_back(below);
  }
  if (incomplete != nullptr) *incomplete = unsure;
  return live;
}

namespace {
// A commit may touch the object (choosing it as a delta base, or publishing
// the same bytes) between our stat() and the unlink. Renaming it away first
// closes that window: a touch before the rename shows in the re-checked
// mtime (and the object is put back); a touch after it fails with ENOENT,
// which the committer handles (Store::TouchObject, Store::PublishObject).
bool RemoveUnlessTouched(const std::string& path, int64_t now, int64_t grace_seconds) {
  std::string doomed = path + ".gc";  // not an object name: ignored by readers and by GC
  if (::rename(path.c_str(), doomed.c_str()) != 0) return false;
  struct stat st;
  if (::stat(doomed.c_str(), &st) == 0 && now - st.st_mtime < grace_seconds) {
    // Put back; if the committer republished it meanwhile the bytes are equal.
    ::rename(doomed.c_str(), path.c_str());
    return false;
  }
  return ::unlink(doomed.c_str()) == 0;
}

// A GC that died between that rename and the unlink left "<hex>.gc": put it
// back (unless republished) so that this run decides about it anew.
void RestoreInterrupted(Store& store) {
  std::string objects = store.MetaPath("objects");
  DIR* top = ::opendir(objects.c_str());
  if (top == nullptr) return;
  while (struct dirent* e = ::readdir(top)) {
    if (std::strlen(e->d_name) != 2) continue;
    std::string dir = objects + "/" + e->d_name;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    while (struct dirent* f = ::readdir(d)) {
      std::string_view name = f->d_name;
      if (!name.ends_with(".gc") || !ObjectId::FromHex(name.substr(0, name.size() - 3)).ok()) continue;
      std::string doomed = dir + "/" + f->d_name;
      std::string path = doomed.substr(0, doomed.size() - 3);
      if (::access(path.c_str(), F_OK) == 0) ::unlink(doomed.c_str());
      else ::rename(doomed.c_str(), path.c_str());
    }
    ::closedir(d);
  }
  ::closedir(top);
}
}  // namespace

Result<GcReport> CollectGarbage(Store& store, const GcOptions& options, Logger* log) {
  GcReport report;
  if (!options.dry_run) RestoreInterrupted(store);
  bool incomplete = false;
  ASSIGN_OR_RETURN(auto live,
                   MarkLiveObjects(store, options.extra_live, &report.problems, &report.manifests, &incomplete));
  if (incomplete) {
    // Sweeping now could delete what an unreadable manifest or blob needs.
    report.swept = false;
    report.problems.push_back("not sweeping: a manifest or a marked blob could not be read (fsck says more)");
    if (log) log->Warn("gc: {}", report.problems.back());
    return report;
  }
  report.live_objects = live.size();
  int64_t now = ::time(nullptr);
  // The grace period protects a young object together with the blobs below
  // it: a commit that published a delta, or is about to use one as its base,
  // needs the whole chain down to the key frame.
  std::vector<ObjectId> young;
  ForEachObject(store, [&](const ObjectId& id, const std::string& path) {
    struct stat st;
    if (!live.count(id) && ::stat(path.c_str(), &st) == 0 && now - st.st_mtime < options.grace_seconds)
      young.push_back(id);
  });
  std::unordered_set<ObjectId, ObjectIdHash> below_young;
  while (!young.empty()) {
    const ObjectId id = young.back();
    young.pop_back();
    auto reader = store.OpenBlob(id);  // a raw object is no blob: nothing below it
    if (!reader.ok()) continue;
    for (const ObjectId& below : BlobLinks(**reader))
      if (!live.count(below) && below_young.insert(below).second) young.push_back(below);
  }
  ForEachObject(store, [&](const ObjectId& id, const std::string& path) {
    ++report.objects;
    if (live.count(id)) return;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return;
    if (now - st.st_mtime < options.grace_seconds || below_young.count(id)) {
      ++report.kept_young;
      return;
    }
    if (!options.dry_run && !RemoveUnlessTouched(path, now, options.grace_seconds)) {
      ++report.kept_young;
      return;
    }
    ++report.removed;
    report.removed_bytes += static_cast<uint64_t>(st.st_size);
    if (log) log->Debug("gc: removed object {} ({} bytes)", id.Hex(), st.st_size);
  });
  // Entries of the content index naming removed objects go too.
  report.removed_content_entries = SweepContentIndex(store, options.dry_run);
  if (log)
    log->Info("gc: {} objects, {} live, {} removed ({} bytes), {} kept within the grace period", report.objects,
              report.live_objects, report.removed, report.removed_bytes, report.kept_young);
  return report;
}

}  // namespace ckptfs::fs
