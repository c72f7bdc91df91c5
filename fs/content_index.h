// Identical content stored once: an index from a file version's content
// key (the XXH3-128 of its bytes and of how they are to be encoded) to the
// blob that already stores it, so that a byte-identical copy (`cp`,
// `shutil.copy2`, Lightning's last.ckpt, one optimizer file saved twice)
// names the existing blob instead of encoding a new one.
//
// On disk (fs/STORE.md §1): BACKING/.ckptfs/content/<32 hex of the key>, a
// symbolic link whose target is the entry as text (a "fast" symlink: on
// ext4 and most file systems it lives in the inode and takes no data
// block, so the index adds no space per checkpoint). Made under a temp name
// and renamed; not fsynced: a lost entry only costs a later copy its
// deduplication. An entry is a hint: a lookup checks its checksum, that the
// blob still exists (refreshing it and its chain for GC's grace period, as
// a delta base is) and that its size and format are the file's. GC removes
// entries whose blob it removed.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "codec/common/hash.h"
#include "codec/format/layout.h"
#include "fs/commit_pipeline.h"
#include "fs/log.h"
#include "fs/store.h"

namespace ckptfs::fs {

// Entry text: "<object: 32 lowercase hex>.<chain_depth>.<format>.<logical
// size in lowercase hex>.<checksum>", the numbers without leading zeros,
// the checksum the low 32 bits of XXH3-64 of the text before its dot, as 8
// lowercase hex digits. 50-60 characters.
struct ContentEntry {
  ObjectId object;
  uint32_t chain_depth = 0;
  FileFormat format = FileFormat::kOpaque;
  uint64_t logical_size = 0;

  std::string EncodeText() const;
  // Corruption for anything but the text EncodeText writes.
  static Result<ContentEntry> DecodeText(std::string_view text);
};

// The settings of `encode` that change what a blob reconstructs (budget
// schedule, prediction, step space, ...), as text for CommitOptions::coding.
// Compression levels are left out: they change the bytes, not the values.
std::string CodingSignature(const EncodeOptions& encode);

// A file's digests (FileDigests, fs/staged_digest.h): XXH3-128
// (ObjectId::Of) and XXH3-64 (Checksum64) of its bytes, hashed as they were
// written or, failing that, by DigestFile at commit time.

// The content key of `file` (parsed as `layout`) stored with `options` at
// `logical_path`: its bytes, the encoder's settings (options.coding) and
// the error budget the policy gives each of its tensors there. Equal keys
// mean equal bytes that would be encoded under the same promises, so one
// blob serves both (its errors were measured against these very values).
ObjectId ContentKey(const FileDigests& file, const Layout& layout, const CommitOptions& options,
                    std::string_view logical_path);

// The key of a file whose bytes *are* a blob's reconstruction (XXH3-64 of
// the whole file, as the blob records it, and its size): a copy made by
// reading a lossy file through the mount (`cp`, shutil.copy) has the
// reconstruction's bytes, not the original's, so ContentKey misses it; the
// blob gives those bytes back exactly, whatever the policy.
ObjectId ExactKey(uint64_t size, uint64_t checksum64);

// A blob that already stores `file`: by its content key `content_key`, or
// by its ExactKey when the blob's reconstruction equals `file` byte for
// byte (compared, not assumed from the checksum). nullopt when none.
std::optional<ContentEntry> FindStoredContent(Store& store, ByteSpan file, const FileDigests& digests,
                                              FileFormat format, const ObjectId& content_key, Logger* log);

// The entry of `key`, if any, whose blob exists (its chain refreshed) and
// matches `logical_size` and `format`; nullopt otherwise (a stale or
// damaged entry is a debug line, never an error).
std::optional<ContentEntry> FindIdenticalContent(Store& store, const ObjectId& key, uint64_t logical_size,
                                                 FileFormat format, Logger* log);

// Records that `entry.object` stores the content of `key`. Best effort: a
// failure is logged at debug level.
void RecordContent(Store& store, const ObjectId& key, const ContentEntry& entry, Logger* log);

// Removes entries whose object is gone (after a GC sweep). Returns how many.
uint64_t SweepContentIndex(Store& store, bool dry_run);

}  // namespace ckptfs::fs
