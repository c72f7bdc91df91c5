#include "fs/content_in_flight.h"

namespace ckptfs::fs {

ContentInFlight::Claim::~Claim() {
  if (owner_ != nullptr) owner_->Release(key_);
}

ContentInFlight::Claim ContentInFlight::Acquire(const ObjectId& key) {
  Claim claim;
  std::unique_lock<std::mutex> lock(mu_);
  while (held_.count(key) != 0) {
    claim.waited_ = true;
    released_.wait(lock);
  }
  held_.insert(key);
  claim.owner_ = this;
  claim.key_ = key;
  return claim;
}

void ContentInFlight::Release(const ObjectId& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(key);
  }
  released_.notify_all();
}

}  // namespace ckptfs::fs
