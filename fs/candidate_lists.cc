#include "fs/candidate_lists.h"

#include <algorithm>

#include "fs/base_candidates.h"

namespace ckptfs::fs {

CandidateLists::Entry& CandidateLists::Touch(const std::string& key) {
  auto it = lists_.find(key);
  if (it != lists_.end()) {
    order_.splice(order_.begin(), order_, it->second.order);
    return it->second;
  }
  while (lists_.size() >= max_lists_ && !order_.empty()) {
    lists_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(key);
  Entry& e = lists_[key];
  e.order = order_.begin();
  return e;
}

bool CandidateLists::Get(const std::string& key, std::vector<BaseCandidate>* out) {
  auto it = lists_.find(key);
  if (it == lists_.end()) return false;
  Entry& e = Touch(key);
  out->assign(e.list.begin(), e.list.end());
  return true;
}

bool CandidateLists::Seed(const std::string& key, std::vector<BaseCandidate> scanned) {
  if (lists_.count(key) != 0) return false;
  Entry& e = Touch(key);
  for (BaseCandidate& c : scanned) e.list.push_back(std::move(c));
  TrimBaseCandidates(&e.list, max_per_list_);
  return true;
}

void CandidateLists::Remember(const std::string& key, BaseCandidate candidate) {
  Entry& e = Touch(key);
  // A version already listed (a byte-identical copy that reuses an object, or a
  // racing scan) moves to the newest place instead of appearing twice.
  auto same = std::find_if(e.list.begin(), e.list.end(), [&](const BaseCandidate& c) { return c.id == candidate.id; });
  if (same != e.list.end()) e.list.erase(same);
  RememberBaseCandidate(&e.list, std::move(candidate), max_per_list_);
}

void CandidateLists::Forget(const std::string& key) {
  auto it = lists_.find(key);
  if (it == lists_.end()) return;
  order_.erase(it->second.order);
  lists_.erase(it);
}

void CandidateLists::AppendIds(std::vector<ObjectId>* out) const {
  for (const auto& [key, e] : lists_)
    for (const BaseCandidate& c : e.list) out->push_back(c.id);
}

}  // namespace ckptfs::fs
