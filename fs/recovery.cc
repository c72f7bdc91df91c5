#include "fs/recovery.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <set>

#include "fs/base_candidates.h"

namespace ckptfs::fs {
namespace {

constexpr size_t kRecoveryBaseCandidates = 4;

// Staging areas (and their tmp twins) whose daemon is gone; their lock fds
// are held until recovery ends so no new daemon can take the same name.
struct DeadAreas {
  std::set<std::string> names;
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

void FindDeadAreas(Store& store, DeadAreas* dead) {
  for (const std::string& name : ListDir(store.MetaPath("staging"))) {
    if (name == store.area()) continue;
    std::string lock_path = store.MetaPath("staging/" + name + "/.lock");
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 && ::stat(store.MetaPath("staging/" + name).c_str(), &st) == 0 &&
        ::time(nullptr) - st.st_mtime < 60)
      continue;  // a daemon between mkdir and creating its lock (ClaimStagingArea)
    if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);  // a live daemon holds it
      continue;
    }
    if (fd >= 0) dead->lock_fds.push_back(fd);
    dead->names.insert(name);
  }
  for (const std::string& name : ListDir(store.MetaPath("tmp"))) {
    struct stat st;
    if (name == store.area() || ::stat(store.MetaPath("tmp/" + name).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode) && ::time(nullptr) - st.st_mtime >= 60 &&
        ::access(store.MetaPath("staging/" + name).c_str(), F_OK) != 0)
      dead->names.insert(name);  // a tmp area whose staging twin is already gone
  }
}

}  // namespace

Result<RecoveryReport> RecoverStore(Store& store, const CommitOptions& options, Logger* log) {
  RecoveryReport report;
  DeadAreas dead;
  FindDeadAreas(store, &dead);
  report.dead_areas = static_cast<uint32_t>(dead.names.size());
  std::set<std::string> referenced;  // staging rel paths still named by manifests

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
    // directory's committed versions, the file's path for the rules.
    auto v = CommitStagedFile(store, fd, &manifest, staging, ScanBaseCandidates(store, rel, kRecoveryBaseCandidates, log),
                              options, log, rel);
    if (v.ok()) {
      ++report.finished;
      if (log) log->Info("recovery: {}: finished an interrupted commit ({} bytes)", rel, manifest.logical_size);
    } else {
      referenced.insert(manifest.staging.RelPath());
      if (log) log->Error("recovery: {}: re-encoding failed: {}", rel, v.status().ToString());
    }
    ::close(fd);
  });
  RETURN_IF_ERROR(walk);

  for (const std::string& area : dead.names) {
    bool keep_dir = false;
    std::string sdir = store.MetaPath("staging/" + area);
    for (const std::string& name : ListDir(sdir)) {
      if (name == ".lock") continue;
      if (referenced.count("staging/" + area + "/" + name)) {
        keep_dir = true;
        continue;
      }
      if (::unlink((sdir + "/" + name).c_str()) == 0) {
        ++report.orphans_removed;
        if (log) log->Info("recovery: removed orphan staging file {}/{} (never fsynced nor closed)", sdir, name);
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
