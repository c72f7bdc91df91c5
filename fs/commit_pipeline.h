// The commit of one file version: staging file -> object -> manifest, in the
// order that keeps DESIGN §3 invariant 1 (nothing acknowledged is lost):
//   1. SyncStagingAndMark: fsync the staging file, then make the manifest
//      point at it (kind staging) durably. From here a crash re-encodes it.
//   2. EncodeStaged: detect the layout, choose a base, encode into a temp
//      object, fsync, rename to objects/, fsync the directory.
//   3. CommitManifest: the manifest names the object, durably.
//   4. RemoveStagingFile: the staging file goes.
// A crash between any two steps leaves a manifest that names either the old
// version, the staging file (complete: it was fsynced in step 1) or the
// new object; recovery (recovery.h) finishes the staging case.
// Each step is a free function so the daemon can take its per-inode lock
// around the manifest writes; CommitStagedFile runs them all (recovery and
// tests).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "codec/optimizer/ref_copies.h"
#include "codec/policy/policy.h"
#include "fs/content_in_flight.h"
#include "fs/log.h"
#include "fs/manifest.h"
#include "fs/store.h"

namespace ckptfs::fs {

// Names of the fault-injection points, in commit order (option crash_at).
inline constexpr std::string_view kCommitSteps[] = {
    "after_staging_sync", "after_staging_manifest", "after_objects", "after_manifest",
    "before_staging_removal"};
bool IsCommitStep(std::string_view name);

// The manifest file's extended attribute naming the level a version was
// committed under (fs/STORE.md §2). The mount hides it from users' xattrs
// (user.ckptfs.* is the virtual namespace) and answers it as user.ckptfs.level.
inline constexpr char kLevelXattr[] = "user.ckptfs.level";

// The level recorded for the manifest open at `fd` ("" when none was: a
// version committed before levels existed, by a tool, or on a filesystem
// without xattrs).
std::string RecordedLevel(int fd);

struct CommitOptions {
  bool compress = true;      // false: store raw objects (no parsing, no encoding)
  uint32_t keyframe = 10;    // a key frame at least every `keyframe` versions
  uint64_t inline_max = 3072;  // files up to this size live in the manifest
  EncodeOptions encode;
  // The encoder's settings that change what a blob stores (schedule,
  // prediction, ...), as text: part of the content key under which a
  // byte-identical copy reuses a blob (fs/content_index.h).
  std::string coding;
  // Look byte-identical content up in the content index and reuse its blob.
  bool dedup = true;
  // Commits of identical content running at once encode it once (the
  // daemon's; null: each commit on its own).
  std::shared_ptr<ContentInFlight> in_flight;
  // Old versions of this file's role are being deleted (seen since mount):
  // lossless deltas that do not pay start new chains (ChooseBase).
  bool retention = false;
  // A DCP shard that no .metadata names yet (a run's first save: the
  // coordinator writes it after the shards) is not encoded: EncodeStaged
  // returns awaiting_names, and the caller retries later (fs/README.md).
  bool await_dcp_names = false;
  ParseLimits parse;
  // Which tensors are stored lossily (null: all lossless). EncodeStaged
  // applies it with the file's path relative to the mount root.
  std::shared_ptr<const policy::Policy> policy;
  // Drop the encoder's mapped pages of the staging file every few chunks
  // (mem=): they stay in the page cache, but not in the daemon's RSS.
  bool release_input_pages = false;
  // The level the mount was given (-o level=), recorded with each committed
  // version in the manifest file's xattr kLevelXattr ("" records nothing).
  std::string level;
  // Called at each step of kCommitSteps; a non-OK status stops the commit
  // right there, leaving everything as a crash would (the daemon's hook
  // calls abort(); tests return an error). May be empty.
  std::function<Status(std::string_view step)> fault;
};

// A committed version that later versions in the same directory may delta
// against.
struct BaseCandidate {
  ObjectId id;
  uint32_t chain_depth = 0;
  FileFormat format = FileFormat::kOpaque;
  uint64_t logical_size = 0;
  std::vector<std::string> tensor_keys;  // "name|dtype|shape", sorted
  // A key frame, or an anchor frame (a delta against the previous anchor,
  // written when the newest version's chain was full): the base of the
  // next anchor frame (ChooseBase, base_candidates.h).
  bool anchor = false;
  // Stored bytes of this version's object and of its chain's key frame (0:
  // unknown): a delta that costs nearly a key frame does not pay for the
  // chain it hangs on (ChooseBase).
  uint64_t stored_bytes = 0;
  uint64_t key_bytes = 0;
  // No chunk of this version is lossy. A lossy chain's key frame was coded
  // under an earlier budget (the schedule tightens it as training
  // converges), so its size says nothing about what a key frame would cost
  // now: the rule applies to lossless versions only.
  bool lossless = false;
  // Where the version was committed (relative to the mount root; empty
  // when unknown): what its role (fs/version_role.h) is computed from.
  std::string rel_path;
  // Set by the lookup for a version of the new file's own role (a previous
  // save of the same file): preferred over other files sharing as many
  // tensors.
  bool same_role = false;
  // When the version was committed (ns since the epoch; its manifest's
  // mtime for a version found by a scan; 0: unknown): candidates of the
  // directory's and the role's lists are merged oldest first by it, since
  // ChooseBase gives ties to the newest.
  int64_t committed_ns = 0;
  // A sample of the f32 values this version was made from
  // (codec/optimizer/ref_copies.h): a later file of the same folder whose
  // weights it holds too (DeepSpeed's optimizer files repeat the model
  // file's) codes them as ref copies of its blob. Kept for versions this
  // daemon encoded since mount (null otherwise: such a file then only costs
  // more).
  std::shared_ptr<const ValueSample> values;
};

// The time to record as a version's committed_ns now.
int64_t CommitTimeNow();

struct EncodedVersion {
  Manifest fields;         // kind, format, sizes, object, base, depth, inline data
  EncodeStats stats;
  std::optional<BaseCandidate> as_base;  // set for blob objects
  // Nothing was encoded: a DCP shard waits for its save's .metadata
  // (CommitOptions::await_dcp_names).
  bool awaiting_names = false;
  // How the content index's digests were had: from the writes as they
  // arrived, or by hashing the staged file (neither: no dedup, or a file
  // small enough to stay inline).
  enum class Digests { kNone, kFromWrites, kHashedAtCommit } digests = Digests::kNone;
  // Run once the version's manifest is recorded: keeps its reconstruction
  // in the store's spill (the daemon queues it as background work, off
  // the commit's latency; CommitStagedFile runs it before it returns).
  // Empty when there is nothing to do.
  std::function<void()> after_commit;
  // The version reads back as the bytes it was encoded from (a blob
  // without lossy chunks): the kernel's cached pages of them stay valid.
  bool exact = false;
  // A lossy version's reconstruction, as (file offset, bytes) pieces kept
  // alive by `owner`: the daemon copies it into the kernel's page cache
  // after the commit (fs/kernel_copy.cc). Empty for an exact version.
  struct Reconstruction {
    std::shared_ptr<const void> owner;
    std::vector<std::pair<uint64_t, ByteSpan>> pieces;
    bool empty() const { return pieces.empty(); }
  };
  Reconstruction reconstruction;
};

// Step 1a: fsync the staging file. Step 1b: `*m` becomes kind staging,
// naming `staging` with `logical_size`, written durably to `manifest_fd`.
Status SyncStaging(const StagingFile& staging, const CommitOptions& options);
Status MarkStaging(int manifest_fd, Manifest* m, const StagingId& staging, uint64_t logical_size,
                   const CommitOptions& options);

// Step 2. `candidates` are ordered oldest first; ChooseBase
// (base_candidates.h) picks the delta base, keeping every chain shorter
// than options.keyframe.
// Thread safety: reentrant (Store is thread-safe).
// The content index's digests of the file come from the staging file's
// writes when they cover it (fs/staged_digest.h), else from a pass over it.
Result<EncodedVersion> EncodeStaged(Store& store, const StagingFile& staging,
                                    const std::vector<BaseCandidate>& candidates, const CommitOptions& options,
                                    Logger* log, std::string_view logical_path = {});

// The memory an EncodeStaged of a `file_size`-byte staging file may hold at
// once (what mem= reserves for it): the encoder's chunk window and zstd
// state, plus a whole reconstruction of the file when lossy encoding may
// apply (the lossy codec rebuilds the file to fix its zip CRCs).
uint64_t EncodeMemoryEstimate(uint64_t file_size, const CommitOptions& options);
// The part of that estimate every encode worker holds (kept between encodes).
uint64_t EncodeWorkingSet(const CommitOptions& options);

// Step 3: `*m` takes the fields of `version` and is written durably.
Status CommitManifest(int manifest_fd, Manifest* m, const EncodedVersion& version, const CommitOptions& options);

// Step 4.
Status RemoveStagingFile(StagingFile& staging, const CommitOptions& options);

// All four steps, for a manifest file at `manifest_fd` whose current record
// is `*m`. `logical_path` (relative to the mount root) selects the policy
// rules, as in EncodeStaged. Used by recovery and tests.
Result<EncodedVersion> CommitStagedFile(Store& store, int manifest_fd, Manifest* m, StagingFile& staging,
                                        const std::vector<BaseCandidate>& candidates,
                                        const CommitOptions& options, Logger* log,
                                        std::string_view logical_path = {});

// Opens the content of a committed manifest for reading: inline bytes, a
// blob reader, or a raw object. The one decode path of the daemon and the
// CLI tools.
class FileContent {
 public:
  static Result<FileContent> Open(Store& store, const Manifest& m);
  // Serves `file` verbatim (a plain file of the backing tree).
  static FileContent Verbatim(std::shared_ptr<const RandomAccessFile> file);
  uint64_t size() const { return size_; }
  // Reads [offset, offset + out.size()); REQUIRES: within size().
  Status ReadAt(uint64_t offset, MutableByteSpan out) const;
  // The same bytes as pieces of memory that the content owns (decoded
  // chunks, inline bytes), so a reply needs no copy; raw objects are read
  // into one new piece. Appends to `pieces`.
  Status ReadPieces(uint64_t offset, uint64_t length, std::vector<BlobReader::Piece>* pieces) const;
  const std::shared_ptr<const BlobReader>& blob() const { return blob_; }

 private:
  uint64_t size_ = 0;
  std::shared_ptr<const std::vector<std::byte>> inline_;
  std::shared_ptr<const BlobReader> blob_;
  std::shared_ptr<const RandomAccessFile> raw_;
};

}  // namespace ckptfs::fs
