#include "fs/base_candidates.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "fs/manifest.h"

namespace ckptfs::fs {

std::vector<std::string> TensorKeys(const std::vector<TensorInfo>& tensors) {
  std::vector<std::string> keys;
  keys.reserve(tensors.size());
  for (const TensorInfo& t : tensors)
    keys.push_back(fmt::format("{}|{}|{}", t.name, DTypeName(t.dtype), fmt::join(t.shape, "x")));
  std::sort(keys.begin(), keys.end());
  return keys;
}

namespace {

struct Found {
  struct timespec mtime;
  std::string name;
  Manifest manifest;
};

bool Older(const Found& a, const Found& b) {
  return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.name) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.name);
}

}  // namespace

std::vector<BaseCandidate> ScanBaseCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log) {
  std::vector<BaseCandidate> out;
  if (max_count == 0 || rel_path.empty()) return out;
  const size_t slash = rel_path.rfind('/');
  const std::string rel_dir = slash == std::string::npos ? std::string() : rel_path.substr(0, slash);
  const std::string exclude = slash == std::string::npos ? rel_path : rel_path.substr(slash + 1);
  int dfd = ::openat(store.backing_fd(), rel_dir.empty() ? "." : rel_dir.c_str(),
                     O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (dfd < 0) return out;
  DIR* dir = ::fdopendir(dfd);
  if (dir == nullptr) {
    ::close(dfd);
    return out;
  }
  std::vector<Found> found;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
    std::string name = e->d_name;
    if (name == "." || name == ".." || name == exclude || (rel_dir.empty() && name == kMetaDirName)) continue;
    int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
      auto m = ReadManifest(fd);
      if (m.ok() && m->has_value() && (*m)->kind == ManifestKind::kBlob)
        found.push_back(Found{st.st_mtim, name, std::move(**m)});
    }
    ::close(fd);
  }
  ::closedir(dir);  // closes dfd

  std::sort(found.begin(), found.end(), Older);
  if (found.size() > max_count) found.erase(found.begin(), found.end() - static_cast<ptrdiff_t>(max_count));
  for (const Found& f : found) {
    auto reader = store.OpenBlob(f.manifest.object);
    if (!reader.ok()) {
      if (log) log->Debug("base scan: {}/{}: {}", rel_dir, f.name, reader.status().ToString());
      continue;
    }
    out.push_back(BaseCandidate{f.manifest.object, f.manifest.chain_depth, (*reader)->format(),
                                (*reader)->logical_size(), TensorKeys((*reader)->tensors())});
  }
  return out;
}

}  // namespace ckptfs::fs
