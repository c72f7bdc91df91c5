#include "fs/recovery.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <set>

#include "fs/base_candidates.h"

namespace ckptfs::fs {
namespace {

constexpr size_t kRecoveryBaseCandidates = 4;

// Staging areas (and their tmp twins) whose daemon is gone; their lock fds
// are held until recovery ends so no new daemon can take the same name.
struct DeadAreas {
  std::set<std::string> names;
  // Dead areas in this daemon's node-local staging directory: no manifest
  // names their files (fs/STORE.md §3), so all of them go.
  std::set<std::string> local;
  std::vector<int> lock_fds;
  ~DeadAreas() {
    for (int fd : lock_fds) ::close(fd);
  }
};

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

enum class AreaState { kLive, kDead, kNoLock };

// An area directory's liveness from its .lock: live while some process
// holds the flock; kDead keeps the lock (its fd joins `dead`).
AreaState LockState(const std::string& dir, DeadAreas* dead) {
  int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return AreaState::kNoLock;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);  // a live daemon holds it
    return AreaState::kLive;
  }
  dead->lock_fds.push_back(fd);
  return AreaState::kDead;
}

bool YoungerThanAMinute(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && ::time(nullptr) - st.st_mtime < 60;
}

void FindDeadAreas(Store& store, DeadAreas* dead) {
  for (const std::string& name : ListDir(store.MetaPath("staging"))) {
    if (name == store.area()) continue;
    std::string dir = store.MetaPath("staging/" + name);
    AreaState state = LockState(dir, dead);
    if (state == AreaState::kLive) continue;
    if (state == AreaState::kNoLock && YoungerThanAMinute(dir)) continue;  // between mkdir and lock (ClaimStagingArea)
    dead->names.insert(name);
  }
  if (!store.staging_in_store()) {
    for (const std::string& name : ListDir(store.StagingRoot())) {
      std::string dir = store.StagingRoot() + "/" + name;
      if (name == store.area() || name.size() != 16 || !std::filesystem::is_directory(dir)) continue;
      AreaState state = LockState(dir, dead);
      if (state == AreaState::kLive || (state == AreaState::kNoLock && YoungerThanAMinute(dir))) continue;
      dead->names.insert(name);
      dead->local.insert(name);
    }
  }
  for (const std::string& name : ListDir(store.MetaPath("tmp"))) {
    std::string dir = store.MetaPath("tmp/" + name);
    struct stat st;
    if (name == store.area() || dead->names.count(name) || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      continue;
    // The twin of a daemon staging on its own node carries that daemon's
    // lock; other twins live as long as their staging area does.
    AreaState state = LockState(dir, dead);
    if (state == AreaState::kLive) continue;
    if (state == AreaState::kNoLock &&
        (YoungerThanAMinute(dir) || ::access(store.MetaPath("staging/" + name).c_str(), F_OK) == 0))
      continue;
    dead->names.insert(name);  // a tmp area whose daemon is gone
  }
}

}  // namespace

Result<RecoveryReport> RecoverStore(Store& store, const CommitOptions& options, Logger* log) {
  RecoveryReport report;
  DeadAreas dead;
  FindDeadAreas(store, &dead);
  report.dead_areas = static_cast<uint32_t>(dead.names.size());
  std::set<std::string> referenced;  // staging rel paths still named by manifests
  std::set<std::string> finished_in;  // folders (relative) where a commit was finished

  Status walk = ForEachUserFile(store.backing(), [&](const std::string& rel) {
    std::string path = store.backing() + "/" + rel;
    int fd = OpenNoAtime(AT_FDCWD, path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    auto m = ReadManifest(fd);
    if (!m.ok() || !m->has_value() || (*m)->kind != ManifestKind::kStaging) {
      ::close(fd);
      return;
    }
    Manifest manifest = **m;
    std::string area = manifest.staging.DirHex();
    if (dead.names.count(area) == 0) {  // a live daemon's file (or ours): not ours to touch
      referenced.insert(manifest.staging.RelPath());
      ::close(fd);
      return;
    }
    std::string staging_path = store.StagingPath(manifest.staging);
    int sfd = ::open(staging_path.c_str(), O_RDWR | O_CLOEXEC);
    if (sfd < 0) {
      ++report.lost;
      if (log) log->Error("recovery: {}: staging file {} is missing; the file cannot be recovered", rel, staging_path);
      ::close(fd);
      return;
    }
    StagingFile staging(manifest.staging, sfd, staging_path);
    staging.set_keep(true);  // only removed once the new manifest is durable
    // The same base choice and policy as the daemon's own commit: the
    // directory's committed versions, the file's path for the rules. The
    // file's own committed version, which the staging record took the
    // place of (a save fsynced over its name), is not among them: it is in
    // the manifest's other slot.
    std::vector<BaseCandidate> candidates = ScanBaseCandidates(store, rel, kRecoveryBaseCandidates, log);
    if (auto replaced = ReadReplacedManifest(fd); replaced.ok() && replaced->has_value())
      AddReplacedCandidate(store, **replaced, rel, log, &candidates);
    auto v = CommitStagedFile(store, fd, &manifest, staging, candidates, options, log, rel);
    if (v.ok()) {
      ++report.finished;
      // The file may have been new when its daemon died, its entry not yet
      // durable (fs/entry_syncs.h): its folder is fsynced below, once.
      const size_t slash = rel.rfind('/');
      finished_in.insert(slash == std::string::npos ? std::string() : rel.substr(0, slash));
      if (log) log->Info("recovery: {}: finished an interrupted commit ({} bytes)", rel, manifest.logical_size);
    } else {
      referenced.insert(manifest.staging.RelPath());
      if (log) log->Error("recovery: {}: re-encoding failed: {}", rel, v.status().ToString());
    }
    ::close(fd);
  });
  RETURN_IF_ERROR(walk);
  for (const std::string& folder : finished_in) {
    Status synced = SyncDir(folder.empty() ? store.backing() : store.backing() + "/" + folder);
    if (!synced.ok() && log) log->Error("recovery: folder {}: {}", folder, synced.ToString());
  }

  for (const std::string& area : dead.names) {
    bool keep_dir = false;
    bool local = dead.local.count(area) > 0;
    std::string sdir = local ? store.StagingRoot() + "/" + area : store.MetaPath("staging/" + area);
    for (const std::string& name : ListDir(sdir)) {
      if (name == ".lock") continue;
      if (!local && referenced.count("staging/" + area + "/" + name)) {
        keep_dir = true;
        continue;
      }
      if (::unlink((sdir + "/" + name).c_str()) == 0) {
        ++report.orphans_removed;
        if (log)
          log->Info("recovery: removed orphan staging file {}/{} ({})", sdir, name,
                    local ? "node-local staging: never acknowledged" : "never fsynced nor closed");
      }
    }
    if (!keep_dir) {
      ::unlink((sdir + "/.lock").c_str());
      ::rmdir(sdir.c_str());
    }
    std::string tdir = store.MetaPath("tmp/" + area);
    for (const std::string& name : ListDir(tdir))
      if (::unlink((tdir + "/" + name).c_str()) == 0) ++report.temps_removed;
    ::rmdir(tdir.c_str());
  }
  return report;
}

}  // namespace ckptfs::fs
