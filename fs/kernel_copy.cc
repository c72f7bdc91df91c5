// The kernel's page cache of a file just committed lossily. The kernel
// holds the staged bytes it wrote, which a lossy reconstruction differs
// from; dropped, the next open on this node would read the whole file
// through the daemon (a torch.load right after a save, an evaluation job
// picking up the newest checkpoint). The encoder has the reconstruction in
// memory at that moment: it is copied over the staged pages
// (FUSE_NOTIFY_STORE) as background work after the commit, about 0.1 s per
// GB where those pages are still cached, and the next open keeps them, as
// a plain file's written pages are kept.
//
// Consistency: the commit starts a new content generation, so an open
// before the copy begins drops the cache (keep_cache off) and reads the
// rest from the daemon; an open while it runs waits for it (at most
// kKernelCopyWait). Each message lands only while the file's bytes are
// still the committed version's (generation unchanged, no writer open); a
// writer or truncate waits for the copy, and one that waited too long makes
// it stop and drop the file's cached pages. A file with open handles at
// the commit is not copied: an open from before the commit goes on reading
// the staged bytes it began with (FileHandle::staged_bytes), and the
// kernel's cache is shared by all opens.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>
#include <vector>

#include "fs/filesystem.h"  // fuse_lowlevel.h, with its FUSE_USE_VERSION

namespace ckptfs::fs {
namespace {

// One notify message, a multiple of the page size (the kernel marks a page
// valid only when one message fills it): large enough that its cost is the
// copy.
constexpr uint64_t kPieceBytes = uint64_t{8} << 20;

// Files up to a quarter of the machine's memory are copied: the kernel's
// cache holds what was written to any file as long as it can anyway, but a
// file near the memory's size would only push out its own first pages.
uint64_t KernelCopyLimit() { return PhysicalMemoryBytes() / 4; }

}  // namespace

bool Filesystem::QueueKernelCopy(const std::shared_ptr<Inode>& inode, const EncodedVersion& version) {
  const EncodedVersion::Reconstruction& r = version.reconstruction;
  // With mem= the reconstruction's memory belongs to its encode's
  // reservation, which ends now: nothing may hold it after.
  if (r.empty() || session_ == nullptr || !queue_ || options_.mem_mib != 0) return false;
  // The pieces must tile the file from its start (the chunks do).
  uint64_t total = 0;
  for (const auto& [offset, bytes] : r.pieces) {
    if (offset != total) return false;
    total += bytes.size();
  }
  if (total != version.fields.logical_size || total > KernelCopyLimit()) return false;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(inode->mu);
    FileState& f = inode->file;
    if (f.handles != 0 || f.writers != 0 || f.phase != FilePhase::kCommitted) return false;
    // Until the copy is whole the cache mixes staged and reconstructed
    // pages: an open meanwhile drops them (keep_cache is off for a new
    // generation) and reads the rest from the daemon.
    gen = ++f.content_gen;
  }
  queue_->PushBackground([this, inode, gen, r] { CopyToKernel(inode, gen, r); });
  return true;
}

void Filesystem::CopyToKernel(const std::shared_ptr<Inode>& inode, uint64_t gen,
                              const EncodedVersion::Reconstruction& r) {
  FileState& f = inode->file;
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(inode->mu);
    if (f.content_gen != gen || f.writers != 0 || f.phase != FilePhase::kCommitted) return;
    f.kernel_copy_running = true;
    f.kernel_copy_raced = false;
  }
  // Windows of the file, each one message: straight from a piece's memory
  // when it lies in one, gathered into `bounce` when it spans several (a
  // small file's chunks).
  const uint64_t size = r.pieces.back().first + r.pieces.back().second.size();
  std::vector<std::byte> bounce;
  size_t first = 0;  // the piece holding `at`
  uint64_t at = 0;
  bool whole = true;
  while (whole && at < size) {
    const uint64_t n = std::min<uint64_t>(kPieceBytes, size - at);
    while (r.pieces[first].first + r.pieces[first].second.size() <= at) ++first;
    const auto& [offset, bytes] = r.pieces[first];
    const std::byte* window;
    if (at + n <= offset + bytes.size()) {
      window = bytes.data() + (at - offset);
    } else {
      bounce.resize(n);
      for (size_t i = first, filled = 0; filled < n; ++i) {
        const auto& [o, b] = r.pieces[i];
        const uint64_t from = at + filled - o;
        const uint64_t take = std::min<uint64_t>(b.size() - from, n - filled);
        std::copy_n(b.data() + from, take, bounce.data() + filled);
        filled += take;
      }
      window = bounce.data();
    }
    {
      std::lock_guard<std::mutex> lock(inode->mu);
      whole = f.content_gen == gen && f.writers == 0 && !f.kernel_copy_raced;
    }
    if (!whole) break;
    fuse_bufvec data = OneBufferVec(n);
    data.buf[0].mem = const_cast<std::byte*>(window);  // NOLINT: the kernel only reads it
    // No lock is held: the kernel may wait on a READ of this inode.
    const int rc =
        fuse_lowlevel_notify_store(session_, inode->ino, static_cast<off_t>(at), &data, fuse_buf_copy_flags{});
    if (rc != 0) {
      // -ENOENT: the kernel forgot the inode (unlinked, evicted).
      if (rc != -ENOENT) log_->Debug("notify_store({}): {}", inode->ino, rc);
      whole = false;
    }
    at += n;
  }
  bool raced;
  {
    std::lock_guard<std::mutex> lock(inode->mu);
    f.kernel_copy_running = false;
    raced = std::exchange(f.kernel_copy_raced, false);
    // Whole: the next open keeps these pages. Otherwise it drops them (a
    // new generation), and what a writer changed is the writer's.
    if (whole && !raced && f.content_gen == gen) f.cached_gen = gen;
  }
  inode->kernel_copy_done.notify_all();
  // A writer went on without waiting for the copy: a piece that landed
  // after its open may be older than its bytes.
  if (raced) (void)fuse_lowlevel_notify_inval_inode(session_, inode->ino, 0, 0);
  log_->Debug("inode {}: {} of {} bytes into the kernel's cache in {:.3f} s", inode->ino, whole ? size : at, size,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void Filesystem::AwaitKernelCopyLocked(std::unique_lock<std::mutex>& lock, Inode& inode, bool write) {
  if (!inode.file.kernel_copy_running) return;
  if (!inode.kernel_copy_done.wait_for(lock, kKernelCopyWait, [&] { return !inode.file.kernel_copy_running; }) &&
      write)
    inode.file.kernel_copy_raced = true;
}

}  // namespace ckptfs::fs
