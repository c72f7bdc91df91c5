// The manifest: the small file that stands in the user tree of the backing
// directory for each regular file of the mount (format in fs/STORE.md).
//
// A manifest file holds two slots, at offsets 0 and kSlotSize. An update
// writes the slot not holding the newest record with the next sequence
// number, so a torn write leaves the other slot intact and readers take the
// valid slot with the highest sequence. Updating in place (rather than
// writing a temp file and renaming it) keeps the file's inode: hard links,
// user.* xattrs, owner and mode stay attached to the file across commits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs::fs {

// Where a file's bytes live. Stored: never renumber, only append.
enum class ManifestKind : uint8_t {
  kInline = 0,   // the bytes are inside the manifest (tiny files)
  kBlob = 1,     // an encoded blob object (codec/container)
  kRaw = 2,      // a raw object: the file bytes verbatim (compress=off)
  kStaging = 3,  // a staging file, not yet committed (after fsync or close)
};
std::string_view ManifestKindName(ManifestKind kind);

// Identifies a staging file: .ckptfs/staging/<hex[0:16]>/<hex[16:32]>, the
// first half naming the daemon's staging directory. Validated as hex like
// an ObjectId, so a manifest cannot name a path outside the store.
struct StagingId {
  ObjectId raw;
  std::string RelPath() const;  // "staging/<16 hex>/<16 hex>"
  std::string DirHex() const { return raw.Hex().substr(0, 16); }
  std::string FileHex() const { return raw.Hex().substr(16); }
  friend bool operator==(const StagingId&, const StagingId&) = default;
};

struct Manifest {
  static constexpr char kMagic[8] = {'C', 'K', 'F', 'S', 'M', 'A', 'N', '1'};
  // Version 1 records; version 2 is written only for a record whose inline
  // data is compressed (inline_zstd), so that a reader that predates it
  // says Unsupported instead of serving the slot as a plain file.
  static constexpr uint16_t kVersion = 1;
  static constexpr uint16_t kVersionInlineZstd = 2;
  static constexpr uint16_t kNewestVersion = kVersionInlineZstd;
  static constexpr size_t kSlotSize = 4096;
  static constexpr size_t kHeaderSize = 96;  // fixed fields before inline data
  static constexpr size_t kTrailerSize = 8;  // checksum
  static constexpr size_t kMaxInline = kSlotSize - kHeaderSize - kTrailerSize;
  // The largest file stored as a compressed inline record (a bound on what
  // a slot may inflate to; the commit tries files up to this size).
  static constexpr size_t kMaxInlineZstdSize = size_t{64} << 10;

  ManifestKind kind = ManifestKind::kInline;
  FileFormat format = FileFormat::kOpaque;
  uint64_t sequence = 0;       // bumped by every update
  uint64_t logical_size = 0;   // st_size of the file in the mount
  uint64_t stored_bytes = 0;   // size of the object (0 for inline/staging)
  ObjectId object;             // kBlob, kRaw
  std::optional<ObjectId> base;  // kBlob: the base blob the object deltas against
  StagingId staging;           // kStaging
  uint32_t chain_depth = 0;    // kBlob: number of delta links down to a key frame
  std::vector<std::byte> inline_data;  // kInline: the bytes, or one zstd frame of them
  bool inline_zstd = false;            // kInline: inline_data is a zstd frame of logical_size bytes

  // Bytes of one slot for this record (kHeaderSize + inline + checksum).
  // REQUIRES: inline_data.size() <= kMaxInline.
  void EncodeTo(std::vector<std::byte>* out) const;
  // Decodes one slot. Corruption if the magic, version, checksum or any
  // field is invalid (reserved bits set, unknown kind, inline size wrong).
  static Result<Manifest> DecodeFrom(ByteSpan slot);
};

// How a record keeps its bytes, for people: the kind's name, or
// "inline+zstd" for compressed inline data.
std::string_view StorageName(const Manifest& m);

// Reads the manifest in the file open at `fd`: the valid slot with the
// highest sequence. nullopt when neither slot is valid (a plain file, which
// the mount serves verbatim). Thread safety: reentrant.
Result<std::optional<Manifest>> ReadManifest(int fd);

// The record the newest one replaced: the other slot's, when it is valid
// and older (nullopt otherwise). An update overwrites the older slot, so
// after a staging record (an fsync, or a close before its commit) that
// replaced a committed one, this is the file's committed version until
// the next update. Thread safety: reentrant.
Result<std::optional<Manifest>> ReadReplacedManifest(int fd);

// Writes `*m` into the slot after `m->sequence` (setting m->sequence to the
// new value), then fdatasyncs when `durable`. Keeps the file's mtime/atime
// (the manifest's times are the user file's times). REQUIRES: fd is open
// for writing; callers serialise updates of one file.
Status WriteManifest(int fd, Manifest* m, bool durable);

// Creates the manifest of an empty file in the file open at `fd` (used by
// create and for new files): slot 0, sequence 1.
Status InitEmptyManifest(int fd, bool durable);

}  // namespace ckptfs::fs
