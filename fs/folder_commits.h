// The encodes running in each folder, in the order they started. A file
// of a save may hold weights that an earlier file of the same save holds
// too (DeepSpeed's optimizer files repeat its model file's): coded as ref
// copies of that file's blob (codec/optimizer/ref_copies.h) it costs next
// to nothing, but only once that blob is committed. An encode therefore
// waits for the encodes of its folder that started before it (their
// files were closed first), up to a bound; waiting costs the save little,
// since an encode alone gets every core (threads=). An entry leaves once its
// version is a base candidate, before the rest of the commit's aftermath.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>

namespace ckptfs::fs {

// Thread safety: all methods are thread-safe.
class FolderCommits {
 public:
  // An encode registered in `dir` until destroyed.
  class Entry {
   public:
    Entry(FolderCommits& owner, ino_t dir, uint64_t ticket) : owner_(&owner), dir_(dir), ticket_(ticket) {}
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() { Release(); }
    // Leaves the list now (later commits of its folder stop waiting for it).
    void Release() {
      if (owner_ != nullptr) owner_->Leave(dir_, ticket_);
      owner_ = nullptr;
    }
    ino_t dir() const { return dir_; }
    uint64_t ticket() const { return ticket_; }

   private:
    FolderCommits* owner_;
    ino_t dir_;
    uint64_t ticket_;
  };

  Entry Enter(ino_t dir);
  // Waits until no encode of entry's folder that entered before it is
  // registered, `timeout` has passed, or give_up() (asked every 50 ms)
  // says so. Returns whether it waited at all.
  bool WaitForEarlier(const Entry& entry, std::chrono::milliseconds timeout, const std::function<bool()>& give_up);

 private:
  void Leave(ino_t dir, uint64_t ticket);

  std::mutex mu_;  // leaf lock
  std::condition_variable left_;
  uint64_t next_ = 0;
  std::map<ino_t, std::set<uint64_t>> running_;
};

}  // namespace ckptfs::fs
