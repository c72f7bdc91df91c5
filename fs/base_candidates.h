// Delta-base candidates of a directory, rebuilt from the store. The daemon
// remembers the versions it committed in each directory (the newest few are
// the delta bases of the next checkpoint there); after a remount that memory
// is empty, so the first commit in a directory scans its manifests instead
// of writing a key frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "codec/format/layout.h"
#include "fs/commit_pipeline.h"
#include "fs/log.h"
#include "fs/store.h"
#include "fs/version_role.h"

namespace ckptfs::fs {

// "name|dtype|shape" of every tensor, sorted: what ChooseBase matches on.
std::vector<std::string> TensorKeys(const std::vector<TensorInfo>& tensors);

struct BaseChoice {
  const BaseCandidate* candidate = nullptr;  // null: write a key frame
  bool anchor = false;                       // an anchor frame: the new version is an anchor too
};

// The delta base of a new version of `format` with tensor keys `keys` (or,
// without tensors, of `size` bytes) among `candidates` (oldest first):
//  1. the candidate sharing the most tensors by name, dtype and shape (for
//     files without tensors: the newest of the same format and of a similar
//     size), among ties a version of the file's own role (`same_role`),
//     then the newest, when its chain leaves room for one more link
//     (chain_depth + 1 < keyframe);
//  2. else the best such match among the candidates whose chains leave
//     room: an older version among the newest few (a delta over two or
//     three versions), and once their chains are full too, the anchor (a
//     key frame or anchor frame) the list keeps for this kind of file: then
//     the new version is an *anchor frame*. Anchors chain, each one link
//     deeper than the last, so the chains stay shorter than `keyframe`
//     while a key frame comes only about every keyframe^2/2 versions or
//     more, not every `keyframe`: a key frame costs several delta versions
//     (the whole of each tensor at its budget), an anchor frame one delta
//     over the versions since the previous anchor;
//  0. with `retention` (old versions of the file are being deleted): none
//     (a key frame) when a candidate matching as well as the best is a
//     lossless delta frame that cost at least kDeltaPaysBelow of its
//     chain's key frame (sizes known): deltas of this file do not pay for the versions
//     they keep alive (tried again once that delta leaves the list);
//  3. else none: a key frame (the anchors' chain is full, or no anchor is
//     known, as after a remount, where which versions were anchor frames is
//     not known).
// The stored size of the key frame at the bottom of `blob`'s chain (the
// store caches the readers); 0 when a link cannot be opened.
uint64_t KeyFrameBytes(Store& store, std::shared_ptr<const BlobReader> blob);

// Whether any chunk of `blob` is lossy.
bool HasLossyChunks(const BlobReader& blob);

// A delta version costing at least this fraction of its chain's key frame
// did not pay: the next version of its kind starts a new chain.
inline constexpr double kDeltaPaysBelow = 0.75;

BaseChoice ChooseBase(const std::vector<BaseCandidate>& candidates, FileFormat format,
                      const std::vector<std::string>& keys, uint64_t size, uint32_t keyframe,
                      bool retention = false);

// Drops from a directory's candidate list (oldest first) the versions older
// than the newest `max_count`, except the newest anchor of each kind of
// file still written (format and tensor keys, for files without tensors
// also a similar size; written: one of the newest `max_count` is of that
// kind), at most `max_count` of them: an anchor frame needs its anchor after
// the versions since have been dropped.
void TrimBaseCandidates(std::deque<BaseCandidate>* list, size_t max_count);

// Appends a committed version to the list and trims it.
void RememberBaseCandidate(std::deque<BaseCandidate>* list, BaseCandidate candidate, size_t max_count);

// The delta-base candidates of the file at `rel_path` (relative to the
// backing root): the committed blob versions among the files of its
// directory, newest `max_count` by modification time, returned oldest first
// like the daemon's in-memory list; key frames among them are anchors
// (which versions were anchor frames is not recorded: after a remount the
// chain that is full first ends in a key frame). The file's own committed
// version is one of them, as in the daemon's list after it commits: a file
// saved over in place (`last.ckpt`) deltas against its previous version
// after a remount too (while its manifest holds a staging record, as in
// recovery, it has none). Files whose manifest or blob cannot be read are
// skipped with a debug line: a missing candidate only costs a key frame.
std::vector<BaseCandidate> ScanBaseCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log);

// Adds to `candidates` the committed blob record `replaced` of the file at
// `rel_path` (a version its manifest no longer names: a staging record, an
// fsync before the commit, took its place), unless it is listed already,
// is no blob, or its blob does not open. Returns the candidate it added.
std::optional<BaseCandidate> AddReplacedCandidate(Store& store, const Manifest& replaced, const std::string& rel_path,
                                                  Logger* log, std::vector<BaseCandidate>* candidates);

// The delta-base candidates of the file at `rel_path` found by its role
// (fs/version_role.h): the committed blob versions of the same file in
// sibling step folders (`checkpoint-100/optimizer.pt` for
// `checkpoint-200/optimizer.pt`), staged or renamed folders, and files
// named like it but for the step, newest `max_count` by modification time,
// oldest first, each marked `same_role`. The file itself is skipped. A
// pattern component is matched against at most 8 entries of its directory
// (the largest numbers) and at most 64 paths are read.
std::vector<BaseCandidate> ScanRoleCandidates(Store& store, const std::string& rel_path, size_t max_count,
                                              Logger* log);

// The candidates of a new version of the file whose role is `role`: those
// of its directory (`in_dir`, oldest first), less other ranks' files (named
// like it but for a rank or shard number: same rank_blind key, another
// role), and those of its role not already among them (`in_role`), all
// ordered oldest first by committed_ns (a stable sort: unknown times keep
// this order). Every version of the file's own role is marked `same_role`
// (ChooseBase prefers it among equal tensor matches).
std::vector<BaseCandidate> MergeBaseCandidates(const FileRole& role, std::vector<BaseCandidate> in_dir,
                                               std::vector<BaseCandidate> in_role);

}  // namespace ckptfs::fs
