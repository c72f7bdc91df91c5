// The on-disk structures of a blob (codec/FORMAT.md is the specification;
// keep the two in step). Each structure encodes to and decodes from bytes;
// decoders check every length before use and reject reserved bits.
//
//   [BlobHeader][chunk payloads ...][index][BlobFooter]
//   index = [IndexHeader][TensorRecord * n][SegmentRecord * n][ChunkRecord * n]
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/common/status.h"
#include "codec/container/blob.h"
#include "codec/format/layout.h"

namespace ckptfs {

// Version 2 (written since 2026-12-01) stores the index as one zstd frame;
// version 1 stored it as it is, and still decodes.
inline constexpr uint16_t kBlobVersion = 2;
inline constexpr uint16_t kBlobVersionRawIndex = 1;
// PNG-style magics: a high-bit byte (catches 7-bit transfers), CR LF and
// LF (catch line-ending conversion) and ^Z (stops a DOS `type`). The
// letter after "CK" tells header (B) from footer (F).
inline constexpr std::array<uint8_t, 8> kBlobHeaderMagic = {0x89, 'C', 'K', 'B', '\r', '\n', 0x1a, '\n'};
inline constexpr std::array<uint8_t, 8> kBlobFooterMagic = {0x89, 'C', 'K', 'F', '\r', '\n', 0x1a, '\n'};

// Limits of version 1 (independent of DecodeLimits, which callers tune).
inline constexpr uint32_t kMaxTensorRank = 64;
inline constexpr uint64_t kMaxChunkParamsBytes = 1u << 20;
// A chunk's stored bytes may exceed its logical bytes by at most this.
inline constexpr uint64_t kMaxStoredOverhead = 4096;

struct BlobHeader {
  static constexpr size_t kEncodedSize = 16;
  uint16_t version = kBlobVersion;
  void EncodeTo(ByteWriter& w) const;
  static Result<BlobHeader> DecodeFrom(ByteSpan bytes);
};

struct BlobFooter {
  static constexpr size_t kEncodedSize = 40;
  uint64_t index_offset = 0;
  uint64_t index_length = 0;
  uint64_t index_checksum = 0;  // XXH3-64 (seed 0) of the index bytes
  uint16_t version = kBlobVersion;
  void EncodeTo(ByteWriter& w) const;
  static Result<BlobFooter> DecodeFrom(ByteSpan bytes);
};

// Appends the index, stored as blob version `version` stores it (a zstd
// frame for 2, as it is for 1), and the footer; `index_offset` is the blob
// offset at which the appended bytes start (an encoder streaming the
// payloads may hold only the tail of the blob in `out`).
Status AppendIndexAndFooter(ByteSpan index, uint64_t index_offset, uint16_t version, std::vector<std::byte>* out);

// The index bytes from their stored form `stored` (the footer's
// index_length bytes at index_offset, checksum already verified): a copy
// for version 1, the frame's content for version 2, which must declare its
// size and hold at most max_index_bytes (else Corruption).
Result<std::vector<std::byte>> IndexFromStored(const BlobFooter& footer, ByteSpan stored, uint64_t max_index_bytes);

struct IndexHeader {
  static constexpr size_t kEncodedSize = 48;  // plus 16 with a ref
  static constexpr uint8_t kFlagHasBase = 1;
  static constexpr uint8_t kFlagHasRef = 2;
  uint64_t logical_size = 0;
  uint64_t file_checksum = 0;  // XXH3-64 (seed 0) of the reconstructed file
  FileFormat format = FileFormat::kOpaque;
  std::optional<ObjectId> base;
  // Another file's blob that ref copies read (StepPrediction::ref).
  std::optional<ObjectId> ref;
  uint32_t tensor_count = 0;
  uint32_t segment_count = 0;
  uint32_t chunk_count = 0;
  void EncodeTo(ByteWriter& w) const;
  static Result<IndexHeader> DecodeFrom(ByteReader& r);
};

struct TensorRecord {
  static constexpr size_t kFixedSize = 6;  // before the name and the shape
  static constexpr uint8_t kFlagBigEndian = 1;
  static void EncodeTo(const TensorInfo& tensor, ByteWriter& w);
  static Result<TensorInfo> DecodeFrom(ByteReader& r);
};

struct SegmentRecord {
  static constexpr size_t kEncodedSize = 32;
  static void EncodeTo(const SegmentInfo& segment, ByteWriter& w);
  static Result<SegmentInfo> DecodeFrom(ByteReader& r);
};

// A chunk as stored: ChunkInfo plus what only the reader needs.
struct ChunkRecord {
  static constexpr size_t kFixedSize = 64;  // before the parameters area
  ChunkInfo info;
  uint64_t stored_checksum = 0;  // XXH3-64 (seed 0) of the stored bytes
  uint64_t base_offset = 0;      // delta chunks: logical offset in the base
  std::vector<std::byte> params; // codec parameters (empty for lossless)
  void EncodeTo(ByteWriter& w) const;
  static Result<ChunkRecord> DecodeFrom(ByteReader& r);
};

// The parsed and validated index.
struct BlobIndex {
  IndexHeader header;
  std::vector<TensorInfo> tensors;
  std::vector<SegmentInfo> segments;
  std::vector<ChunkInfo> chunks;
  std::vector<uint64_t> stored_checksums;
  std::vector<uint64_t> base_offsets;
  std::vector<std::vector<std::byte>> params;
  // Filled by DecodeFrom: [k] = the chunks among the first k whose step
  // prediction reads this file (FORMAT.md "Step prediction").
  std::vector<uint32_t> step_predicted_before;
  // The same for the chunks coded in step space (FORMAT.md "Step space").
  std::vector<uint32_t> step_space_before;
  // The later chunks of this file that read chunk c while they are
  // decoded (a step prediction's optimizer state, a step-space moment's
  // second moment), in order: later_readers[later_reader_start[c] ..
  // later_reader_start[c + 1]). A sequential reader keeps c cached past
  // its own turn, and a stream decodes them once it has c (a hint only;
  // ranges over more than kMaxMarkedChunks chunks are not marked, and
  // marks past kMaxLaterReadersPerChunk times the chunk count are not
  // kept; a file's own ranges mark 1-3 chunks each, two per chunk).
  std::vector<uint32_t> later_reader_start;
  std::vector<uint32_t> later_readers;
  static constexpr uint32_t kMaxMarkedChunks = 64;
  static constexpr uint32_t kMaxLaterReadersPerChunk = 8;
  std::span<const uint32_t> LaterReaders(uint32_t c) const {
    if (c + size_t{1} >= later_reader_start.size()) return {};
    return std::span<const uint32_t>(later_readers).subspan(later_reader_start[c],
                                                             later_reader_start[c + 1] - later_reader_start[c]);
  }

  // Whether [offset, offset + length) covers a chunk with a step term.
  // REQUIRES: a decoded index, the range inside the logical size, length > 0.
  bool CoversStepPredicted(uint64_t offset, uint64_t length) const {
    return Covers(step_predicted_before, offset, length);
  }
  // Whether it covers a chunk coded in step space. Same requirements.
  bool CoversStepSpace(uint64_t offset, uint64_t length) const { return Covers(step_space_before, offset, length); }
  // Whether [offset, offset + length) covers a chunk counted by the prefix
  // counts `before` (one of the two above).
  bool Covers(const std::vector<uint32_t>& before, uint64_t offset, uint64_t length) const;

  // Serializes the index (the bytes the footer's checksum covers).
  void EncodeTo(ByteWriter& w) const;
  // Parses `bytes` and checks every rule of FORMAT.md ("Validation") given
  // the payload area [BlobHeader::kEncodedSize, payload_end).
  static Result<BlobIndex> DecodeFrom(ByteSpan bytes, uint64_t payload_end, const DecodeLimits& limits);
};

}  // namespace ckptfs
