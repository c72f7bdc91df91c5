#include "fs/staged_digest.h"

#include <algorithm>

namespace ckptfs::fs {

FileDigests DigestFile(ByteSpan file) {
  ObjectIdStream id;
  Checksum64Stream checksum;
  constexpr size_t kBlock = 256 << 10;  // hashed by both while in cache
  for (size_t off = 0; off < file.size(); off += kBlock) {
    const ByteSpan block = file.subspan(off, std::min(kBlock, file.size() - off));
    id.Update(block);
    checksum.Update(block);
  }
  return FileDigests{id.Digest(), checksum.Digest()};
}

StagedDigest::StagedDigest(bool enabled) : enabled_(enabled) {}

void StagedDigest::Reset() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  known_ = true;
  length_ = 0;
  id_.emplace();
  checksum_.emplace();
}

void StagedDigest::Invalidate() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  known_ = false;
}

void StagedDigest::Truncated(uint64_t size) {
  if (size == 0) return Reset();
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  if (size != length_) known_ = false;
}

StagedDigest::Ticket StagedDigest::BeginWrite() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Ticket{generation_};
}

void StagedDigest::Append(const Ticket& ticket, uint64_t offset, ByteSpan data) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!known_) return;
  if (ticket.generation != generation_ || offset != length_) {
    // Out of order, overlapping, or raced by a truncate: unknown from now
    // on (the bump also fails the tickets of writes still in flight).
    ++generation_;
    known_ = false;
    return;
  }
  id_->Update(data);
  checksum_->Update(data);
  length_ += data.size();
}

std::optional<FileDigests> StagedDigest::For(uint64_t size) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!known_ || length_ != size) return std::nullopt;
  return FileDigests{id_->Digest(), checksum_->Digest()};
}

}  // namespace ckptfs::fs
