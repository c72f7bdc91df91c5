// BlobReader: opens a blob (header, footer, index: a few reads, everything
// validated), then serves random-access reads chunk by chunk, following
// delta chunks into the base version through the resolver.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <chrono>
#include <vector>

#include "codec/common/hash.h"
#include "codec/container/blob_format.h"
#include "codec/container/chunk_spill.h"
#include "codec/optimizer/step_space.h"
#include "codec/optimizer/step_space_slices.h"
#include "codec/tensor/lossy/dither.h"
#include "codec/tensor/lossy/low_rank.h"
#include "codec/tensor/lossy/row_column_base.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/chunk_codec.h"
#include "codec/tensor/scratch.h"
#include "codec/tensor/scratch_pool.h"

namespace ckptfs {
namespace {

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

namespace {
// The cached chunks this thread is decoding (reader, chunk), innermost
// last. A chunk that its own decode reaches again through bases and refs
// (a cycle, possible only in a store whose objects do not match their
// names) would wait for itself: it fails instead.
thread_local std::vector<std::pair<const void*, uint32_t>> tls_decoding;

struct DecodingMark {
  DecodingMark(const void* reader, uint32_t c) { tls_decoding.emplace_back(reader, c); }
  ~DecodingMark() { tls_decoding.pop_back(); }
};

// How long a read below the top of a chain waits for another thread's
// decode of the same chunk before decoding it itself: two threads whose
// decodes reach each other's chunk (a cycle across threads) go on instead
// of waiting for each other.
constexpr std::chrono::seconds kLinkedWait{5};

// Whether a step-space chunk is decoded slice by slice (StepSpaceSlices):
// a lossy first moment whose base in step space is used as it is or
// scaled (the default); the rarer predictions (a low-rank term, a dither,
// a step term) take the whole-chunk path.
bool StepSpaceBySlices(const LossyChunkParams& params, uint8_t lossy_flags) {
  if (params.row_column || params.low_rank || params.dither || params.copy()) return false;
  if ((lossy_flags & LossyChunkParams::kFlagPredicted) == 0) return true;
  if (!params.prediction) return false;
  const StepPrediction& p = *params.prediction;
  return !p.has_step && !p.has_v && !p.has_base_step && !p.copy && !p.ref;
}
}  // namespace

Result<std::shared_ptr<const ChunkBuffer>> BlobReaderImpl::CachedChunk(uint32_t c, uint32_t depth,
                                                                      ChunkUse use) const {
  if (auto hit = cache_->Get(*id_, c)) {
    if (depth == 0) RETURN_IF_ERROR(Verify(c, *hit));
    return hit;
  }
  for (const auto& [reader, chunk] : tls_decoding)
    if (reader == this && chunk == c)
      return ChunkError(StatusCode::kCorruption, c, "reads itself through its bases and refs (a cycle)");
  std::shared_ptr<InFlight> flight;
  bool leader = false;
  {
    std::lock_guard<std::mutex> lock(inflight_mu_);
    auto [it, inserted] = inflight_.try_emplace(c);
    if (inserted) it->second = std::make_shared<InFlight>();
    flight = it->second;
    leader = inserted;
  }
  if (!leader) {
    std::unique_lock<std::mutex> lock(flight->mu);
    const auto done = [&] { return flight->done; };
    if (depth == 0) {
      flight->cv.wait(lock, done);
    } else if (!flight->cv.wait_for(lock, kLinkedWait, done)) {
      // Decoded here, not cached (the leader will cache it).
      lock.unlock();
      std::shared_ptr<ChunkBuffer> own = cache_->AcquireBuffer(index_.chunks[c].logical_length);
      const DecodingMark mark(this, c);
      cache_->NoteDecode();
      RETURN_IF_ERROR(DecodeChunk(c, own->mutable_span(), depth));
      own->set_verified(depth == 0);
      return std::shared_ptr<const ChunkBuffer>(std::move(own));
    }
    if (!flight->status.ok()) return flight->status;
    if (depth == 0) RETURN_IF_ERROR(Verify(c, *flight->data));
    return flight->data;
  }
  Status status;
  std::shared_ptr<const ChunkBuffer> data = cache_->Get(*id_, c);  // a leader just before us
  if (data && depth == 0) status = Verify(c, *data);
  if (!data) {
    std::shared_ptr<ChunkBuffer> fresh = cache_->AcquireBuffer(index_.chunks[c].logical_length);
    const DecodingMark mark(this, c);
    if (!ReadSpilledChunk(c, fresh->mutable_span())) {
      cache_->NoteDecode();
      status = DecodeChunk(c, fresh->mutable_span(), depth);
      fresh->set_verified(depth == 0);
    }
    if (status.ok()) {
      data = fresh;
      const bool awaited = use == ChunkUse::kForStream && streams_.load(std::memory_order_relaxed) > 0 &&
                           finished_at_[c].load(std::memory_order_relaxed) == 0;
      cache_->Put(*id_, c, data, awaited);
    }
  }
  {
    std::lock_guard<std::mutex> lock(flight->mu);
    flight->done = true;
    flight->status = status;
    flight->data = data;
  }
  flight->cv.notify_all();
  {
    std::lock_guard<std::mutex> lock(inflight_mu_);
    inflight_.erase(c);
  }
  if (!status.ok()) return status;
  return data;
}

std::optional<ChunkSpill::View> BlobReaderImpl::SpilledChunkView(uint32_t c) const {
  ChunkSpill* spill = cache_->spill();
  if (spill == nullptr) return std::nullopt;
  const ChunkInfo& chunk = index_.chunks[c];
  std::optional<ChunkSpill::View> view = spill->ViewInMemory(*id_, chunk.logical_offset, chunk.logical_length);
  if (!view) return std::nullopt;
  // Checked as ReadSpilledChunk checks a copy.
  if (Checksum64(view->bytes) == chunk.checksum) return view;
  spill->Forget(*id_);
  return std::nullopt;
}

bool BlobReaderImpl::ReadSpilledChunk(uint32_t c, MutableByteSpan out) const {
  ChunkSpill* spill = cache_->spill();
  if (spill == nullptr || !spill->Read(*id_, index_.chunks[c].logical_offset, out)) return false;
  // A spill is a cache on a disk: bytes that are not the chunk's (a disk
  // error, a bug) are decoded instead, and the spill forgets the blob.
  if (Checksum64(out) == index_.chunks[c].checksum) return true;
  spill->Forget(*id_);
  return false;
}

Status BlobReaderImpl::Verify(uint32_t c, const ChunkBuffer& data) const {
  if (data.verified()) return Status::Ok();
  const uint64_t have = Checksum64(data.span());
  if (have != index_.chunks[c].checksum) {
    cache_->Drop(*id_, c);  // not kept for the next reader either
    return ChunkError(StatusCode::kChecksumMismatch, c,
                      fmt::format("decoded bytes checksum want={:016x} have={:016x} (decoded as an input first)",
                                  index_.chunks[c].checksum, have));
  }
  data.set_verified(true);
  return Status::Ok();
}

Status BlobReaderImpl::ChunkError(StatusCode code, uint32_t c, std::string_view why) const {
  std::string msg = fmt::format("blob{}{}: chunk {} at logical offset {}: {}", id_ ? " " : "",
                                id_ ? id_->Hex() : std::string(), c, index_.chunks[c].logical_offset, why);
  return code == StatusCode::kChecksumMismatch ? Status::ChecksumMismatch(std::move(msg))
                                               : Status::Corruption(std::move(msg));
}

Result<std::shared_ptr<const BlobReader>> BlobReaderImpl::OpenLink(Link link) const {
  std::lock_guard lock(base_mu_);
  std::shared_ptr<const BlobReader>& reader = link == Link::kBase ? base_reader_ : ref_reader_;
  if (reader) return reader;
  const char* what = link == Link::kBase ? "base" : "ref";
  const std::optional<ObjectId>& id = link == Link::kBase ? index_.header.base : index_.header.ref;
  if (!id) return Status::Corruption(fmt::format("blob: a chunk reads the {} but the blob names none", what));
  if (resolver_ == nullptr)
    return Status::NotFound(fmt::format("blob: {} {} needed but no resolver was given", what, id->Hex()));
  ASSIGN_OR_RETURN(reader, resolver_->OpenBlob(*id));
  if (reader == nullptr) return Status::Internal("blob: resolver returned no reader");
  return reader;
}

Result<ByteSpan> BlobReaderImpl::ViewBase(uint32_t c, MutableByteSpan buffer, uint32_t depth,
                                          std::shared_ptr<const void>* hold) const {
  return ViewLinkRange(c, Link::kBase, index_.base_offsets[c], buffer, depth, hold);
}

Status BlobReaderImpl::Predict(uint32_t c, const StepPrediction& step, ByteSpan weight_base, CodecScratch& scratch,
                               MutableByteSpan out, uint32_t depth) const {
  std::shared_ptr<const void> holds[4];  // cached chunks the sources point into
  ASSIGN_OR_RETURN(const lossy::StepSources sources, PredictionSources(c, step, weight_base, scratch, depth, holds));
  lossy::PredictWeights(step.predictor, sources, out);
  return Status::Ok();
}

Result<lossy::StepSources> BlobReaderImpl::PredictionSources(uint32_t c, const StepPrediction& step,
                                                             ByteSpan weight_base, CodecScratch& scratch,
                                                             uint32_t depth,
                                                             std::shared_ptr<const void> (&holds)[4]) const {
  const ChunkInfo& chunk = index_.chunks[c];
  ASSIGN_OR_RETURN(lossy::ElementType weight_type,
                   lossy::ElementTypeOf(index_.tensors[index_.segments[chunk.segment].tensor].dtype));
  const uint64_t length = chunk.logical_length / lossy::ElementSize(weight_type) * lossy::ElementSize(step.state_type);
  lossy::StepSources sources;
  sources.weight_type = weight_type;
  sources.weight_base = weight_base;
  sources.state_type = step.state_type;
  auto read = [&](int slot, uint64_t offset, bool from_base) -> Result<ByteSpan> {
    // The base's ranges, like this file's (checked at Open), must cover no
    // chunk with a step term: one level down a prediction then reads plain
    // chunks only, and a hostile chain cannot fan out level after level.
    if (from_base) RETURN_IF_ERROR(CheckBaseStepRange(c, offset, length));
    // A ref copy's range too: the ref's plain chunks only, so a chain of
    // refs stops after one hop.
    if (step.ref) RETURN_IF_ERROR(CheckRefRange(c, offset, length));
    MutableByteSpan buffer(scratch.step_inputs[slot].ReserveForFallback(length), length);
    // This file's ranges cover no predicted chunk, a copy's no copy (checked
    // at Open): no cycle. A ref copy reads another blob, one level deeper
    // (the depth limit bounds a hostile loop of refs).
    Result<ByteSpan> r = from_base ? ViewLinkRange(c, Link::kBase, offset, buffer, depth, &holds[slot])
                         : step.ref ? ViewLinkRange(c, Link::kRef, offset, buffer, depth, &holds[slot])
                                    : ViewAtDepth(offset, buffer, depth, &holds[slot], InputUse(depth));
    if (!r.ok())
      return r.status().WithContext(
          fmt::format("blob: chunk {} at logical offset {}: step prediction input", c, chunk.logical_offset));
    return r;
  };
  if (step.has_step) {
    ASSIGN_OR_RETURN(sources.m, read(0, step.m_offset, false));
  }
  if (step.has_v) {
    ASSIGN_OR_RETURN(sources.v, read(1, step.v_offset, false));
  }
  if (step.has_base_step) {
    ASSIGN_OR_RETURN(sources.m_base, read(2, step.m_base_offset, true));
    if (step.has_v) {
      ASSIGN_OR_RETURN(sources.v_base, read(3, step.v_base_offset, true));
    }
  }
  RETURN_IF_ERROR(lossy::CheckStepSources(sources));
  return sources;
}

Status BlobReaderImpl::CheckRefRange(uint32_t c, uint64_t offset, uint64_t length) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const BlobReader> ref, OpenLink(Link::kRef));
  if (offset > ref->logical_size() || length > ref->logical_size() - offset || length == 0)
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("ref range [{}, +{}) past the ref's size {}", offset, length, ref->logical_size()));
  if (ref->CoversPredicted(offset, length))
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("ref range [{}, +{}) covers a predicted chunk of the ref", offset, length));
  return Status::Ok();
}

Status BlobReaderImpl::CheckBaseStepRange(uint32_t c, uint64_t offset, uint64_t length) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const BlobReader> base, OpenBase());
  if (offset > base->logical_size() || length > base->logical_size() - offset || length == 0)
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("step input [{}, +{}) past the base's size {}", offset, length, base->logical_size()));
  const auto* impl = dynamic_cast<const BlobReaderImpl*>(base.get());
  if (impl != nullptr && impl->index_.CoversStepPredicted(offset, length))
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("step input [{}, +{}) covers a step-predicted chunk of the base", offset, length));
  return Status::Ok();
}

Result<ByteSpan> BlobReaderImpl::ViewLinkRange(uint32_t c, Link link, uint64_t base_offset, MutableByteSpan out,
                                               uint32_t depth, std::shared_ptr<const void>* hold) const {
  if (depth + 1 > limits_.max_chain_depth)
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("delta chain deeper than the limit {}", limits_.max_chain_depth));
  const char* what = link == Link::kBase ? "base" : "ref";
  Result<std::shared_ptr<const BlobReader>> opened = OpenLink(link);
  if (!opened.ok())
    return opened.status().WithContext(
        fmt::format("blob: chunk {} at logical offset {}", c, index_.chunks[c].logical_offset));
  std::shared_ptr<const BlobReader> base = std::move(opened).value();
  if (base_offset > base->logical_size() || out.size() > base->logical_size() - base_offset)
    return ChunkError(StatusCode::kCorruption, c,
                      fmt::format("{} range [{}, +{}) past the {}'s size {}", what, base_offset, out.size(), what,
                                  base->logical_size()));
  // Readers from Open are BlobReaderImpl; carry the depth through them.
  const auto* impl = dynamic_cast<const BlobReaderImpl*>(base.get());
  Result<ByteSpan> r = ByteSpan(out);
  if (impl != nullptr) {
    r = impl->ViewAtDepth(base_offset, out, depth + 1, hold);
  } else if (Status s = base->ReadAt(base_offset, out); !s.ok()) {
    r = s;
  }
  if (r.ok()) return r;
  return r.status().WithContext(fmt::format("blob: chunk {} at logical offset {}: reading {} {}", c,
                                            index_.chunks[c].logical_offset, what,
                                            (link == Link::kBase ? index_.header.base : index_.header.ref)->Hex()));
}

Status BlobReaderImpl::DecodeChunk(uint32_t c, MutableByteSpan out, uint32_t depth) const {
  const ChunkInfo& chunk = index_.chunks[c];
  CodecScratchPool::Lease lease = scratch_->Acquire();
  CodecScratch& scratch = *lease;
  // The stored bytes in place when the file lends them (in memory, a
  // mapped object: no copy of a cold read's page cache), else a copy.
  ByteSpan stored = blob_->View(chunk.stored_offset, chunk.stored_length);
  struct EndViewAtExit {
    const RandomAccessFile& file;
    ByteSpan view;
    ~EndViewAtExit() {
      if (!view.empty()) file.EndView(view);
    }
  } end_view{*blob_, stored};
  if (stored.size() != chunk.stored_length) {
    std::byte* buffer = scratch.stored.Reserve(chunk.stored_length);
    RETURN_IF_ERROR(blob_->ReadAt(chunk.stored_offset, MutableByteSpan(buffer, chunk.stored_length)));
    stored = ByteSpan(buffer, chunk.stored_length);
  }
  // The stored checksum is checked before any decoder sees the bytes.
  const uint64_t stored_checksum = Checksum64(stored);
  if (stored_checksum != index_.stored_checksums[c])
    return ChunkError(StatusCode::kChecksumMismatch, c,
                      fmt::format("stored bytes checksum want={:016x} have={:016x}", index_.stored_checksums[c],
                                  stored_checksum));
  ChunkContext ctx;
  if (chunk.segment >= 0 && index_.segments[chunk.segment].tensor >= 0)
    ctx.dtype = index_.tensors[index_.segments[chunk.segment].tensor].dtype;
  // Open validated the params of every lossy chunk; a delta one reads its base.
  const uint8_t lossy_flags = chunk.codec == ChunkCodec::kLossy && !index_.params[c].empty()
                                  ? static_cast<uint8_t>(index_.params[c][1])
                                  : 0;
  const bool lossy_delta = (lossy_flags & LossyChunkParams::kFlagDelta) != 0;
  // A chunk in step space: the scales s = sqrt(v) + eps from this file's
  // second moment (a range of plain chunks, checked at Open), in
  // step_inputs[1]; its base and output are m / s.
  const std::byte* scales = nullptr;
  std::optional<LossyChunkParams> params;  // parsed when a step space or prediction needs it
  if ((lossy_flags & (LossyChunkParams::kFlagStepSpace | LossyChunkParams::kFlagPredicted |
                      LossyChunkParams::kFlagRowColumn)) != 0) {
    ASSIGN_OR_RETURN(params, LossyChunkParams::DecodeFrom(index_.params[c]));
  }
  std::optional<lossy::RowColumnBaseSlices> row_column;
  if (params && params->row_column) {
    // The stream is a delta frame against the base its block describes
    // (the block leads the stored bytes, its size checked at Open), made
    // by the decoder slice by slice.
    const RowColumnTerm& t = *params->row_column;
    row_column = lossy::RowColumnBaseSlices::Open(stored.first(t.block_bytes), t.columns, out.size() / 4);
    if (!row_column || out.size() % 4 != 0)
      return ChunkError(StatusCode::kCorruption, c, "row-column block does not fit the chunk");
    stored = stored.subspan(t.block_bytes);
    ctx.base_slices = &*row_column;
  }
  // Cached chunks that the views below (v, the base) point into.
  std::shared_ptr<const void> v_hold, base_hold;
  // A first moment in step space whose base (if any) is at most scaled:
  // the decoder makes the base in step space and the output slice by
  // slice (StepSpaceSlices). Otherwise over the whole chunk, below.
  std::optional<StepSpaceSlices> step_slices;
  // Step-predicted f32 weights: their prediction made slice by slice.
  std::shared_ptr<const void> prediction_holds[4];
  lossy::StepSources prediction_sources;
  std::optional<lossy::PredictionSlices> prediction_slices;
  // A step-space chunk's second moment: viewed in the cache, or read into
  // step_inputs[1] (where the whole-chunk path then writes the scales).
  ByteSpan v;
  std::byte* v_buffer = nullptr;
  if ((lossy_flags & LossyChunkParams::kFlagStepSpace) != 0) {
    v_buffer = scratch.step_inputs[1].ReserveForFallback(out.size());
    Result<ByteSpan> viewed =
        ViewAtDepth(params->step_space->v_offset, MutableByteSpan(v_buffer, out.size()), depth, &v_hold, InputUse(depth));
    if (!viewed.ok())
      return viewed.status().WithContext(fmt::format(
          "blob: chunk {} at logical offset {}: step-space second moment", c, chunk.logical_offset));
    v = *viewed;
  }
  if ((lossy_flags & LossyChunkParams::kFlagStepSpace) != 0 && StepSpaceBySlices(*params, lossy_flags)) {
    ByteSpan base_m;
    if (lossy_delta) {
      ASSIGN_OR_RETURN(base_m,
                       ViewBase(c, MutableByteSpan(scratch.base.ReserveForFallback(out.size()), out.size()), depth, &base_hold));
    }
    const bool predicted = lossy_delta && (lossy_flags & LossyChunkParams::kFlagPredicted) != 0;
    step_slices.emplace(v, params->step_space->eps, base_m, predicted ? &params->prediction->predictor : nullptr);
    if (lossy_delta) ctx.base_slices = &*step_slices;
    ctx.finish = &*step_slices;
  } else if ((lossy_flags & LossyChunkParams::kFlagStepSpace) != 0) {
    // The scales over the whole chunk, into v's buffer (v may be there:
    // element by element, in place).
    std::byte* s_out = v_buffer;
    if (!StepScales(v, params->step_space->eps, s_out))
      return ChunkError(StatusCode::kCorruption, c, "step-space second moment negative or not finite");
    v_hold.reset();
    scales = s_out;
  }
  if (!step_slices &&
      (chunk.codec == ChunkCodec::kBytePlaneXorZstd || chunk.codec == ChunkCodec::kZstdWithBase || lossy_delta)) {
    // The base bytes get their own buffer: the base read below leases its
    // own scratch, never this one. (A base version replaces a row-column
    // base, as the encoder never writes both.)
    ctx.base_slices = nullptr;
    std::byte* base = scratch.base.ReserveForFallback(out.size());
    if (params && params->copy()) {
      // A copy's prediction reads no base version (its scale is 0).
      std::fill(base, base + out.size(), std::byte{0});
      ctx.base = ByteSpan(base, out.size());
    } else {
      ASSIGN_OR_RETURN(ctx.base, ViewBase(c, MutableByteSpan(base, out.size()), depth, &base_hold));
    }
    if (scales != nullptr) {
      std::byte* base_x = scratch.step_inputs[0].Reserve(out.size());
      DivideByScales(ctx.base, scales, base_x);
      ctx.base = ByteSpan(base_x, out.size());
    }
    if (lossy_delta && (lossy_flags & LossyChunkParams::kFlagPredicted) != 0 && scales == nullptr &&
        !params->low_rank && !params->dither && !params->copy() && ctx.dtype == DType::kF32) {
      // f32 weights: the decoder makes the prediction slice by slice, in
      // cache, where it reads it (the whole chunk's was written out and
      // read back).
      ASSIGN_OR_RETURN(prediction_sources,
                       PredictionSources(c, *params->prediction, ctx.base, scratch, depth, prediction_holds));
      prediction_slices.emplace(params->prediction->predictor, prediction_sources);
      ctx.base = {};
      ctx.base_slices = &*prediction_slices;
    } else if (lossy_delta && (lossy_flags & LossyChunkParams::kFlagPredicted) != 0) {
      // A step-predicted chunk is a delta frame against its prediction.
      MutableByteSpan prediction(scratch.prediction.Reserve(out.size()), out.size());
      RETURN_IF_ERROR(Predict(c, *params->prediction, ctx.base, scratch, prediction, depth));
      if (params->low_rank) {
        // The factor block leads the stored bytes (its size checked at Open).
        const LowRankTerm& t = *params->low_rank;
        const ByteSpan block = stored.subspan(0, t.block_bytes);
        stored = stored.subspan(t.block_bytes);
        if (!lossy::AddLowRank(block, out.size() / 4 / t.columns, t.columns, t.rank, prediction))
          return ChunkError(StatusCode::kCorruption, c, "low-rank factor scale not finite");
      }
      if (params->dither) {
        auto* ids = reinterpret_cast<uint8_t*>(scratch.symbol_contexts.Reserve(out.size() / 4));
        if (!lossy::SubtractDither(params->dither->step, params->dither->seed, prediction, ids))
          return ChunkError(StatusCode::kCorruption, c, "dither step not finite and > 0");
        ctx.symbol_contexts = ByteContexts{ids, lossy::kDitherContexts};
      }
      ctx.base = prediction;
    }
  }
  const ChunkCodecImpl* codec = FindChunkCodec(chunk.codec);  // known: checked at Open
  // Codecs that can hash the output as they write it (while it is in
  // cache) return the decoded checksum; for the others it is hashed here.
  const bool verify = depth == 0;
  std::optional<uint64_t> decoded_checksum;
  Status decoded = codec->Decode(stored, index_.params[c], ctx, scratch, out, verify ? &decoded_checksum : nullptr);
  if (!decoded.ok()) {
    if (decoded.code() != StatusCode::kCorruption) return decoded;
    return ChunkError(StatusCode::kCorruption, c, decoded.message());
  }
  if (step_slices && !step_slices->scales_ok())
    return ChunkError(StatusCode::kCorruption, c, "step-space second moment negative or not finite");
  if (scales != nullptr) {
    FromStepSpace(out, scales);
    decoded_checksum.reset();  // it hashed m / s
  }
  if (!verify) return Status::Ok();
  // A raw chunk decodes to its stored bytes, hashed above: each byte is
  // hashed once.
  const uint64_t have = chunk.codec == ChunkCodec::kRaw ? stored_checksum
                        : decoded_checksum      ? *decoded_checksum
                                                : Checksum64(out);
  if (have != chunk.checksum)
    return ChunkError(StatusCode::kChecksumMismatch, c,
                      fmt::format("decoded bytes checksum want={:016x} have={:016x}", chunk.checksum, have));
  return Status::Ok();
}

Status BlobReaderImpl::ReadPieces(uint64_t offset, uint64_t length, std::vector<Piece>* pieces) const {
  const uint64_t size = index_.header.logical_size;
  if (offset > size || length > size - offset)
    return Status::InvalidArgument(fmt::format("blob read: [{}, +{}) past the logical size {}", offset, length, size));
  if (length == 0) return Status::Ok();
  const auto& chunks = index_.chunks;
  uint32_t c = ChunkIndexAt(chunks, offset);
  const uint64_t end = offset + length;
  for (uint64_t at = offset; at < end; ++c) {
    const ChunkInfo& chunk = chunks[c];
    const uint64_t from = at - chunk.logical_offset;
    const uint64_t n = std::min(end, chunk.logical_offset + chunk.logical_length) - at;
    const bool cached = cache_ != nullptr && id_;
    std::shared_ptr<const ChunkBuffer> data;
    if (cached) {
      // Awaited until the reader has all of it: a reader may take a
      // chunk's last page first (torch.load reads the zip header after a
      // record, which shares that page) and the rest much later.
      ASSIGN_OR_RETURN(data, CachedChunk(c, 0, ChunkUse::kForStream));
    } else {
      auto fresh = std::make_shared<ChunkBuffer>();
      fresh->Resize(chunk.logical_length);
      RETURN_IF_ERROR(DecodeChunk(c, fresh->mutable_span(), 0));
      data = std::move(fresh);
    }
    ByteSpan piece(data->data() + from, n);
    pieces->push_back(Piece{std::move(data), piece});
    // A chunk later chunks read stays cached for them (in the LRU once
    // read), and they are decoded now, while it and its bases are cached.
    const std::span<const uint32_t> later = index_.LaterReaders(c);
    if (cached && !later.empty()) DecodeLaterReaders(later);
    if (cached && cache_->NoteRead(*id_, c, n, !later.empty())) MarkFinished(c);  // after the piece holds the buffer
    at += n;
  }
  return Status::Ok();
}

Status BlobReaderImpl::ReadAtDepth(uint64_t offset, MutableByteSpan out, uint32_t depth, ChunkUse use) const {
  const uint64_t size = index_.header.logical_size;
  if (offset > size || out.size() > size - offset)
    return Status::InvalidArgument(fmt::format("blob read: [{}, +{}) past the logical size {}", offset, out.size(), size));
  if (out.empty()) return Status::Ok();
  const auto& chunks = index_.chunks;
  uint32_t c = ChunkIndexAt(chunks, offset);
  uint64_t at = offset;
  const uint64_t end = offset + out.size();
  for (; at < end; ++c) {
    const ChunkInfo& chunk = chunks[c];
    const uint64_t from = at - chunk.logical_offset;
    const uint64_t n = std::min(end, chunk.logical_offset + chunk.logical_length) - at;
    MutableByteSpan target = out.subspan(at - offset, n);
    if (cache_ != nullptr && id_) {
      ASSIGN_OR_RETURN(std::shared_ptr<const ChunkBuffer> data, CachedChunk(c, depth, use));
      std::memcpy(target.data(), data->data() + from, n);
    } else if (n == chunk.logical_length) {
      RETURN_IF_ERROR(DecodeChunk(c, target, depth));  // the whole chunk: straight into `out`
    } else {
      CodecScratchPool::Lease scratch = scratch_->Acquire();
      std::byte* buffer = scratch->decoded.Reserve(chunk.logical_length);
      RETURN_IF_ERROR(DecodeChunk(c, MutableByteSpan(buffer, chunk.logical_length), depth));
      std::memcpy(target.data(), buffer + from, n);
    }
    at += n;
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<const BlobReader>> BlobReader::Open(std::shared_ptr<const RandomAccessFile> blob,
                                                           std::optional<ObjectId> id, BlobResolver* resolver,
                                                           ChunkCache* cache, const DecodeLimits& limits) {
  if (blob == nullptr) return Status::InvalidArgument("blob open: no file");
  const uint64_t size = blob->Size();
  constexpr uint64_t kMinSize = BlobHeader::kEncodedSize + BlobFooter::kEncodedSize;
  if (size < kMinSize)
    return Status::Corruption(fmt::format("blob: {} bytes, want at least {}", size, kMinSize));
  std::array<std::byte, BlobHeader::kEncodedSize> header_bytes;
  RETURN_IF_ERROR(blob->ReadAt(0, header_bytes));
  ASSIGN_OR_RETURN(BlobHeader header, BlobHeader::DecodeFrom(header_bytes));
  std::array<std::byte, BlobFooter::kEncodedSize> footer_bytes;
  RETURN_IF_ERROR(blob->ReadAt(size - BlobFooter::kEncodedSize, footer_bytes));
  ASSIGN_OR_RETURN(BlobFooter footer, BlobFooter::DecodeFrom(footer_bytes));
  if (header.version != footer.version)
    return Status::Corruption(
        fmt::format("blob: header version {} and footer version {} differ", header.version, footer.version));
  // The index sits between the payloads and the footer, exactly.
  const uint64_t index_end = size - BlobFooter::kEncodedSize;
  if (footer.index_length > limits.max_index_bytes)
    return Status::Corruption(
        fmt::format("blob footer: index of {} bytes exceeds the limit {}", footer.index_length, limits.max_index_bytes));
  if (footer.index_offset < BlobHeader::kEncodedSize || footer.index_offset > index_end ||
      footer.index_length != index_end - footer.index_offset)
    return Status::Corruption(fmt::format("blob footer: index [{}, +{}), want it to end at {}", footer.index_offset,
                                          footer.index_length, index_end));
  std::vector<std::byte> stored_index(footer.index_length);
  RETURN_IF_ERROR(blob->ReadAt(footer.index_offset, stored_index));
  if (uint64_t have = Checksum64(stored_index); have != footer.index_checksum)
    return Status::ChecksumMismatch(
        fmt::format("blob index: checksum want={:016x} have={:016x}", footer.index_checksum, have));
  ASSIGN_OR_RETURN(std::vector<std::byte> index_bytes, IndexFromStored(footer, stored_index, limits.max_index_bytes));
  ASSIGN_OR_RETURN(BlobIndex index, BlobIndex::DecodeFrom(index_bytes, footer.index_offset, limits));
  if (id && index.header.base && *index.header.base == *id)
    return Status::Corruption(fmt::format("blob {}: names itself as its base", id->Hex()));
  if (id && index.header.ref && *index.header.ref == *id)
    return Status::Corruption(fmt::format("blob {}: names itself as its ref", id->Hex()));
  return std::shared_ptr<const BlobReader>(
      std::make_shared<BlobReaderImpl>(std::move(blob), id, resolver, cache, limits, std::move(index)));
}

namespace {

Result<ByteSpan> BlobReaderImpl::ViewAtDepth(uint64_t offset, MutableByteSpan buffer, uint32_t depth,
                                             std::shared_ptr<const void>* hold, ChunkUse use) const {
  const uint64_t size = index_.header.logical_size;
  if (cache_ != nullptr && id_ && !buffer.empty() && offset <= size && buffer.size() <= size - offset) {
    const uint32_t c = ChunkIndexAt(index_.chunks, offset);
    const ChunkInfo& chunk = index_.chunks[c];
    const uint64_t from = offset - chunk.logical_offset;
    if (buffer.size() <= chunk.logical_length - from) {
      if (std::optional<ChunkSpill::View> spilled = SpilledChunkView(c)) {
        const std::byte* at = spilled->bytes.data() + from;
        if (reinterpret_cast<uintptr_t>(at) % 4 == 0) {
          *hold = std::move(spilled->owner);
          return ByteSpan(at, buffer.size());
        }
      }
      ASSIGN_OR_RETURN(std::shared_ptr<const ChunkBuffer> data, CachedChunk(c, depth, use));
      const std::byte* at = data->data() + from;
      if (reinterpret_cast<uintptr_t>(at) % 4 == 0) {
        *hold = std::move(data);
        return ByteSpan(at, buffer.size());
      }
    }
  }
  RETURN_IF_ERROR(ReadAtDepth(offset, buffer, depth, use));
  return ByteSpan(buffer);
}

}  // namespace

}  // namespace ckptfs
