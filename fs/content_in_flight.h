// Commits of byte-identical content that run at the same time encode it
// once. A save and its copy (Lightning's last.ckpt, copied right after the
// epoch file; a `cp` of a file still being committed) are both queued
// before either is in the content index (fs/content_index.h): without this
// each would be encoded, and the copy would store a second blob. The copy's
// commit waits for the first one, then finds its blob in the index.
#pragma once

#include <condition_variable>
#include <mutex>
#include <set>

#include "codec/common/hash.h"

namespace ckptfs::fs {

// Thread safety: all methods are thread-safe.
class ContentInFlight {
 public:
  // Held while a commit encodes content `key`; released on destruction.
  class Claim {
   public:
    Claim() = default;
    Claim(Claim&& other) noexcept : owner_(other.owner_), key_(other.key_), waited_(other.waited_) {
      other.owner_ = nullptr;
    }
    Claim& operator=(Claim&&) = delete;
    ~Claim();
    // True when another commit held the key and this one waited for it to
    // finish: look the index up again before encoding.
    bool waited() const { return waited_; }

   private:
    friend class ContentInFlight;
    ContentInFlight* owner_ = nullptr;
    ObjectId key_;
    bool waited_ = false;
  };

  // Claims `key`, first waiting while another commit holds it.
  Claim Acquire(const ObjectId& key);

 private:
  void Release(const ObjectId& key);

  std::mutex mu_;  // leaf lock
  std::condition_variable released_;
  std::set<ObjectId> held_;
};

}  // namespace ckptfs::fs
