// read, write, fallocate. Reads of files in STAGING/ENCODING come from the
// staging file; committed files are decoded chunk by chunk.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>

#include "fs/filesystem.h"

namespace ckptfs::fs {

void Filesystem::Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
  Inode& inode = *handle->inode;
  std::shared_ptr<StagingFile> staging;
  std::shared_ptr<const FileContent> content;
  Status s;
  {
    std::lock_guard<std::mutex> lock(inode.mu);
    s = LoadLocked(inode);
    if (s.ok()) {
      FileState& f = inode.file;
      if (f.phase == FilePhase::kStaging || f.phase == FilePhase::kEncoding) {
        staging = handle->staged_bytes = f.staging;
      } else if (handle->staged_bytes && f.committed_from.lock() == handle->staged_bytes) {
        staging = handle->staged_bytes;  // this open began on the staged bytes: no mix
      } else {
        handle->staged_bytes.reset();
        auto c = ContentLocked(inode);
        if (c.ok()) content = *c;
        else s = c.status();
      }
    }
  }
  if (!s.ok()) {
    log_->Error("read of inode {}: {}", ino, s.ToString());
    return (void)fuse_reply_err(req, ToErrno(s));
  }
  if (!staging) {
    // Queued before this read decodes its own chunks, so that the next
    // ones are decoded beside it.
    const uint64_t start = static_cast<uint64_t>(off);
    if (read_ahead_ && content->blob() && start < content->size() && size > 0) {
      const uint64_t length = std::min<uint64_t>(size, content->size() - start);
      read_ahead_->OnRead(handle->read_stream, content->blob(), start, length);
    }
    return ReplyFromContent(req, inode, *content, start, size);
  }
  // libfuse reads (or splices) the staging file itself; a short read at
  // the end of the file gives a short reply.
  fuse_bufvec data = OneBufferVec(size);
  data.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY);
  data.buf[0].fd = staging->fd();
  data.buf[0].pos = off;
  fuse_reply_data(req, &data, FUSE_BUF_SPLICE_MOVE);
}

void Filesystem::ReplyFromContent(fuse_req_t req, const Inode& inode, const FileContent& content, uint64_t start,
                                  size_t size) {
  if (start >= content.size()) return (void)fuse_reply_buf(req, nullptr, 0);
  size_t n = static_cast<size_t>(std::min<uint64_t>(size, content.size() - start));
  // Replies straight from the decoded chunks (held until the reply is
  // written): no buffer to allocate and fill per request.
  std::vector<BlobReader::Piece> pieces;
  Status s = content.ReadPieces(start, n, &pieces);
  if (!s.ok()) {
    char where[PATH_MAX] = "?";
    ssize_t len = ::readlink(inode.ProcPath().c_str(), where, sizeof where - 1);
    where[len > 0 ? len : 1] = '\0';
    log_->Error("read of {} (inode {}) at offset {} ({} bytes) failed: {}", where, inode.ino, start, n, s.ToString());
    return (void)fuse_reply_err(req, EIO);
  }
  std::vector<struct iovec> iov;
  iov.reserve(pieces.size());
  for (const auto& p : pieces)
    iov.push_back({const_cast<std::byte*>(p.data.data()), p.data.size()});  // NOLINT: fuse_reply_iov only reads
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
}

std::shared_ptr<StagingFile> Filesystem::StagingForChange(FileHandle& handle, bool is_write) {
  std::lock_guard<std::mutex> lock(handle.inode->mu);
  FileState& f = handle.inode->file;
  if (!handle.writable || f.phase != FilePhase::kStaging) return nullptr;
  f.MarkChanged(/*touch_times=*/is_write);
  if (is_write) f.cached_gen = f.content_gen;  // the kernel saw these bytes itself
  return f.staging;
}

void Filesystem::Write(fuse_req_t req, fuse_ino_t /*ino*/, const char* data, size_t size, off_t off,
                       fuse_file_info* fi) {
  auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
  std::shared_ptr<StagingFile> staging = StagingForChange(*handle, true);
  if (!staging) return (void)fuse_reply_err(req, EBADF);
  // Before the bytes change, as ext4; not for the kernel's write-back of
  // mmap'ed pages, which ext4 does not clear them for either.
  if (!fi->writepage) ClearSetIdForCaller(req, *handle->inode);
  const StagedDigest::Ticket ticket = staging->digest().BeginWrite();
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(staging->fd(), data + done, size - done, off + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      staging->digest().Invalidate();  // some of the bytes may have landed
      return (void)fuse_reply_err(req, error);
    }
    done += static_cast<size_t>(n);
  }
  // Hashed while the bytes are in the CPU's cache (fs/staged_digest.h).
  staging->digest().Append(ticket, static_cast<uint64_t>(off),
                           ByteSpan(reinterpret_cast<const std::byte*>(data), done));
  fuse_reply_write(req, done);
}

void Filesystem::Fallocate(fuse_req_t req, fuse_ino_t /*ino*/, int mode, off_t offset, off_t length,
                           fuse_file_info* fi) {
  std::shared_ptr<StagingFile> staging = StagingForChange(*reinterpret_cast<FileHandle*>(fi->fh), false);
  if (!staging) return (void)fuse_reply_err(req, EBADF);
  // The staging file has the real layout; the committed object will not
  // keep preallocated space, which only matters while staging.
  int rc = ::fallocate(staging->fd(), mode, offset, length);
  const int error = rc != 0 ? errno : 0;
  // Holes punched, ranges zeroed or the size extended: whatever it did,
  // the digests no longer follow the bytes.
  staging->digest().Invalidate();
  fuse_reply_err(req, error);
}

}  // namespace ckptfs::fs
