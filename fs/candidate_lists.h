// The daemon's memory of recent versions, the delta-base candidates of the
// next ones: a list per directory and a list per role (fs/version_role.h),
// each the newest few versions plus the anchors a list keeps
// (TrimBaseCandidates). A list is seeded once from the store (after a
// mount the memory is empty; the first commit scans) and then follows the
// commits. Lists of directories or roles not written for a while leave
// (least recently used first) so that a long run of step folders keeps a
// bounded number of lists, and of objects alive for GC.
// Thread safety: none; the owner locks.
#pragma once

#include <cstddef>
#include <deque>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "fs/commit_pipeline.h"

namespace ckptfs::fs {

class CandidateLists {
 public:
  // REQUIRES: max_lists >= 1.
  CandidateLists(size_t max_lists, size_t max_per_list) : max_lists_(max_lists), max_per_list_(max_per_list) {}

  // The list of `key`, oldest first; false when it was never seeded.
  bool Get(const std::string& key, std::vector<BaseCandidate>* out);
  // Seeds the list of `key` with versions scanned from the store (oldest
  // first), once: versions committed since the scan began stay newer.
  // Returns false (changing nothing) when it was seeded already.
  bool Seed(const std::string& key, std::vector<BaseCandidate> scanned);
  // Appends a committed version to the list of `key` (seeding it empty).
  void Remember(const std::string& key, BaseCandidate candidate);
  // Drops the list of `key` (a directory that is gone).
  void Forget(const std::string& key);
  // The objects every list names (GC keeps them).
  void AppendIds(std::vector<ObjectId>* out) const;
  size_t size() const { return lists_.size(); }

 private:
  struct Entry {
    std::deque<BaseCandidate> list;
    std::list<std::string>::iterator order;
  };
  Entry& Touch(const std::string& key);

  const size_t max_lists_;
  const size_t max_per_list_;
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, Entry> lists_;
};

}  // namespace ckptfs::fs
