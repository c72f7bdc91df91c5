// BlobReader's implementation, shared by the files that define it:
// blob_reader.cc (opening a blob, the chunk cache, reads) and
// blob_chunk_decode.cc (decoding one chunk: its base, its step prediction,
// the blobs it links to). Internal to codec/container/.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "codec/container/blob.h"
#include "codec/container/blob_format.h"
#include "codec/container/chunk_spill.h"
#include "codec/tensor/lossy/step_predictor.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/scratch.h"
#include "codec/tensor/scratch_pool.h"

namespace ckptfs::blob_internal {

class BlobReaderImpl final : public BlobReader {
 public:
  BlobReaderImpl(std::shared_ptr<const RandomAccessFile> blob, std::optional<ObjectId> id, BlobResolver* resolver,
                 ChunkCache* cache, const DecodeLimits& limits, BlobIndex index)
      : blob_(std::move(blob)),
        id_(id),
        resolver_(resolver),
        cache_(cache),
        limits_(limits),
        index_(std::move(index)),
        finished_at_(std::make_unique<std::atomic<uint64_t>[]>(index_.chunks.size())) {
    if (cache_ == nullptr) own_scratch_ = std::make_unique<CodecScratchPool>();
    scratch_ = cache_ != nullptr ? &cache_->scratch_pool() : own_scratch_.get();
  }

  uint64_t logical_size() const override { return index_.header.logical_size; }
  uint64_t stored_size() const override { return blob_->Size(); }
  FileFormat format() const override { return index_.header.format; }
  const std::optional<ObjectId>& base() const override { return index_.header.base; }
  const std::optional<ObjectId>& ref() const override { return index_.header.ref; }
  uint64_t file_checksum() const override { return index_.header.file_checksum; }
  const std::vector<TensorInfo>& tensors() const override { return index_.tensors; }
  const std::vector<SegmentInfo>& segments() const override { return index_.segments; }
  const std::vector<ChunkInfo>& chunks() const override { return index_.chunks; }
  ByteSpan chunk_params(uint32_t index) const override { return index_.params[index]; }
  bool CoversPredicted(uint64_t offset, uint64_t length) const override {
    if (length == 0 || offset > logical_size() || length > logical_size() - offset) return false;
    return index_.CoversStepPredicted(offset, length);
  }

  Status ReadAt(uint64_t offset, MutableByteSpan out) const override {
    return ReadAtDepth(offset, out, 0, ChunkUse::kNow);
  }

  Status VerifyChunk(uint32_t index) const override {
    if (index >= index_.chunks.size())
      return Status::InvalidArgument(fmt::format("verify: chunk {} of {}", index, index_.chunks.size()));
    CodecScratchPool::Lease scratch = scratch_->Acquire();
    std::byte* buffer = scratch->decoded.Reserve(index_.chunks[index].logical_length);
    return DecodeChunk(index, MutableByteSpan(buffer, index_.chunks[index].logical_length), 0);
  }

  Status ReadPieces(uint64_t offset, uint64_t length, std::vector<Piece>* pieces) const override;
  Result<ByteSpan> ViewAt(uint64_t offset, MutableByteSpan buffer, std::shared_ptr<const void>* hold) const override {
    return ViewAtDepth(offset, buffer, 0, hold);
  }

  Status Prefetch(uint32_t index, uint64_t ticket) const override {
    if (index >= index_.chunks.size())
      return Status::InvalidArgument(fmt::format("prefetch: chunk {} of {}", index, index_.chunks.size()));
    if (cache_ == nullptr || !id_) return Status::Ok();
    if (finished_at_[index].load(std::memory_order_relaxed) > ticket) return Status::Ok();
    return CachedChunk(index, 0, ChunkUse::kForStream).status();
  }

  uint64_t prefetch_ticket() const override { return finished_.load(std::memory_order_relaxed); }

  void DropCached(uint32_t index) const override {
    if (cache_ == nullptr || !id_ || index >= index_.chunks.size()) return;
    cache_->Drop(*id_, index);
    MarkFinished(index);
  }

  void OpenStream() const override {
    streams_.fetch_add(1, std::memory_order_relaxed);
    if (cache_ != nullptr) cache_->StreamOpened();
  }
  void CloseStream() const override {
    if (streams_.fetch_sub(1, std::memory_order_acq_rel) == 1 && cache_ != nullptr && id_)
      cache_->ReleaseAwaited(*id_);
    if (cache_ != nullptr) cache_->StreamClosed();
  }

  // Why a chunk is decoded (CachedChunk): for a caller now, or for the
  // reader that streams this file (depth 0): its own reads (ReadPieces),
  // an input of another chunk of the file, Prefetch, or a chunk that reads
  // one the reader has (DecodeLaterReaders). While a stream is open, a
  // chunk decoded for it that the reader has not finished with is kept as
  // an awaited chunk: it leaves the cache once the reader has read all of
  // it (or went past it), or joins the LRU when later chunks still read it.
  enum class ChunkUse { kNow, kForStream };

  // ReadAt at delta-chain level `depth` (0 for the caller's blob).
  Status ReadAtDepth(uint64_t offset, MutableByteSpan out, uint32_t depth, ChunkUse use) const;
  // [offset, +buffer.size()) at level `depth`, without a copy where it can:
  // when the reader has a cache and the range lies in one chunk at an
  // address aligned to 4 bytes (the kernels load whole elements), a view
  // into the spill's memory (checked, SpilledChunkView) or into the cached
  // chunk, held by *hold; else read into `buffer`.
  Result<ByteSpan> ViewAtDepth(uint64_t offset, MutableByteSpan buffer, uint32_t depth,
                               std::shared_ptr<const void>* hold, ChunkUse use = ChunkUse::kNow) const;

 private:
  // The stream's reader has (part of) a chunk that `later` chunks of this
  // file read: they are decoded now, while it and its bases' chunks are
  // cached, and wait for the reader as awaited chunks (without this, a
  // later chunk far down the file decoded the chunk's whole chain column
  // again). Skips those the reader is done with, and everything once the
  // awaited room is full; a failure is left for the reader's own read to
  // report. Runs in the reader's thread (a mount's request thread: that
  // reply waits for these decodes, which the read-ahead workers could
  // take instead).
  void DecodeLaterReaders(std::span<const uint32_t> later) const {
    if (streams_.load(std::memory_order_relaxed) == 0) return;
    for (uint32_t r : later) {
      if (finished_at_[r].load(std::memory_order_relaxed) != 0) continue;
      if (!cache_->HasAwaitedRoom(index_.chunks[r].logical_length)) return;
      (void)CachedChunk(r, 0, ChunkUse::kForStream);
    }
  }
  // A reader is done with chunk `c` (read it all, or went past it).
  void MarkFinished(uint32_t c) const {
    finished_at_[c].store(finished_.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // Decodes chunk `c` into `out` (exactly its logical length), checking
  // its stored checksum, and at the top of a chain (depth 0) its decoded
  // checksum. `depth` is its level in the delta chain: a chunk below the
  // top is an input of the version above it, whose own decoded checksum
  // covers what the input gave it (a wrong input makes a wrong top); the
  // caller marks such a chunk's buffer unverified (ChunkBuffer::verified)
  // and Verify checks it if it is ever read for itself. Hashing every
  // level cost 5-7 % of the daemon's CPU time in a cold read of the
  // newest of four versions (957 MB each).
  Status DecodeChunk(uint32_t c, MutableByteSpan out, uint32_t depth) const;
  // A cached chunk about to be read for itself (depth 0): checked against
  // its decoded checksum if it was decoded as an input (DecodeChunk checks
  // only the top of a chain), and dropped from the cache on a mismatch.
  Status Verify(uint32_t c, const ChunkBuffer& data) const;
  // Chunk `c` from the cache's spill, when it holds it with the chunk's
  // checksum: true. REQUIRES: cache_ && id_.
  bool ReadSpilledChunk(uint32_t c, MutableByteSpan out) const;
  // Chunk `c` in the spill's memory, checked like a copy (ViewAtDepth
  // reads it in place). REQUIRES: cache_ && id_.
  std::optional<ChunkSpill::View> SpilledChunkView(uint32_t c) const;
  // The base version's bytes a delta chunk XORs against (ViewAtDepth).
  Result<ByteSpan> ViewBase(uint32_t c, MutableByteSpan buffer, uint32_t depth,
                            std::shared_ptr<const void>* hold) const;
  // Corruption unless [offset, +length) of the base lies inside it and
  // covers no step-predicted chunk of the base.
  Status CheckBaseStepRange(uint32_t c, uint64_t offset, uint64_t length) const;
  // Corruption unless [offset, +length) of the ref lies inside it and
  // covers no predicted chunk of the ref.
  Status CheckRefRange(uint32_t c, uint64_t offset, uint64_t length) const;
  // The blobs this one reads: its base version, and the ref object that
  // ref copies read (FORMAT.md "Index header").
  enum class Link { kBase, kRef };
  // [offset, +buffer.size()) of the base version or the ref (ViewAtDepth,
  // one level deeper).
  Result<ByteSpan> ViewLinkRange(uint32_t c, Link link, uint64_t offset, MutableByteSpan buffer, uint32_t depth,
                                 std::shared_ptr<const void>* hold) const;
  // The prediction a step-predicted chunk is a delta frame against, from
  // the base's weights `weight_base` (step_predictor.h).
  Status Predict(uint32_t c, const StepPrediction& step, ByteSpan weight_base, CodecScratch& scratch,
                 MutableByteSpan out, uint32_t depth) const;
  // Its inputs (checked), viewed in the cache (held by `holds`) or read
  // into `scratch`.
  Result<lossy::StepSources> PredictionSources(uint32_t c, const StepPrediction& step, ByteSpan weight_base,
                                               CodecScratch& scratch, uint32_t depth,
                                               std::shared_ptr<const void> (&holds)[4]) const;
  Result<std::shared_ptr<const BlobReader>> OpenLink(Link link) const;
  Result<std::shared_ptr<const BlobReader>> OpenBase() const { return OpenLink(Link::kBase); }
  Status ChunkError(StatusCode code, uint32_t c, std::string_view why) const;
  // Chunk `c` decoded, from the cache or decoded once here. Concurrent
  // callers for the same chunk wait for one decode (the kernel's read-ahead
  // sends several reads of one 4 MiB chunk at once; without this each of
  // them decoded the whole chunk). REQUIRES: cache_ && id_.
  Result<std::shared_ptr<const ChunkBuffer>> CachedChunk(uint32_t c, uint32_t depth, ChunkUse use) const;
  // How a chunk at `depth` reads other chunks of its file: at the top,
  // for the stream (CachedChunk keeps only those the reader has not
  // finished with).
  static ChunkUse InputUse(uint32_t depth) { return depth == 0 ? ChunkUse::kForStream : ChunkUse::kNow; }

  // One decode in flight, shared by the readers that wait for it.
  struct InFlight {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    std::shared_ptr<const ChunkBuffer> data;
  };

  std::shared_ptr<const RandomAccessFile> blob_;
  std::optional<ObjectId> id_;
  BlobResolver* resolver_;
  ChunkCache* cache_;
  DecodeLimits limits_;
  BlobIndex index_;
  // Decode scratch: the cache's pool, shared by every reader of the store
  // (else this reader's own). Each decode leases one; a delta chunk's base
  // read leases another for the next level.
  std::unique_ptr<CodecScratchPool> own_scratch_;
  CodecScratchPool* scratch_ = nullptr;
  // Prefetch's tickets: a counter of the chunks readers finished with, and
  // per chunk its value when that last happened (0: never).
  mutable std::atomic<uint64_t> finished_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> finished_at_;
  mutable std::mutex base_mu_;  // guards base_reader_ and ref_reader_
  mutable std::shared_ptr<const BlobReader> base_reader_;
  mutable std::shared_ptr<const BlobReader> ref_reader_;
  // Lock order: inflight_mu_ before InFlight::mu; neither is held while
  // decoding.
  mutable std::mutex inflight_mu_;  // guards inflight_
  mutable std::unordered_map<uint32_t, std::shared_ptr<InFlight>> inflight_;
  mutable std::atomic<int> streams_{0};  // OpenStream calls not yet closed
};

}  // namespace ckptfs::blob_internal
