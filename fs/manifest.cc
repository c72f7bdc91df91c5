#include "fs/manifest.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <fmt/format.h>
#include <zstd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ckptfs::fs {

std::string_view ManifestKindName(ManifestKind kind) {
  switch (kind) {
    case ManifestKind::kInline: return "inline";
    case ManifestKind::kBlob: return "blob";
    case ManifestKind::kRaw: return "raw";
    case ManifestKind::kStaging: return "staging";
  }
  return "unknown";
}

std::string_view StorageName(const Manifest& m) {
  return m.kind == ManifestKind::kInline && m.inline_zstd ? "inline+zstd" : ManifestKindName(m.kind);
}

std::string StagingId::RelPath() const { return "staging/" + DirHex() + "/" + FileHex(); }

namespace {
constexpr uint8_t kFlagHasBase = 1;
constexpr uint8_t kFlagInlineZstd = 2;  // version 2 only

ByteSpan IdBytes(const ObjectId& id) { return {reinterpret_cast<const std::byte*>(id.bytes.data()), 16}; }
// Zero when `b` is short (a ByteReader past its end returns an empty span;
// the caller then fails on the reader's status).
ObjectId IdFrom(ByteSpan b) {
  ObjectId id;
  if (b.size() == 16) std::memcpy(id.bytes.data(), b.data(), 16);
  return id;
}
}  // namespace

// Slot layout (little-endian), see fs/STORE.md:
//   0 magic[8] | 8 version u16 | 10 kind u8 | 11 format u8 | 12 flags u8 |
//   13 reserved[3]=0 | 16 sequence u64 | 24 logical_size u64 |
//   32 stored_bytes u64 | 40 object[16] | 56 base[16] | 72 staging[16] |
//   88 chain_depth u32 | 92 inline_len u32 | 96 inline[inline_len] |
//   checksum u64 = XXH3-64 of every preceding byte of the slot.
void Manifest::EncodeTo(std::vector<std::byte>* out) const {
  out->clear();
  // Sized up front: one allocation (and it keeps GCC 12 at -O3 from a false
  // -Warray-bounds on the first append to an empty vector).
  out->reserve(kHeaderSize + inline_data.size() + kTrailerSize);
  ByteWriter w(out);
  w.Bytes(AsBytes(std::string_view(kMagic, 8)));
  w.U16(inline_zstd ? kVersionInlineZstd : kVersion);
  w.U8(static_cast<uint8_t>(kind));
  w.U8(static_cast<uint8_t>(format));
  w.U8(static_cast<uint8_t>((base ? kFlagHasBase : 0) | (inline_zstd ? kFlagInlineZstd : 0)));
  w.Zeros(3);
  w.U64(sequence);
  w.U64(logical_size);
  w.U64(stored_bytes);
  w.Bytes(IdBytes(object));
  w.Bytes(IdBytes(base ? *base : ObjectId{}));
  w.Bytes(IdBytes(staging.raw));
  w.U32(chain_depth);
  w.U32(static_cast<uint32_t>(inline_data.size()));
  w.Bytes(inline_data);
  w.U64(Checksum64(*out));
}

Result<Manifest> Manifest::DecodeFrom(ByteSpan slot) {
  ByteReader r(slot, "manifest slot");
  ByteSpan magic = r.Bytes(8);
  if (!r.ok() || std::memcmp(magic.data(), kMagic, 8) != 0) return Status::Corruption("manifest: bad magic");
  uint16_t version = r.U16();
  Manifest m;
  uint8_t kind = r.U8();
  uint8_t format = r.U8();
  uint8_t flags = r.U8();
  ByteSpan reserved = r.Bytes(3);
  m.sequence = r.U64();
  m.logical_size = r.U64();
  m.stored_bytes = r.U64();
  m.object = IdFrom(r.Bytes(16));
  ObjectId base = IdFrom(r.Bytes(16));
  m.staging.raw = IdFrom(r.Bytes(16));
  m.chain_depth = r.U32();
  uint32_t inline_len = r.U32();
  RETURN_IF_ERROR(r.status());
  if (inline_len > kMaxInline)
    return Status::Corruption(fmt::format("manifest: inline size want<={} have={}", kMaxInline, inline_len));
  ByteSpan data = r.Bytes(inline_len);
  size_t checked = r.position();
  uint64_t checksum = r.U64();
  RETURN_IF_ERROR(r.status());
  if (Checksum64(slot.first(checked)) != checksum) return Status::ChecksumMismatch("manifest: slot checksum");
  if (version != kVersion && version != kVersionInlineZstd)
    return Status::Unsupported(fmt::format("manifest: version want<={} have={}", kNewestVersion, version));
  if (kind > static_cast<uint8_t>(ManifestKind::kStaging))
    return Status::Corruption(fmt::format("manifest: unknown kind {}", kind));
  const uint8_t known_flags = version == kVersionInlineZstd ? (kFlagHasBase | kFlagInlineZstd) : kFlagHasBase;
  if ((flags & ~known_flags) != 0 || reserved[0] != std::byte{0} || reserved[1] != std::byte{0} ||
      reserved[2] != std::byte{0})
    return Status::Corruption("manifest: reserved bits set");
  m.kind = static_cast<ManifestKind>(kind);
  m.format = static_cast<FileFormat>(format);
  if (flags & kFlagHasBase) m.base = base;
  m.inline_zstd = (flags & kFlagInlineZstd) != 0;
  if (version == kVersionInlineZstd && !m.inline_zstd)
    return Status::Corruption("manifest: version 2 record without compressed inline data");
  if (m.inline_zstd) {
    // One zstd frame declaring exactly logical_size bytes, bounded: a slot
    // never inflates past kMaxInlineZstdSize.
    if (m.kind != ManifestKind::kInline) return Status::Corruption("manifest: compressed inline data on a non-inline record");
    if (m.logical_size > kMaxInlineZstdSize)
      return Status::Corruption(fmt::format("manifest: compressed inline record of {} bytes, want<={}", m.logical_size,
                                            kMaxInlineZstdSize));
    const unsigned long long content = ZSTD_getFrameContentSize(data.data(), data.size());
    const size_t frame = ZSTD_findFrameCompressedSize(data.data(), data.size());
    if (content != m.logical_size || ZSTD_isError(frame) || frame != data.size())
      return Status::Corruption("manifest: compressed inline data is not one zstd frame of the file's size");
  } else if (m.kind == ManifestKind::kInline && inline_len != m.logical_size) {
    return Status::Corruption(
        fmt::format("manifest: inline data want={} bytes have={}", m.logical_size, inline_len));
  }
  if (m.kind != ManifestKind::kInline && inline_len != 0) return Status::Corruption("manifest: stray inline data");
  m.inline_data.assign(data.begin(), data.end());
  return m;
}

namespace {

// The valid records of both slots of the manifest in `fd`, the newest
// first; Unsupported when none is valid and one is from a newer version.
Result<std::vector<Manifest>> ReadValidSlots(int fd) {
  std::vector<std::byte> buf(2 * Manifest::kSlotSize);
  size_t have = 0;
  while (have < buf.size()) {
    ssize_t n = ::pread(fd, buf.data() + have, buf.size() - have, static_cast<off_t>(have));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Io(errno, "read manifest");
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  std::vector<Manifest> valid;
  Status unsupported;
  for (size_t slot = 0; slot < 2; ++slot) {
    size_t at = slot * Manifest::kSlotSize;
    if (have <= at) break;
    auto m = Manifest::DecodeFrom(ByteSpan(buf).subspan(at, std::min(have - at, Manifest::kSlotSize)));
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kUnsupported) unsupported = m.status();
      continue;
    }
    valid.push_back(std::move(*m));
  }
  // A valid slot from a newer version must not be mistaken for a plain file.
  if (valid.empty() && !unsupported.ok()) return unsupported;
  std::sort(valid.begin(), valid.end(), [](const Manifest& a, const Manifest& b) { return a.sequence > b.sequence; });
  return valid;
}

}  // namespace

Result<std::optional<Manifest>> ReadManifest(int fd) {
  ASSIGN_OR_RETURN(std::vector<Manifest> valid, ReadValidSlots(fd));
  if (valid.empty()) return std::optional<Manifest>();
  return std::optional<Manifest>(std::move(valid.front()));
}

Result<std::optional<Manifest>> ReadReplacedManifest(int fd) {
  ASSIGN_OR_RETURN(std::vector<Manifest> valid, ReadValidSlots(fd));
  if (valid.size() < 2 || valid[1].sequence >= valid[0].sequence) return std::optional<Manifest>();
  return std::optional<Manifest>(std::move(valid[1]));
}

Status WriteManifest(int fd, Manifest* m, bool durable) {
  if (m->inline_data.size() > Manifest::kMaxInline) return Status::Internal("manifest: inline data too large");
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Io(errno, "fstat manifest");
  m->sequence += 1;
  std::vector<std::byte> slot;
  m->EncodeTo(&slot);
  off_t at = static_cast<off_t>((m->sequence % 2) * Manifest::kSlotSize);
  ssize_t n = ::pwrite(fd, slot.data(), slot.size(), at);
  if (n < 0) return Status::Io(errno, "write manifest");
  if (static_cast<size_t>(n) != slot.size()) return Status::NoSpace("write manifest: short write");
  // A converted plain file may be longer than two slots: drop its old bytes.
  if (st.st_size > static_cast<off_t>(2 * Manifest::kSlotSize) &&
      ::ftruncate(fd, static_cast<off_t>(2 * Manifest::kSlotSize)) != 0)
    return Status::Io(errno, "truncate manifest");
  if (durable && ::fdatasync(fd) != 0) return Status::Io(errno, "fdatasync manifest");
  // Once a record in slot 0 is durable, slot 1's older record is not
  // needed: its block is given back (it reads as zeros, an invalid slot
  // that readers skip), so a committed manifest takes one block, not two.
  // Commits land in slot 0 (a new file's record is sequence 2, a commit
  // follows its staging record). A file system without hole punching just
  // keeps the block.
  if (durable && at == 0 && st.st_size > static_cast<off_t>(Manifest::kSlotSize))
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(Manifest::kSlotSize),
                      static_cast<off_t>(Manifest::kSlotSize));
  // Writing (and punching) changed the times; they are the user's.
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  if (::futimens(fd, times) != 0) return Status::Io(errno, "keep manifest times");
  return Status::Ok();
}

Status InitEmptyManifest(int fd, bool durable) {
  Manifest m;
  m.sequence = 2;  // a record lives in slot (sequence % 2): slot 0 here
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  if (::ftruncate(fd, 0) != 0) return Status::Io(errno, "truncate new manifest");
  ssize_t n = ::pwrite(fd, slot.data(), slot.size(), 0);
  if (n < 0) return Status::Io(errno, "write manifest");
  if (static_cast<size_t>(n) != slot.size()) return Status::NoSpace("write manifest: short write");
  if (durable && ::fdatasync(fd) != 0) return Status::Io(errno, "fdatasync manifest");
  return Status::Ok();
}

}  // namespace ckptfs::fs
