#include "fs/commit_pipeline.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <future>
#include <optional>
#include <utility>

#include "codec/tensor/scratch.h"
#include "fs/base_candidates.h"
#include "fs/blob_links.h"
#include "fs/content_index.h"
#include "fs/dcp_names.h"
#include "fs/version_role.h"

namespace ckptfs::fs {

bool IsCommitStep(std::string_view name) {
  return std::find(std::begin(kCommitSteps), std::end(kCommitSteps), name) != std::end(kCommitSteps);
}

namespace {

Status Fault(const CommitOptions& options, std::string_view step) {
  return options.fault ? options.fault(step) : Status::Ok();
}

// Streams the encoder's output into a temp object file. With `input` set,
// every kReleaseEvery appends (about one chunk each) it drops the
// encoder's mapped view of its input from the page tables: the encoder
// works chunk by chunk in file order, the mapping is read-only and private
// and the staging file no longer changes, so a later touch simply faults
// the same bytes back in from the page cache.
class FdSink final : public ByteSink {
 public:
  FdSink(int fd, std::string path, ByteSpan input = {}) : fd_(fd), path_(std::move(path)), input_(input) {}
  Status Append(ByteSpan data) override {
    if (!input_.empty() && ++appends_ % kReleaseEvery == 0) ReleaseInput();
    return WriteAll(fd_, data, path_);
  }

 private:
  static constexpr uint64_t kReleaseEvery = 4;
  void ReleaseInput() {
    uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    uintptr_t begin = reinterpret_cast<uintptr_t>(input_.data()) & ~(page - 1);
    uintptr_t end = reinterpret_cast<uintptr_t>(input_.data()) + input_.size();
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advisory: failure is harmless
  }

  int fd_;
  std::string path_;
  ByteSpan input_;
  uint64_t appends_ = 0;
};

Result<ObjectId> PublishRawCopy(Store& store, int staging_fd, uint64_t size) {
  ASSIGN_OR_RETURN(TempFile tmp, store.CreateTemp());
  loff_t in_off = 0;
  while (static_cast<uint64_t>(in_off) < size) {
    ssize_t n = ::copy_file_range(staging_fd, &in_off, tmp.fd(), nullptr, size - static_cast<uint64_t>(in_off), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Io(errno, "copy staging to " + tmp.path());
    }
    if (n == 0) return Status::Corruption("staging file shrank while copying");
  }
  return store.PublishObject(std::move(tmp));
}

// Opens a delta base (or a ref) after refreshing the mtime of it and of
// every blob it reads (its chain down to the key frame, and refs). Each
// touch comes before the blob is read: from then on GC (of any daemon
// sharing the store) sees a young object and keeps it until our manifest
// names a blob that reads it; a blob GC already took away fails the touch
// (NotFound), even if its reader is still cached.
Result<std::shared_ptr<const BlobReader>> TouchChain(Store& store, const ObjectId& id) {
  RETURN_IF_ERROR(store.TouchObject(id));
  ASSIGN_OR_RETURN(auto top, store.OpenBlob(id));
  RETURN_IF_ERROR(TouchLinked(store, *top));
  return top;
}

// The ref candidates of a new version at `rel_path`: the newest few
// versions of other files of its folder (the other files of the same
// save) that this daemon encoded with a value sample, each touched with
// what it reads (TouchChain) and opened. Never a version of the file's own
// role: its base serves unchanged values as well, and a ref to an older
// version would keep that version alive after a trainer deletes it.
constexpr size_t kMaxRefCandidates = 4;
std::vector<RefCandidate> RefCandidatesFor(Store& store, const std::vector<BaseCandidate>& candidates,
                                           std::string_view rel_path, const ObjectId* base, Logger* log) {
  std::vector<RefCandidate> refs;
  if (rel_path.empty()) return refs;
  for (auto it = candidates.rbegin(); it != candidates.rend() && refs.size() < kMaxRefCandidates; ++it) {
    if (!it->values || it->same_role || it->rel_path.empty() || FolderOf(it->rel_path) != FolderOf(rel_path) ||
        it->rel_path == rel_path || (base != nullptr && it->id == *base))
      continue;
    auto reader = TouchChain(store, it->id);
    if (!reader.ok()) {
      if (log) log->Debug("{}: ref candidate {} unusable: {}", rel_path, it->id.Hex(), reader.status().ToString());
      continue;
    }
    refs.push_back(RefCandidate{it->id, *reader, it->values});
  }
  return refs;
}
}  // namespace

Status SyncStaging(const StagingFile& staging, const CommitOptions& options) {
  if (::fsync(staging.fd()) != 0) return Status::Io(errno, "fsync " + staging.path());
  return Fault(options, "after_staging_sync");
}

Status MarkStaging(int manifest_fd, Manifest* m, const StagingId& staging, uint64_t logical_size,
                   const CommitOptions& options) {
  Manifest next = *m;
  next.kind = ManifestKind::kStaging;
  next.staging = staging;
  next.logical_size = logical_size;
  next.stored_bytes = 0;
  next.object = ObjectId{};
  next.base.reset();
  next.chain_depth = 0;
  next.inline_data.clear();
  RETURN_IF_ERROR(WriteManifest(manifest_fd, &next, /*durable=*/true));
  *m = std::move(next);
  return Fault(options, "after_staging_manifest");
}

// A small file (a trainer's JSON log, a config, a tokenizer's vocabulary)
// whose zstd frame fits in a manifest slot is kept there: an object of its
// own would cost a block of the backing disk and a directory entry (in the
// store's fan-out folder, often a block too) for a few hundred bytes. The
// slot takes a block whatever it holds. nullopt when it does not fit.
std::optional<std::vector<std::byte>> CompressForSlot(ByteSpan bytes) {
  // The strongest level: a file of at most 64 KiB takes milliseconds.
  constexpr int kLevel = 19;
  std::vector<std::byte> frame(ZSTD_compressBound(bytes.size()));
  const size_t n = ZSTD_compress(frame.data(), frame.size(), bytes.data(), bytes.size(), kLevel);
  if (ZSTD_isError(n) || n > Manifest::kMaxInline) return std::nullopt;
  frame.resize(n);
  return frame;
}

Result<EncodedVersion> EncodeStaged(Store& store, const StagingFile& staging,
                                    const std::vector<BaseCandidate>& candidates, const CommitOptions& options,
                                    Logger* log, std::string_view logical_path) {
  const int staging_fd = staging.fd();
  const std::string& staging_path = staging.path();
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::FromFd(staging_fd, staging_path));
  ByteSpan bytes = mapped.bytes();
  EncodedVersion v;
  v.fields.logical_size = bytes.size();
  if (bytes.size() <= options.inline_max && bytes.size() <= Manifest::kMaxInline) {
    v.fields.kind = ManifestKind::kInline;
    v.fields.inline_data.assign(bytes.begin(), bytes.end());
    v.stats.logical_bytes = v.stats.stored_bytes = bytes.size();
    return v;
  }
  if (!options.compress) {
    ASSIGN_OR_RETURN(v.fields.object, PublishRawCopy(store, staging_fd, bytes.size()));
    v.fields.kind = ManifestKind::kRaw;
    v.fields.stored_bytes = bytes.size();
    v.stats.logical_bytes = v.stats.stored_bytes = bytes.size();
    RETURN_IF_ERROR(Fault(options, "after_objects"));
    return v;
  }
  Layout layout = DetectLayout(bytes, options.parse);
  // Log lines name the file by its path in the mount when known (the
  // staging path says nothing to the user).
  std::string_view name = logical_path.empty() ? std::string_view(staging_path) : logical_path;
  if (Status valid = ValidateLayout(layout, bytes.size()); !valid.ok()) {
    if (log) log->Warn("{}: parser gave an invalid layout ({}); storing it opaque", name, valid.ToString());
    layout = OpaqueLayout(bytes.size(), "invalid layout");
  }
  if (!layout.fallback_reason.empty() && log)
    log->Info("{}: stored losslessly as opaque: {}", name, layout.fallback_reason);
  // A small file that is no checkpoint (a JSON log, a config) whose zstd
  // frame fits a slot stays in the manifest. Checkpoints, even small ones,
  // go to blobs: they chain as deltas and carry their tensors' index.
  if (layout.format == FileFormat::kOpaque && layout.fallback_reason.empty() &&
      bytes.size() <= Manifest::kMaxInlineZstdSize) {
    if (std::optional<std::vector<std::byte>> frame = CompressForSlot(bytes)) {
      v.fields.kind = ManifestKind::kInline;
      v.fields.inline_zstd = true;
      v.fields.inline_data = std::move(*frame);
      v.stats.logical_bytes = bytes.size();
      v.stats.stored_bytes = v.fields.inline_data.size();
      return v;
    }
  }
  // A DCP shard's tensors get their names from the save's .metadata (the
  // policy can then tell optimizer state from weights).
  if (layout.format == FileFormat::kDcp &&
      NameDcpShardTensors(store, &layout, logical_path, candidates, options.parse, log) == DcpNaming::kNoMetadata &&
      options.await_dcp_names) {
    v.awaiting_names = true;
    return v;
  }
  std::vector<std::string> keys = TensorKeys(layout.tensors);
  // The sample of its values for later files' ref copies, taken while the
  // bytes are in memory (the encode may drop their pages as it goes):
  // about 7 GB/s of f32 weights on one core, on a thread of its own while
  // this one hashes the file and picks the base (both passes ran alone
  // before the encode, on one of the cores).
  std::future<std::shared_ptr<ValueSample>> sampling;
  if (options.policy && options.policy->enabled() && layout.format != FileFormat::kOpaque)
    sampling = std::async(std::launch::async,
                          [&layout, bytes] { return std::make_shared<ValueSample>(SampleValues(layout, bytes)); });
  // Byte-identical content encoded under the same promises is stored once.
  std::optional<ObjectId> content_key;
  std::optional<ContentInFlight::Claim> claim;  // held until the content index names this version's blob
  std::optional<uint64_t> staged_checksum;  // XXH3-64 of the staged bytes, when hashed
  if (options.dedup) {
    const std::optional<FileDigests> written = staging.digest().For(bytes.size());
    const FileDigests digests = written ? *written : DigestFile(bytes);
    v.digests = written ? EncodedVersion::Digests::kFromWrites : EncodedVersion::Digests::kHashedAtCommit;
    staged_checksum = digests.checksum;
    content_key = ContentKey(digests, layout, options, logical_path);
    auto reuse = [&](const ContentEntry& same) -> Result<EncodedVersion> {
      ASSIGN_OR_RETURN(auto reader, store.OpenBlob(same.object));
      v.fields.kind = ManifestKind::kBlob;
      v.fields.format = layout.format;
      v.fields.object = same.object;
      v.fields.stored_bytes = reader->stored_size();
      v.fields.base = reader->base();
      v.fields.chain_depth = same.chain_depth;
      v.stats.logical_bytes = bytes.size();
      v.stats.stored_bytes = 0;  // nothing new stored
      v.as_base = BaseCandidate{same.object, same.chain_depth, layout.format, bytes.size(), std::move(keys),
                                /*anchor=*/same.chain_depth == 0, reader->stored_size(),
                                KeyFrameBytes(store, reader), !HasLossyChunks(*reader), std::string(logical_path)};
      v.as_base->committed_ns = CommitTimeNow();
      if (log) log->Debug("{}: identical to object {}, stored once", name, same.object.Hex());
      RETURN_IF_ERROR(Fault(options, "after_objects"));
      return v;
    };
    if (auto same = FindStoredContent(store, bytes, digests, layout.format, *content_key, log)) return reuse(*same);
    if (options.in_flight) {
      // The same content being encoded by another commit right now: wait
      // for it and name its blob.
      claim.emplace(options.in_flight->Acquire(*content_key));
      if (claim->waited())
        if (auto same = FindStoredContent(store, bytes, digests, layout.format, *content_key, log))
          return reuse(*same);
    }
  }
  const BaseChoice choice =
      ChooseBase(candidates, layout.format, keys, bytes.size(), options.keyframe, options.retention);
  const BaseCandidate* candidate = choice.candidate;
  BaseRef base_ref;
  bool have_base = false;
  if (candidate != nullptr) {
    auto reader = TouchChain(store, candidate->id);
    if (reader.ok()) {
      base_ref.id = candidate->id;
      base_ref.reader = *reader;
      have_base = true;
    } else if (log) {
      log->Warn("{}: base {} unusable, writing a key frame: {}", staging_path, candidate->id.Hex(),
                reader.status().ToString());
    }
  }
  ASSIGN_OR_RETURN(TempFile tmp, store.CreateTemp());
  FdSink sink(tmp.fd(), tmp.path(), options.release_input_pages ? bytes : ByteSpan());
  EncodeOptions encode = options.encode;
  if (options.policy && layout.format != FileFormat::kOpaque) {
    encode.lossy_budget = [policy = options.policy, path = std::string(logical_path)](FileFormat format,
                                                                                     const TensorInfo& t) {
      return policy->BudgetFor(path, format, t);
    };
  }
  // The reconstruction of a checkpoint goes into the chunk cache under the
  // new blob's id once that is known: the file's next version reads it as
  // its base instead of decoding the chain again (a third of a delta
  // frame's encode). Only for a file that fits half the cache: a larger
  // one would push out its own first chunks before the next encode reads
  // them.
  ChunkCache* cache = store.chunk_cache();
  std::vector<std::shared_ptr<ChunkBuffer>> reconstruction;
  std::vector<std::pair<uint64_t, uint64_t>> reconstruction_at;  // (offset, length) per chunk
  const bool to_cache =
      layout.format != FileFormat::kOpaque && cache != nullptr && bytes.size() <= cache->capacity_bytes() / 2;
  if (to_cache) {
    encode.on_reconstruction = [&](ByteSpan recon, const std::vector<ChunkInfo>& chunks) {
      reconstruction.reserve(chunks.size());
      for (const ChunkInfo& c : chunks) {
        std::shared_ptr<ChunkBuffer> buffer = cache->AcquireBuffer(c.logical_length);
        std::copy_n(recon.data() + c.logical_offset, c.logical_length, buffer->data());
        reconstruction.push_back(std::move(buffer));
        reconstruction_at.emplace_back(c.logical_offset, c.logical_length);
      }
    };
  }
  // A larger lossy reconstruction goes to the spill instead, written once
  // the commit is recorded: the encoder's buffer (which it frees after a
  // file of over 64 MiB anyway) is taken over until then.
  ReconstructionSpill* spill = layout.format != FileFormat::kOpaque ? store.reconstruction_spill() : nullptr;
  if (spill != nullptr && (to_cache || bytes.size() > spill->capacity_bytes())) spill = nullptr;
  std::shared_ptr<ScratchBuffer> kept;
  uint64_t kept_size = 0;
  if (spill != nullptr) {
    kept = std::make_shared<ScratchBuffer>();
    encode.keep_reconstruction = [&](ScratchBuffer& buffer, uint64_t size) {
      *kept = std::exchange(buffer, ScratchBuffer());
      kept_size = size;
    };
  }
  const std::vector<RefCandidate> refs =
      RefCandidatesFor(store, candidates, logical_path, have_base ? &base_ref.id : nullptr, log);
  std::shared_ptr<ValueSample> values;
  if (sampling.valid()) values = sampling.get();
  auto stats = EncodeBlob(bytes, layout, have_base ? &base_ref : nullptr, &refs, encode, &sink);
  if (!stats.ok()) return stats.status().WithContext("encode " + staging_path);
  v.stats = *stats;
  // No chunk was stored lossily: the blob gives back the staged bytes (the
  // checksum of its reconstruction says so too, where the bytes were hashed).
  v.exact = stats->lossy_chunks == 0 && (!staged_checksum || *staged_checksum == stats->file_checksum);
  ASSIGN_OR_RETURN(v.fields.object, store.PublishObject(std::move(tmp)));
  if (stats->lossy_chunks > 0 && !reconstruction.empty()) {
    // The same buffers, for the kernel's page cache (read-only from now).
    auto owner = std::make_shared<std::vector<std::shared_ptr<ChunkBuffer>>>(reconstruction);
    for (size_t c = 0; c < reconstruction.size(); ++c)
      v.reconstruction.pieces.emplace_back(reconstruction_at[c].first,
                                           ByteSpan((*owner)[c]->data(), reconstruction_at[c].second));
    v.reconstruction.owner = std::move(owner);
  }
  for (uint32_t c = 0; c < reconstruction.size(); ++c) cache->Put(v.fields.object, c, std::move(reconstruction[c]));
  if (kept_size > 0) {
    // The new version is its file's next base: its base's reconstruction
    // is no longer needed, unless that is an anchor (later anchor frames
    // read it).
    std::optional<ObjectId> replaces, demotes;
    if (have_base && !candidate->anchor) replaces = candidate->id;
    else if (have_base) demotes = candidate->id;
    // Served from memory at once, until its file is written and kept.
    std::shared_ptr<ReconstructionSpill::Held> held =
        spill->Hold(v.fields.object, ByteSpan(kept->data(), kept_size), kept);
    v.reconstruction.owner = kept;
    v.reconstruction.pieces.emplace_back(0, ByteSpan(kept->data(), kept_size));
    v.after_commit = [spill, kept, kept_size, id = v.fields.object, replaces, demotes, log, held]() mutable {
      spill->KeepReconstruction(id, ByteSpan(kept->data(), kept_size), kept, replaces ? &*replaces : nullptr,
                                demotes ? &*demotes : nullptr, [&](const Status& s) {
                                  if (log) log->Debug("reconstruction of {} not kept: {}", id.Hex(), s.ToString());
                                });
      held.reset();  // readers read the spill now (or decode)
      kept.reset();  // its memory goes once neither the spill nor a reader holds it
    };
  }
  v.fields.kind = ManifestKind::kBlob;
  v.fields.format = layout.format;
  v.fields.stored_bytes = stats->stored_bytes;
  const bool delta = have_base && stats->uses_base;
  if (delta) {
    v.fields.base = candidate->id;
    v.fields.chain_depth = candidate->chain_depth + 1;
  }
  v.as_base = BaseCandidate{v.fields.object, v.fields.chain_depth, layout.format, bytes.size(), std::move(keys),
                            /*anchor=*/!delta || choice.anchor, stats->stored_bytes,
                            delta ? candidate->key_bytes : stats->stored_bytes, stats->lossy_chunks == 0,
                            std::string(logical_path)};
  v.as_base->committed_ns = CommitTimeNow();
  // A version whose weights are ref copies already is no ref of others
  // (refs do not chain; its ref serves them).
  if (values && !values->entries.empty() && stats->lossy_chunks > 0 && stats->ref_chunks == 0)
    v.as_base->values = std::move(values);
  if (stats->ref && log) log->Debug("{}: {} chunks are ref copies of {}", name, stats->ref_chunks, stats->ref->Hex());
  if (content_key) {
    const ContentEntry entry{v.fields.object, v.fields.chain_depth, layout.format, bytes.size()};
    RecordContent(store, *content_key, entry, log);
    // Copies of what reads return (the reconstruction) find this blob too.
    RecordContent(store, ExactKey(bytes.size(), stats->file_checksum), entry, log);
  }
  RETURN_IF_ERROR(Fault(options, "after_objects"));
  return v;
}

int64_t CommitTimeNow() {
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);  // comparable with manifest mtimes
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

uint64_t EncodeWorkingSet(const CommitOptions& options) {
  // Measured (scripts/reliability/load_test.py, threads=1 against 2): an
  // encode worker adds ~60 MiB of RSS with 4 MiB chunks (its thread's
  // workspace of chunk slots and byte planes, the zstd context, a base
  // chunk, the allocator's arena), and keeps most of it between encodes;
  // plus a predicted chunk's steps while they are fitted (two f64 per
  // element: 4x the chunk for f32 weights, 8x for bf16).
  uint64_t threads = std::max(1u, options.encode.threads);
  return 24 * threads * options.encode.chunk_bytes;
}

uint64_t EncodeMemoryEstimate(uint64_t file_size, const CommitOptions& options) {
  if (file_size <= options.inline_max) return 0;
  uint64_t estimate = EncodeWorkingSet(options);
  if (options.compress && options.policy && options.policy->enabled()) estimate += file_size;
  return estimate;
}

std::string RecordedLevel(int fd) {
  char value[64];
  ssize_t n = ::fgetxattr(fd, kLevelXattr, value, sizeof value);
  return n > 0 ? std::string(value, static_cast<size_t>(n)) : std::string();
}

Status CommitManifest(int manifest_fd, Manifest* m, const EncodedVersion& version, const CommitOptions& options) {
  Manifest next = version.fields;
  next.sequence = m->sequence;
  RETURN_IF_ERROR(WriteManifest(manifest_fd, &next, /*durable=*/true));
  *m = std::move(next);
  // Informational (stats, xattrs): best effort, after the record is durable.
  if (!options.level.empty() && RecordedLevel(manifest_fd) != options.level)
    (void)::fsetxattr(manifest_fd, kLevelXattr, options.level.data(), options.level.size(), 0);
  return Fault(options, "after_manifest");
}

Status RemoveStagingFile(StagingFile& staging, const CommitOptions& options) {
  RETURN_IF_ERROR(Fault(options, "before_staging_removal"));
  return staging.Remove();
}

Result<EncodedVersion> CommitStagedFile(Store& store, int manifest_fd, Manifest* m, StagingFile& staging,
                                        const std::vector<BaseCandidate>& candidates,
                                        const CommitOptions& options, Logger* log,
                                        std::string_view logical_path) {
  struct stat st;
  if (::fstat(staging.fd(), &st) != 0) return Status::Io(errno, "fstat " + staging.path());
  RETURN_IF_ERROR(SyncStaging(staging, options));
  RETURN_IF_ERROR(MarkStaging(manifest_fd, m, staging.id(), static_cast<uint64_t>(st.st_size), options));
  staging.set_keep(true);
  ASSIGN_OR_RETURN(EncodedVersion v, EncodeStaged(store, staging, candidates, options, log, logical_path));
  RETURN_IF_ERROR(CommitManifest(manifest_fd, m, v, options));
  RETURN_IF_ERROR(RemoveStagingFile(staging, options));
  if (v.after_commit) std::exchange(v.after_commit, nullptr)();
  return v;
}

Result<FileContent> FileContent::Open(Store& store, const Manifest& m) {
  FileContent c;
  c.size_ = m.logical_size;
  switch (m.kind) {
    case ManifestKind::kInline: {
      if (!m.inline_zstd) {
        c.inline_ = std::make_shared<const std::vector<std::byte>>(m.inline_data);
        return c;
      }
      // Bounded by the manifest's checks (kMaxInlineZstdSize, one frame of
      // exactly logical_size bytes).
      auto bytes = std::make_shared<std::vector<std::byte>>(m.logical_size);
      const size_t n = ZSTD_decompress(bytes->data(), bytes->size(), m.inline_data.data(), m.inline_data.size());
      if (ZSTD_isError(n) || n != m.logical_size)
        return Status::Corruption(fmt::format("manifest: compressed inline data does not decode to {} bytes: {}",
                                              m.logical_size, ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short"));
      c.inline_ = std::move(bytes);
      return c;
    }
    case ManifestKind::kBlob: {
      ASSIGN_OR_RETURN(c.blob_, store.OpenBlob(m.object));
      if (c.blob_->logical_size() != m.logical_size)
        return Status::Corruption(fmt::format("object {}: logical size want={} have={}", m.object.Hex(),
                                              m.logical_size, c.blob_->logical_size()));
      return c;
    }
    case ManifestKind::kRaw: {
      ASSIGN_OR_RETURN(c.raw_, store.OpenRaw(m.object));
      break;
    }
    case ManifestKind::kStaging: {
      ASSIGN_OR_RETURN(auto f, PosixFile::Open(store.StagingPath(m.staging)));
      c.raw_ = std::move(f);
      break;
    }
  }
  if (c.raw_->Size() < m.logical_size)
    return Status::Corruption(fmt::format("{} object: size want={} have={}", ManifestKindName(m.kind),
                                          m.logical_size, c.raw_->Size()));
  return c;
}

FileContent FileContent::Verbatim(std::shared_ptr<const RandomAccessFile> file) {
  FileContent c;
  c.size_ = file->Size();
  c.raw_ = std::move(file);
  return c;
}

Status FileContent::ReadAt(uint64_t offset, MutableByteSpan out) const {
  if (offset > size_ || out.size() > size_ - offset) return Status::InvalidArgument("read past the end");
  if (inline_) {
    std::copy_n(inline_->data() + offset, out.size(), out.data());
    return Status::Ok();
  }
  if (blob_) return blob_->ReadAt(offset, out);
  return raw_->ReadAt(offset, out);
}

Status FileContent::ReadPieces(uint64_t offset, uint64_t length, std::vector<BlobReader::Piece>* pieces) const {
  if (offset > size_ || length > size_ - offset) return Status::InvalidArgument("read past the end");
  if (length == 0) return Status::Ok();
  if (blob_) return blob_->ReadPieces(offset, length, pieces);
  if (inline_) {
    pieces->push_back({inline_, ByteSpan(inline_->data() + offset, length)});
    return Status::Ok();
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(length);
  RETURN_IF_ERROR(raw_->ReadAt(offset, *bytes));
  ByteSpan all(bytes->data(), bytes->size());
  pieces->push_back({std::move(bytes), all});
  return Status::Ok();
}

}  // namespace ckptfs::fs
