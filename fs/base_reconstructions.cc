#include "fs/base_reconstructions.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace ckptfs::fs {

// A kept unnamed file, open: it lives until the last reader lets go.
// Read with pread rather than mapped: its pages stay in the page cache,
// out of the daemon's RSS (mem=).
struct BaseReconstructions::KeptFile {
  int fd;
  uint64_t size;
  KeptFile(int f, uint64_t s) : fd(f), size(s) {}
  KeptFile(const KeptFile&) = delete;
  KeptFile& operator=(const KeptFile&) = delete;
  ~KeptFile() { ::close(fd); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const {
    for (uint64_t done = 0; done < out.size();) {
      const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Io(errno, "read a kept base reconstruction");
      if (n == 0) return Status::Corruption("kept base reconstruction shorter than its blob");
      done += static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }
  // XXH3-64 of the whole file, read through a small buffer.
  std::optional<uint64_t> Checksum() const {
    Checksum64Stream hash;
    std::vector<std::byte> buffer(uint64_t{1} << 20);
    for (uint64_t at = 0; at < size;) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), size - at);
      if (!ReadAt(at, MutableByteSpan(buffer.data(), n)).ok()) return std::nullopt;
      hash.Update(ByteSpan(buffer.data(), n));
      at += n;
    }
    return hash.Digest();
  }
};

namespace {

// A blob's reader whose reconstruction reads come from a kept file.
class KeptReconstructionReader final : public BlobReader {
 public:
  KeptReconstructionReader(std::shared_ptr<const BlobReader> inner,
                           std::shared_ptr<const BaseReconstructions::KeptFile> file)
      : inner_(std::move(inner)), file_(std::move(file)) {}

  uint64_t logical_size() const override { return inner_->logical_size(); }
  uint64_t stored_size() const override { return inner_->stored_size(); }
  FileFormat format() const override { return inner_->format(); }
  const std::optional<ObjectId>& base() const override { return inner_->base(); }
  uint64_t file_checksum() const override { return inner_->file_checksum(); }
  const std::vector<TensorInfo>& tensors() const override { return inner_->tensors(); }
  const std::vector<SegmentInfo>& segments() const override { return inner_->segments(); }
  const std::vector<ChunkInfo>& chunks() const override { return inner_->chunks(); }
  ByteSpan chunk_params(uint32_t index) const override { return inner_->chunk_params(index); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override {
    if (offset > file_->size || out.size() > file_->size - offset)
      return Status::InvalidArgument("blob read past the logical size");
    return file_->ReadAt(offset, out);
  }
  Status VerifyChunk(uint32_t index) const override { return inner_->VerifyChunk(index); }
  Status ReadPieces(uint64_t offset, uint64_t length, std::vector<Piece>* pieces) const override {
    return inner_->ReadPieces(offset, length, pieces);
  }
  Status Prefetch(uint32_t index, uint64_t ticket) const override { return inner_->Prefetch(index, ticket); }
  uint64_t prefetch_ticket() const override { return inner_->prefetch_ticket(); }
  void DropCached(uint32_t index) const override { inner_->DropCached(index); }

 private:
  std::shared_ptr<const BlobReader> inner_;
  std::shared_ptr<const BaseReconstructions::KeptFile> file_;
};

}  // namespace

BaseReconstructions::Pending::~Pending() {
  if (fd_ >= 0) ::close(fd_);
}

BaseReconstructions::Pending& BaseReconstructions::Pending::operator=(Pending&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
  }
  return *this;
}

BaseReconstructions::BaseReconstructions(std::string dir, uint64_t capacity_bytes)
    : dir_(std::move(dir)), capacity_(capacity_bytes) {}

BaseReconstructions::~BaseReconstructions() = default;

std::optional<BaseReconstructions::Pending> BaseReconstructions::Write(ByteSpan recon) {
  if (recon.empty() || recon.size() > capacity_) return std::nullopt;
  const int fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return std::nullopt;  // no unnamed files here (or no directory): nothing kept
  Pending pending(fd, recon.size());
  struct statvfs fs;
  if (::fstatvfs(fd, &fs) != 0) return std::nullopt;
  const double total = static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize);
  const double free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  if (free < 2.0 * static_cast<double>(recon.size()) + kKeepFreeShare * total) return std::nullopt;
  for (uint64_t at = 0; at < recon.size();) {
    const size_t n = std::min<uint64_t>(recon.size() - at, uint64_t{8} << 20);
    const ssize_t w = ::pwrite(fd, recon.data() + at, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return std::nullopt;
    at += static_cast<uint64_t>(w);
  }
  return pending;
}

void BaseReconstructions::Keep(const ObjectId& id, Pending pending, const std::optional<ObjectId>& replaces) {
  auto file = std::make_shared<const KeptFile>(std::exchange(pending.fd_, -1), pending.size_);
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->id == id || (replaces && it->id == *replaces)) DropLocked(it);
    it = next;
  }
  entries_.push_back(Entry{id, std::move(file), false});
  bytes_ += pending.size_;
  while (bytes_ > capacity_ && !entries_.empty()) DropLocked(entries_.begin());
}

void BaseReconstructions::DropLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->file->size;
  entries_.erase(it);
}

std::shared_ptr<const BlobReader> BaseReconstructions::Wrap(const ObjectId& id,
                                                            std::shared_ptr<const BlobReader> inner) {
  std::shared_ptr<const KeptFile> file;
  bool verified = false;
  {
    std::lock_guard lock(mu_);
    for (const Entry& e : entries_)
      if (e.id == id) file = e.file, verified = e.verified;
  }
  if (!file || inner == nullptr) return inner;
  if (!verified) {
    // Checked once, outside the lock (a pass over the file).
    const bool match = file->size == inner->logical_size() && file->Checksum() == inner->file_checksum();
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->id != id || it->file != file) continue;
      if (match) {
        it->verified = true;
      } else {
        DropLocked(it);
      }
      break;
    }
    if (!match) return inner;
  }
  return std::make_shared<KeptReconstructionReader>(std::move(inner), std::move(file));
}

uint64_t BaseReconstructions::kept_bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t BaseReconstructions::kept_count() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace ckptfs::fs
