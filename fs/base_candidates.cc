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
#include "fs/version_role.h"

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

size_t SharedCount(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  size_t i = 0, j = 0, n = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) ++n, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  }
  return n;
}

// How well `c` matches as a base: 0 when it cannot be one.
size_t MatchScore(const BaseCandidate& c, FileFormat format, const std::vector<std::string>& keys, uint64_t size) {
  if (c.format != format) return 0;
  if (!keys.empty()) return SharedCount(keys, c.tensor_keys);
  if (c.logical_size == 0 || size == 0 || c.logical_size > 2 * size || size > 2 * c.logical_size) return 0;
  return 1;
}

struct Found {
  struct timespec mtime;
  std::string name;
  Manifest manifest;
};

bool Older(const Found& a, const Found& b) {
  return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.name) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.name);
}

// A delta frame whose size is known to be at least kDeltaPaysBelow of its
// chain's key frame.
bool DidNotPay(const BaseCandidate& c) {
  return c.lossless && c.chain_depth > 0 && c.key_bytes > 0 &&
         c.stored_bytes >= kDeltaPaysBelow * static_cast<double>(c.key_bytes);
}

}  // namespace

bool HasLossyChunks(const BlobReader& blob) {
  const auto& chunks = blob.chunks();
  return std::any_of(chunks.begin(), chunks.end(), [](const ChunkInfo& c) { return c.codec == ChunkCodec::kLossy; });
}

uint64_t KeyFrameBytes(Store& store, std::shared_ptr<const BlobReader> blob) {
  for (uint32_t depth = 0; blob != nullptr && blob->base() && depth < 4096; ++depth) {
    auto below = store.OpenBlob(*blob->base());
    blob = below.ok() ? *below : nullptr;
  }
  return blob != nullptr ? blob->stored_size() : 0;
}

BaseChoice ChooseBase(const std::vector<BaseCandidate>& candidates, FileFormat format,
                      const std::vector<std::string>& keys, uint64_t size, uint32_t keyframe, bool retention) {
  auto has_room = [keyframe](const BaseCandidate& c) { return c.chain_depth + 1 < keyframe; };
  const BaseCandidate* best = nullptr;       // the best match
  const BaseCandidate* best_room = nullptr;  // the best match with room
  size_t best_score = 0, best_room_score = 0;
  // Among versions sharing as many tensors, a previous save of the file
  // itself (its role) wins over another file.
  auto MatchScoreOf = [&](const BaseCandidate& c) -> size_t {
    const size_t shared = MatchScore(c, format, keys, size);
    return shared == 0 ? 0 : 2 * shared + (c.same_role ? 1 : 0);
  };
  for (const BaseCandidate& c : candidates) {  // oldest first: ties go to the newest
    const size_t score = MatchScoreOf(c);
    if (score == 0) continue;
    if (score >= best_score) best = &c, best_score = score;
    if (has_room(c) && score >= best_room_score) best_room = &c, best_room_score = score;
  }
  // A recent delta of this kind of file (as good a match as the best) that
  // cost nearly as much as its chain's key frame (lossless training
  // weights: every mantissa changes) says deltas save little here, while
  // each one ties the new version, and everything above it, to versions a
  // trainer's retention deletes: write a key frame, so that deleting old
  // versions frees them. Once that delta leaves the list of recent
  // versions, a delta is tried again.
  for (const BaseCandidate& c : candidates)
    if (retention && best != nullptr && DidNotPay(c) && MatchScoreOf(c) == best_score) return BaseChoice{};
  if (best != nullptr && has_room(*best)) return BaseChoice{best, false};
  // The best match's chain is full: an older version with room, or the
  // anchor the list keeps for this (then this version is an anchor frame);
  // none with room (the anchors' chain is full too): a key frame.
  if (best_room != nullptr) return BaseChoice{best_room, best_room->anchor};
  return BaseChoice{};
}

namespace {

// Whether `a` and `b` are versions of the same kind of file: what an
// anchor is kept for (a directory may hold several checkpoint files per
// step, say a torch.save file and a safetensors file of the weights).
bool SameKind(const BaseCandidate& a, const BaseCandidate& b) {
  // Equal keys match (for files without tensors: the format and a similar size).
  return a.tensor_keys == b.tensor_keys && MatchScore(a, b.format, b.tensor_keys, b.logical_size) > 0;
}

}  // namespace

void TrimBaseCandidates(std::deque<BaseCandidate>* list, size_t max_count) {
  // Kept: the newest max_count versions, and older anchors that are the
  // newest anchor of a kind still written (one of the newest max_count is of
  // its kind), at most max_count of them. An anchor of a kind no longer
  // written goes, so the list does not hold its chain for ever.
  const size_t n = list->size();
  if (n <= max_count) return;
  const size_t first_new = n - max_count;
  std::vector<bool> keep(n, false);
  size_t kept_anchors = 0;
  for (size_t i = n; i-- > 0;) {
    if (i >= first_new) {
      keep[i] = true;
      continue;
    }
    const BaseCandidate& c = (*list)[i];
    if (!c.anchor || kept_anchors >= max_count) continue;
    bool newer_anchor = false, written = false;
    for (size_t j = i + 1; j < n; ++j) {
      if (!SameKind(c, (*list)[j])) continue;
      newer_anchor = newer_anchor || (*list)[j].anchor;
      written = written || j >= first_new;
    }
    if (!newer_anchor && written) keep[i] = true, ++kept_anchors;
  }
  // And the newest version with a value sample (a ref candidate of the
  // files of its folder, commit_pipeline.h) when no kept one has one: a
  // save of more ranks than max_count still finds its model file.
  bool kept_values = false;
  for (size_t i = 0; i < n; ++i) kept_values = kept_values || (keep[i] && (*list)[i].values);
  for (size_t i = first_new; !kept_values && i-- > 0;)
    if ((*list)[i].values) keep[i] = kept_values = true;
  std::deque<BaseCandidate> out;
  for (size_t i = 0; i < n; ++i)
    if (keep[i]) out.push_back(std::move((*list)[i]));
  *list = std::move(out);
}

void RememberBaseCandidate(std::deque<BaseCandidate>* list, BaseCandidate candidate, size_t max_count) {
  list->push_back(std::move(candidate));
  TrimBaseCandidates(list, max_count);
}

namespace {

// Reads the manifest of `name` in directory `dfd`: a committed blob version
// goes to `found` under the path `rel_path`.
void ReadCandidate(int dfd, const std::string& name, const std::string& rel_path, std::vector<Found>* found) {
  int fd = OpenNoAtime(dfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    auto m = ReadManifest(fd);
    if (m.ok() && m->has_value() && (*m)->kind == ManifestKind::kBlob)
      found->push_back(Found{st.st_mtim, rel_path, std::move(**m)});
  }
  ::close(fd);
}

// The newest `max_count` of `found` (by modification time) as candidates,
// oldest first, with their blobs' formats and tensors.
std::vector<BaseCandidate> NewestCandidates(Store& store, std::vector<Found> found, size_t max_count, bool same_role,
                                            Logger* log) {
  std::vector<BaseCandidate> out;
  std::sort(found.begin(), found.end(), Older);
  if (found.size() > max_count) found.erase(found.begin(), found.end() - static_cast<ptrdiff_t>(max_count));
  for (const Found& f : found) {
    auto reader = store.OpenBlob(f.manifest.object);
    if (!reader.ok()) {
      if (log) log->Debug("base scan: {}: {}", f.name, reader.status().ToString());
      continue;
    }
    BaseCandidate c{f.manifest.object, f.manifest.chain_depth, (*reader)->format(), (*reader)->logical_size(),
                    TensorKeys((*reader)->tensors()), /*anchor=*/f.manifest.chain_depth == 0,
                    (*reader)->stored_size(), KeyFrameBytes(store, *reader), !HasLossyChunks(**reader), f.name};
    c.same_role = same_role;
    c.committed_ns = int64_t{f.mtime.tv_sec} * 1000000000 + f.mtime.tv_nsec;
    out.push_back(std::move(c));
  }
  return out;
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

// Directory `rel_dir` of the backing tree opened for readdir (its atime
// left alone), or null.
DIR* OpenBackingDir(Store& store, const std::string& rel_dir) {
  int dfd = OpenNoAtime(store.backing_fd(), rel_dir.empty() ? "." : rel_dir.c_str(),
                        O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (dfd < 0) return nullptr;
  DIR* dir = ::fdopendir(dfd);
  if (dir == nullptr) ::close(dfd);
  return dir;
}

// The entries of directory `rel_dir` whose normalized name is `text`, the
// largest numbers first, at most `limit`.
std::vector<std::string> MatchingEntries(Store& store, const std::string& rel_dir, const std::string& text,
                                         size_t limit) {
  std::vector<std::pair<std::vector<unsigned long long>, std::string>> hits;
  DIR* dir = OpenBackingDir(store, rel_dir);
  if (dir == nullptr) return {};
  while (struct dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name == "." || name == ".." || (rel_dir.empty() && name == kMetaDirName)) continue;
    if (NormalizeComponent(name) == text) hits.emplace_back(ComponentNumbers(name), std::string(name));
  }
  ::closedir(dir);
  std::sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) { return a > b; });
  if (hits.size() > limit) hits.resize(limit);
  std::vector<std::string> out;
  for (auto& h : hits) out.push_back(std::move(h.second));
  return out;
}

}  // namespace

std::vector<BaseCandidate> ScanBaseCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log) {
  if (max_count == 0 || rel_path.empty()) return {};
  const size_t slash = rel_path.rfind('/');
  const std::string rel_dir = slash == std::string::npos ? std::string() : rel_path.substr(0, slash);
  DIR* dir = OpenBackingDir(store, rel_dir);
  if (dir == nullptr) return {};
  const int dfd = ::dirfd(dir);
  std::vector<Found> found;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
    std::string name = e->d_name;
    if (name == "." || name == ".." || (rel_dir.empty() && name == kMetaDirName)) continue;
    ReadCandidate(dfd, name, JoinPath(rel_dir, name), &found);
  }
  ::closedir(dir);  // closes dfd
  return NewestCandidates(store, std::move(found), max_count, /*same_role=*/false, log);
}

std::optional<BaseCandidate> AddReplacedCandidate(Store& store, const Manifest& replaced, const std::string& rel_path,
                                                  Logger* log, std::vector<BaseCandidate>* candidates) {
  if (replaced.kind != ManifestKind::kBlob ||
      std::any_of(candidates->begin(), candidates->end(), [&](const BaseCandidate& c) { return c.id == replaced.object; }))
    return std::nullopt;
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::vector<BaseCandidate> one = NewestCandidates(store, {Found{now, rel_path, replaced}}, 1, false, log);
  if (one.empty()) return std::nullopt;
  candidates->push_back(one.front());
  return std::move(one.front());
}

std::vector<BaseCandidate> ScanRoleCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log) {
  const FileRole role = RoleOf(rel_path);
  if (max_count == 0 || std::none_of(role.pattern.begin(), role.pattern.end(), [](bool p) { return p; })) return {};
  // Follow the role down the tree: named components by name, patterns by
  // the directory's entries (a bounded fan-out: the newest steps).
  constexpr size_t kFanOut = 8, kMaxPaths = 64;
  std::vector<std::string> paths = {std::string()};
  for (size_t i = 0; i < role.text.size() && !paths.empty(); ++i) {
    std::vector<std::string> next;
    for (const std::string& dir : paths) {
      if (!role.pattern[i]) {
        next.push_back(JoinPath(dir, role.text[i]));
        continue;
      }
      for (std::string& name : MatchingEntries(store, dir, role.text[i], kFanOut))
        next.push_back(JoinPath(dir, name));
    }
    if (next.size() > kMaxPaths) next.resize(kMaxPaths);
    paths = std::move(next);
  }
  std::vector<Found> found;
  for (const std::string& path : paths) {
    if (path == rel_path) continue;
    ReadCandidate(store.backing_fd(), path, path, &found);
  }
  return NewestCandidates(store, std::move(found), max_count, /*same_role=*/true, log);
}

std::vector<BaseCandidate> MergeBaseCandidates(const FileRole& role, std::vector<BaseCandidate> in_dir,
                                               std::vector<BaseCandidate> in_role) {
  std::vector<BaseCandidate> out;
  out.reserve(in_dir.size() + in_role.size());
  for (BaseCandidate& c : in_dir) {
    if (!c.rel_path.empty() && !role.key.empty()) {
      const FileRole theirs = RoleOf(c.rel_path);
      // Named like this file but for a rank or shard number: another
      // rank's file of a save, never a base (its values are unrelated).
      if (theirs.rank_blind == role.rank_blind && theirs.key != role.key) continue;
      c.same_role = c.same_role || theirs.key == role.key;
    }
    out.push_back(std::move(c));
  }
  const size_t from_dir = out.size();
  for (BaseCandidate& c : in_role) {
    auto same = std::find_if(out.begin(), out.begin() + static_cast<ptrdiff_t>(from_dir),
                             [&](const BaseCandidate& d) { return d.id == c.id; });
    if (same != out.begin() + static_cast<ptrdiff_t>(from_dir)) {
      same->same_role = true;
      continue;
    }
    c.same_role = true;
    out.push_back(std::move(c));
  }
  // Oldest first across both lists (each is oldest first): ChooseBase gives
  // ties to the newest, and a role's older saves appended after the
  // directory's newer ones made the save before the previous one win (a
  // folder with two files per save: every delta skipped a version).
  std::stable_sort(out.begin(), out.end(),
                   [](const BaseCandidate& a, const BaseCandidate& b) { return a.committed_ns < b.committed_ns; });
  return out;
}

}  // namespace ckptfs::fs
