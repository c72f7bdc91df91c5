// The blob: the self-describing, checksummed, random-access encoding of one
// file version (format specified in codec/FORMAT.md). This header is the
// container's public API, used by fs/ and the CLI:
//   EncodeBlob  : file bytes + layout (+ optional base version) -> blob bytes
//   BlobReader  : random-access reads of the reconstructed file from a blob
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <algorithm>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/common/io.h"
#include "codec/common/status.h"
#include "codec/container/chunk_buffer.h"
#include "codec/container/encode_stages.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/schedule.h"

namespace ckptfs {

class BlobReader;
class ChunkCache;
class ChunkSpill;
class ScratchBuffer;
class CodecScratchPool;
struct ChunkInfo;

// Chunk codecs. Stored in blobs: never renumber, only append.
enum class ChunkCodec : uint8_t {
  kRaw = 0,                // stored as is
  kZstd = 1,               // zstd of the bytes
  kBytePlaneZstd = 2,      // float byte planes split, then zstd
  kBytePlaneXorZstd = 3,   // XOR against the base version's bytes, planes, zstd
  kZeros = 4,              // all-zero bytes, nothing stored
  kZstdWithBase = 5,       // zstd with the base version's bytes of the range as its prefix
  // 16..63 are reserved for the lossy (quantizing) codecs.
  kLossy = 16,             // lossy stream (codec/tensor/lossy/LOSSY.md), params: LossyChunkParams

};
std::string_view ChunkCodecName(ChunkCodec codec);

// Receives the blob as it is produced (the encoder streams: memory stays
// bounded by the chunks in flight, not by the file size).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status Append(ByteSpan data) = 0;
};

// Collects the blob in memory.
class VectorSink final : public ByteSink {
 public:
  Status Append(ByteSpan data) override {
    bytes.insert(bytes.end(), data.begin(), data.end());
    return Status::Ok();
  }
  std::vector<std::byte> bytes;
};

// The optimizer-aware candidates the mount and `ckptfs encode` try unless
// told: low-rank terms (EncodeOptions::low_rank_moments), a dither on first
// moments (momentum_dither: its relative error on the step, 0 = none; at
// most kMaxMomentumDither) and trellis-coded quantization (trellis). Why
// each is off by default, with the measurements: docs/policy.md.
inline constexpr bool kLowRankMomentsByDefault = false;
inline constexpr double kMomentumDitherByDefault = 0.0;
inline constexpr double kMaxMomentumDither = 2.0;
inline constexpr bool kTrellisByDefault = false;

struct EncodeOptions {
  int zstd_level = 3;
  // Target uncompressed chunk size; tensors are cut at element boundaries.
  uint64_t chunk_bytes = 4ull << 20;
  // Worker threads for chunk encoding (1 = the calling thread only).
  unsigned threads = 1;
  // Error budget per tensor; unset, or a budget with both fields 0, keeps
  // the tensor lossless. Only f32/f16/bf16 little-endian tensors are ever
  // encoded lossily; the budget of any other tensor is ignored.
  std::function<lossy::Budget(FileFormat, const TensorInfo&)> lossy_budget;
  // Kernel backend of the lossy codec (nullptr = CPU). A non-null backend is
  // not shared between threads: lossy chunks are then encoded one at a time.
  lossy::LossyKernels* lossy_kernels = nullptr;
  int lossy_zstd_level = 1;
  // Dynamic precision: tightens the budget of delta-frame chunks whose
  // update is small (codec/tensor/lossy/schedule.h). Off here; the mount and
  // `ckptfs encode` turn it on by default.
  lossy::BudgetSchedule budget_schedule;
  // Lossy weights of a checkpoint that holds their optimizer state (Adam's
  // exp_avg and exp_avg_sq, SGD's momentum_buffer) are coded as a delta
  // frame against a prediction from that state when it is smaller
  // (codec/tensor/lossy/step_predictor.h, FORMAT.md "Step prediction").
  bool step_prediction = true;
  // Adam's first moment (f32 exp_avg with its exp_avg_sq) is coded in step
  // space: its budget applies to m / (sqrt(v) + eps) instead of m
  // (step_space.h, FORMAT.md "Step space"); SGD's momentum buffer, its own
  // step, gets its budget on the step (lossy::Budget::step_rel_l2) as it is.
  bool momentum_step_space = false;  // the mount and `ckptfs encode` turn it on by default
  // A first moment in step space with a base (and step_prediction on) is
  // also tried against its prediction plus a low-rank term, kept when
  // smaller (codec/tensor/lossy/low_rank.h, FORMAT.md "Low-rank term");
  // mount option low_rank=on, `ckptfs encode --low-rank on`.
  bool low_rank_moments = kLowRankMomentsByDefault;
  // When > 0, a first moment in step space with a base (and step_prediction
  // on) is coded with a subtractive dither instead: its error is uniform
  // noise, independent of the step, of this relative size on the step
  // (codec/tensor/lossy/dither.h, FORMAT.md "Dither"); it replaces the
  // momentum budget and the schedule for those chunks. Mount option
  // momentum_dither=REL, `ckptfs encode --momentum-dither REL`.
  double momentum_dither = kMomentumDitherByDefault;
  // Lossy chunks with an L2 budget alone are also coded by trellis-coded
  // quantization (codec/tensor/lossy/trellis.h), kept when smaller. Mount
  // option trellis=on, `ckptfs encode --trellis on`.
  bool trellis = kTrellisByDefault;
  // Blob format version to write (FORMAT.md): 2 stores the index as a zstd
  // frame; 1 stores it as it is, for readers from before 2026-12-01.
  uint16_t blob_version = 2;
  // Called once the blob is written, with what reads of it will return (the
  // reconstruction) and its chunks: the mount keeps it in its chunk cache
  // under the blob's id, so that the next version's encode finds its base
  // decoded. The span is valid during the call only.
  std::function<void(ByteSpan reconstruction, const std::vector<ChunkInfo>& chunks)> on_reconstruction;
  // Called after on_reconstruction when the encode made a reconstruction
  // of its own (a file with lossy chunks), with the buffer holding it in
  // its first `size` bytes: the callee may take the buffer (leaving an
  // empty one) to use the bytes after the encode, as the mount does to
  // keep them once the commit is recorded (fs/reconstruction_spill.h).
  std::function<void(ScratchBuffer& buffer, uint64_t size)> keep_reconstruction;
};

// The previous version of the file, for delta frames. Tensors are matched by
// name, dtype and shape; a chunk is XOR-delta encoded only when that is
// smaller than encoding it alone. A chunk whose base bytes cannot be read is
// encoded alone; a blob with no delta chunk does not reference the base.
struct BaseRef {
  ObjectId id;
  std::shared_ptr<const BlobReader> reader;
};

struct EncodeStats {
  uint64_t logical_bytes = 0;  // size of the input file
  uint64_t stored_bytes = 0;   // size of the blob
  uint32_t chunks = 0;
  uint32_t delta_chunks = 0;   // chunks encoded against the base
  bool uses_base = false;      // true if the blob references the base
  uint32_t ref_chunks = 0;     // ref copies (codec/optimizer/ref_copies.h)
  std::optional<ObjectId> ref; // the blob they read, when there is one
  uint32_t lossy_chunks = 0;   // chunks stored with ChunkCodec::kLossy
  double max_rel_l2 = 0.0;     // largest per-tensor rel_l2 achieved (0 = exact)
  uint64_t file_checksum = 0;  // the blob's file_checksum (of the reconstruction)
  EncodeStageStats stages;     // time per stage, and what the candidates won
};

// Encodes `file` described by `layout` into `sink`.
// REQUIRES: ValidateLayout(layout, file.size()).ok().
// Thread safety: reentrant; `base->reader` is only read.
Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout& layout, const BaseRef* base,
                               const EncodeOptions& options, ByteSink* sink);
// The same, with earlier files' blobs whose reconstruction some of this
// file's f32 weights may be coded against (ref copies,
// codec/optimizer/ref_copies.h); `refs` may be null. The blob names the one
// it reads (EncodeStats::ref), a dependency like its base.
struct RefCandidate;
Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout& layout, const BaseRef* base,
                               const std::vector<RefCandidate>* refs, const EncodeOptions& options, ByteSink* sink);

// Opens base blobs by id when a delta chain is followed.
// Thread safety: OpenBlob may be called concurrently (by readers of
// different blobs); it must outlive the readers it is given to.
class BlobResolver {
 public:
  virtual ~BlobResolver() = default;
  virtual Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) = 0;
};

struct DecodeLimits {
  uint64_t max_logical_size = 1ull << 44;  // 16 TiB
  uint64_t max_chunk_bytes = 256ull << 20; // a chunk never inflates past this
  uint32_t max_chain_depth = 256;         // base hops one read may follow
  uint32_t max_index_bytes = 1u << 30;
};

// Description of one chunk, for inspect/fsck/stats.
struct ChunkInfo {
  uint64_t logical_offset = 0;
  uint64_t logical_length = 0;
  uint64_t stored_offset = 0;  // in the blob
  uint64_t stored_length = 0;
  ChunkCodec codec = ChunkCodec::kRaw;
  uint64_t checksum = 0;       // XXH3-64 of the decoded bytes
  int32_t segment = -1;        // index into segments()
};

// The index of the chunk holding logical `offset` (the last one starting at
// or before it). REQUIRES: chunks sorted by logical_offset, the first at 0.
inline uint32_t ChunkIndexAt(const std::vector<ChunkInfo>& chunks, uint64_t offset) {
  auto it = std::upper_bound(chunks.begin(), chunks.end(), offset,
                             [](uint64_t off, const ChunkInfo& c) { return off < c.logical_offset; });
  return static_cast<uint32_t>(it - chunks.begin()) - 1;
}

struct SegmentInfo {
  uint64_t offset = 0;
  uint64_t length = 0;
  int32_t tensor = -1;   // index into tensors(), or -1
  uint32_t first_chunk = 0;
  uint32_t chunk_count = 0;
};

// Random-access view of a blob. Open checks the header and index (every
// length and offset, before use); chunk payloads are checked when read.
// Thread safety: all const methods may be called concurrently.
class BlobReader {
 public:
  // `id` is the blob's content address when known (keys the chunk cache;
  // without it nothing is cached). `resolver` may be null for blobs with no
  // base; a blob with a base then fails to read its delta chunks with
  // NotFound.
  static Result<std::shared_ptr<const BlobReader>> Open(std::shared_ptr<const RandomAccessFile> blob,
                                                        std::optional<ObjectId> id,
                                                        BlobResolver* resolver,
                                                        ChunkCache* cache = nullptr,
                                                        const DecodeLimits& limits = {});
  virtual ~BlobReader() = default;

  virtual uint64_t logical_size() const = 0;
  virtual uint64_t stored_size() const = 0;
  virtual FileFormat format() const = 0;
  virtual const std::optional<ObjectId>& base() const = 0;
  // The other file's blob that this one's ref copies read (FORMAT.md
  // "Index header"); a dependency like the base (GC, fsck, touching).
  virtual const std::optional<ObjectId>& ref() const = 0;
  virtual uint64_t file_checksum() const = 0;  // XXH3-64 of the whole file
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual const std::vector<SegmentInfo>& segments() const = 0;
  virtual const std::vector<ChunkInfo>& chunks() const = 0;
  // The parameters area of chunk `index` (empty for lossless codecs; see
  // LossyChunkParams for kLossy). REQUIRES: index < chunks().size().
  virtual ByteSpan chunk_params(uint32_t index) const = 0;
  // Whether [offset, offset + length) of the file covers a chunk whose
  // prediction reads other chunks (a step term, a copy): such a range may
  // not be another blob's step input or ref copy (FORMAT.md "Step
  // prediction"). False for a range outside the file or empty.
  virtual bool CoversPredicted(uint64_t offset, uint64_t length) const = 0;

  // Reads [offset, offset + out.size()) of the reconstructed file, decoding
  // only the chunks that cover it (following the delta chain). Reads past
  // logical_size() are InvalidArgument. A chunk whose stored bytes or
  // decoded bytes fail their checksum is ChecksumMismatch naming the chunk.
  virtual Status ReadAt(uint64_t offset, MutableByteSpan out) const = 0;

  // [offset, +buffer.size()) of the reconstructed file, in place where the
  // reader has it in memory (a cached chunk, a reconstruction its cache's
  // spill keeps in memory; *hold keeps it valid), else read into `buffer`
  // as by ReadAt. The view is 4-byte aligned when `buffer` is. An encode
  // reads its base this way: one copy fewer per byte, none where the
  // daemon kept the base's reconstruction.
  virtual Result<ByteSpan> ViewAt(uint64_t offset, MutableByteSpan buffer, std::shared_ptr<const void>* hold) const {
    (void)hold;
    RETURN_IF_ERROR(ReadAt(offset, buffer));
    return ByteSpan(buffer);
  }

  // Decodes chunk `index` and checks it (fsck).
  virtual Status VerifyChunk(uint32_t index) const = 0;

  // A piece of the reconstructed file that lives in memory `owner` keeps
  // alive (a decoded chunk): `data` stays valid while `owner` is held.
  struct Piece {
    std::shared_ptr<const void> owner;
    ByteSpan data;
  };
  // Like ReadAt, but returns the decoded chunks' own memory instead of
  // copying it (a FUSE read replies from it directly). Appends to `pieces`.
  // Without a chunk cache each piece owns a fresh decode. The caller keeps
  // what it reads (the kernel's page cache): a chunk leaves the chunk
  // cache once ReadPieces has returned each of its bytes (ChunkCache::
  // NoteRead), so a stream recycles a few buffers instead of filling the
  // cache with fresh memory.
  virtual Status ReadPieces(uint64_t offset, uint64_t length, std::vector<Piece>* pieces) const = 0;

  // Decodes chunk `index` into the chunk cache unless it is cached or being
  // decoded already (decoding ahead of a sequential reader), or a reader
  // has finished with it since `ticket` (a value of prefetch_ticket() taken
  // when the decode was queued): a decode queued ahead of a reader that
  // then read the chunk before the decode started (decoding it itself)
  // would only decode it a second time. Nothing to do without a cache or
  // id. Errors are those of a read of the chunk.
  virtual Status Prefetch(uint32_t index, uint64_t ticket) const = 0;
  // The current position of the reader's "finished with a chunk" counter,
  // for Prefetch.
  virtual uint64_t prefetch_ticket() const = 0;
  // A sequential reader is past chunk `index`: its decoded bytes leave the
  // chunk cache now, and their memory is reused for the next chunk (instead
  // of filling the cache with fresh memory that a stream never reads
  // again). A later read of the chunk decodes it again.
  virtual void DropCached(uint32_t index) const = 0;
  // A reader streams this file (an open file read through the mount, a
  // decode of the whole file) until the matching CloseStream. Meanwhile
  // the chunks of this file decoded ahead of the reader, as inputs of an
  // earlier chunk, are kept in the chunk cache until the reader takes them
  // (ChunkCache's awaited chunks); once no stream is open they are cached
  // like any other.
  virtual void OpenStream() const = 0;
  virtual void CloseStream() const = 0;
};

// OpenStream for a scope.
class ReaderStream {
 public:
  explicit ReaderStream(const BlobReader& reader) : reader_(reader) { reader_.OpenStream(); }
  ~ReaderStream() { reader_.CloseStream(); }
  ReaderStream(const ReaderStream&) = delete;
  ReaderStream& operator=(const ReaderStream&) = delete;

 private:
  const BlobReader& reader_;
};

// Decodes the whole file into memory and checks the whole-file checksum
// (DecodeToSink streams it, on threads).
Result<std::vector<std::byte>> DecodeAll(const BlobReader& reader);

// Decodes the whole file into `sink` in file order: pieces of whole chunks
// (about kDecodePieceBytes) decoded on `threads` threads into the chunk
// cache's reused buffers and appended from them by the calling thread, so
// memory stays at a few pieces per thread whatever the file's size. The
// whole-file checksum is checked at the end, when the sink has received
// every byte: on an error the caller discards what it received.
inline constexpr uint64_t kDecodePieceBytes = uint64_t{8} << 20;
Status DecodeToSink(const BlobReader& reader, ByteSink* sink, unsigned threads = 1,
                    uint64_t piece_bytes = kDecodePieceBytes);

// A thread-safe LRU of decoded chunks shared by readers, keyed by
// (blob id, chunk index). Capacity in bytes.
//
// Chunk memory is recycled: a buffer from AcquireBuffer goes back to the
// cache's idle list when its last holder lets go (an evicted chunk, a
// reply that was written), and the next AcquireBuffer reuses it, so that a
// long read touches fresh memory (page faults, the kernel's zeroing) only
// for the chunks in flight. Cached plus idle bytes stay within the
// capacity plus the idle reserve, and while a stream is open the awaited
// room; buffers still held by readers after eviction are outside it.
class ChunkCache {
 public:
  // `idle_reserve_bytes`: idle buffers kept beyond the capacity. A full
  // cache evicts a chunk before each decode, and decodes running at the
  // same time take each other's evicted buffers; without a reserve the
  // buffers let go meanwhile are freed (cached plus idle would pass the
  // capacity) and every decode at capacity touches fresh memory.
  //
  // `awaited_capacity_bytes`: room, beyond the capacity, for chunks of a
  // file decoded ahead of the reader that streams it (Put with `awaited`):
  // the weights of a step-predicted version read its optimizer state,
  // which the file holds after them, and an LRU of a few hundred MiB had
  // evicted most of that state by the time the reader got there (a 957 MB
  // file decoded 64 % more second-moment elements than it holds). An
  // awaited chunk is not evicted by the LRU: it leaves once the reader
  // has read all of it (NoteRead) or went past it (Drop), joins the LRU
  // when released (Get with `release_awaited`), or when ReleaseAwaited
  // says the reader is gone. Past the room, awaited chunks are cached like
  // any other.
  explicit ChunkCache(uint64_t capacity_bytes, uint64_t idle_reserve_bytes = 0, uint64_t awaited_capacity_bytes = 0);
  // Buffers still held elsewhere stay valid (they are freed, not recycled,
  // when let go).
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // `release_awaited`: the reader an awaited chunk was kept for is done
  // with it, but others may still read it: it becomes an ordinary entry
  // (most recently used).
  std::shared_ptr<const ChunkBuffer> Get(const ObjectId& blob, uint32_t chunk, bool release_awaited = false);
  // `awaited`: kept for a reader that will take it later (above).
  void Put(const ObjectId& blob, uint32_t chunk, std::shared_ptr<const ChunkBuffer> data, bool awaited = false);
  // The awaited chunks of `blob` become ordinary entries (its reader
  // closed the file or went elsewhere), and the LRU evicts down to the
  // capacity.
  void ReleaseAwaited(const ObjectId& blob);
  // A reader streams one of this cache's blobs (BlobReader::OpenStream)
  // or no longer does. While any stream is open, idle buffers may take the
  // part of the awaited room that awaited chunks leave free; once none is,
  // idle buffers beyond the capacity (and the idle reserve) are freed.
  void StreamOpened();
  void StreamClosed();
  uint64_t size_bytes() const;  // every cached chunk, awaited ones included
  uint64_t capacity_bytes() const;
  uint64_t awaited_bytes() const;
  uint64_t awaited_capacity_bytes() const;
  // Whether an awaited chunk of `bytes` would be kept now.
  bool HasAwaitedRoom(uint64_t bytes) const;
  // Chunks decoded for this cache's readers so far (a decode that misses
  // the cache, counted by the reader: stats, tests).
  void NoteDecode();
  uint64_t decodes() const;
  // Bytes of idle buffers kept for AcquireBuffer (tests, stats).
  uint64_t idle_bytes() const;
  // A buffer of exactly `size` bytes (contents unspecified) to decode a
  // chunk into before Put: an idle one when there is one, else new memory.
  std::shared_ptr<ChunkBuffer> AcquireBuffer(size_t size);
  // Removes (blob, chunk) if cached; its buffer returns to the idle list
  // once nobody else holds it.
  void Drop(const ObjectId& blob, uint32_t chunk);
  // A reader has taken `bytes` more of (blob, chunk)'s bytes; once the
  // total reaches the chunk's size the chunk is dropped (a sequential
  // reader is done with it), or with `keep` (other chunks still read it)
  // released into the LRU. Overlapping reads count twice: the chunk then
  // only leaves early and is decoded again if asked for.
  // Returns whether the total reached the chunk's size.
  bool NoteRead(const ObjectId& blob, uint32_t chunk, uint64_t bytes, bool keep = false);
  // Working memory of the decodes that fill this cache, shared by all
  // readers that use it.
  CodecScratchPool& scratch_pool();
  // Where readers look for a chunk before decoding it (null: nowhere).
  // Not owned; REQUIRES: it outlives the cache's readers, or is unset while
  // no read is in flight.
  void SetSpill(ChunkSpill* spill);
  ChunkSpill* spill() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs
