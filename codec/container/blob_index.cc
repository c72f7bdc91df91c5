// Parsing and validation of the blob index: after DecodeFrom succeeds every
// offset and length in the index is known to be consistent, so readers use
// them without further checks.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "codec/container/blob_format.h"
#include "codec/tensor/lossy/low_rank.h"
#include "codec/tensor/lossy/row_column_base.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

Status ValidateChunk(const BlobIndex& index, uint32_t c, const SegmentInfo& segment, uint64_t segment_at,
                     uint64_t stored_at, uint64_t payload_end, const DecodeLimits& limits) {
  const ChunkInfo& chunk = index.chunks[c];
  auto fail = [&](std::string why) {
    return Status::Corruption(fmt::format("blob index: chunk {} at logical offset {}: {}", c, chunk.logical_offset, why));
  };
  const uint64_t segment_end = segment.offset + segment.length;
  if (chunk.logical_offset != segment_at) return fail(fmt::format("want logical offset {}", segment_at));
  if (chunk.logical_length == 0) return fail("empty chunk");
  if (chunk.logical_length > segment_end - segment_at)
    return fail(fmt::format("length {} runs past its segment's end {}", chunk.logical_length, segment_end));
  if (chunk.logical_length > limits.max_chunk_bytes)
    return fail(fmt::format("length {} exceeds the limit {}", chunk.logical_length, limits.max_chunk_bytes));
  DType dtype = DType::kU8;
  if (segment.tensor >= 0) {
    dtype = index.tensors[segment.tensor].dtype;
    if (chunk.logical_length % DTypeSize(dtype) != 0)
      return fail(fmt::format("length {} is not whole {} elements", chunk.logical_length, DTypeName(dtype)));
  }
  if (chunk.stored_offset != stored_at) return fail(fmt::format("stored offset {}, want {}", chunk.stored_offset, stored_at));
  if (chunk.stored_length > payload_end - stored_at)
    return fail(fmt::format("stored length {} runs past the payload end {}", chunk.stored_length, payload_end));
  if (chunk.stored_length > chunk.logical_length + kMaxStoredOverhead)
    return fail(fmt::format("stored length {} exceeds logical length {} + {}", chunk.stored_length,
                            chunk.logical_length, kMaxStoredOverhead));
  bool delta = chunk.codec == ChunkCodec::kBytePlaneXorZstd || chunk.codec == ChunkCodec::kZstdWithBase;
  switch (chunk.codec) {
    case ChunkCodec::kRaw:
      if (chunk.stored_length != chunk.logical_length)
        return fail(fmt::format("raw chunk stores {} bytes, want {}", chunk.stored_length, chunk.logical_length));
      break;
    case ChunkCodec::kZeros:
      if (chunk.stored_length != 0) return fail(fmt::format("zeros chunk stores {} bytes, want 0", chunk.stored_length));
      break;
    case ChunkCodec::kBytePlaneZstd:
    case ChunkCodec::kBytePlaneXorZstd:
      if (!IsCodecFloat(dtype)) return fail(fmt::format("byte-plane codec on dtype {}", DTypeName(dtype)));
      break;
    case ChunkCodec::kZstd:
    case ChunkCodec::kZstdWithBase: break;
    case ChunkCodec::kLossy: {
      if (!IsCodecFloat(dtype) || segment.tensor < 0 || index.tensors[segment.tensor].big_endian)
        return fail(fmt::format("lossy codec on dtype {}", DTypeName(dtype)));
      Result<LossyChunkParams> params = LossyChunkParams::DecodeFrom(index.params[c]);
      if (!params.ok()) return fail(params.status().message());
      // A copy prediction reads this file alone (FORMAT.md "Step
      // prediction"): its delta frame has no base.
      delta = params->reads_base();
      if (params->copy()) {
        // A copy of a master in this file lowers the precision; one in the
        // ref object may keep it (the same f32 weights in two files).
        if (!params->ref_copy() && dtype != DType::kBF16 && dtype != DType::kF16)
          return fail(fmt::format("copy prediction on dtype {}, want bf16 or f16", DTypeName(dtype)));
        if (params->ref_copy() && !index.header.ref) return fail("ref copy in a blob without a ref");
        if (index.base_offsets[c] != 0)
          return fail(fmt::format("base offset {} on a copy prediction, want 0", index.base_offsets[c]));
      }
      if (params->row_column) {
        // Whole rows of f32 elements, and a block the stream follows.
        const RowColumnTerm& t = *params->row_column;
        const uint64_t n = chunk.logical_length / 4;
        if (dtype != DType::kF32 || n % t.columns != 0 ||
            t.block_bytes != lossy::RowColumnBlockSize(n / t.columns, t.columns) ||
            t.block_bytes >= chunk.stored_length)
          return fail(fmt::format("row-column base over {} columns in {} bytes does not fit {} elements stored in "
                                  "{} bytes",
                                  t.columns, t.block_bytes, n, chunk.stored_length));
      }
      if (params->low_rank) {
        // Whole rows of f32 elements, and a factor block the stream follows.
        const LowRankTerm& t = *params->low_rank;
        const uint64_t n = chunk.logical_length / 4;
        if (dtype != DType::kF32 || n % t.columns != 0 ||
            t.block_bytes != lossy::LowRankBlockSize(n / t.columns, t.columns, t.rank) ||
            t.block_bytes >= chunk.stored_length)
          return fail(fmt::format("low-rank term of rank {} over {} columns in {} bytes does not fit {} elements "
                                  "stored in {} bytes",
                                  t.rank, t.columns, t.block_bytes, n, chunk.stored_length));
      }
      break;
    }
  }
  if (chunk.codec != ChunkCodec::kLossy && !index.params[c].empty())
    return fail(fmt::format("parameters area of {} bytes on a lossless codec, want 0", index.params[c].size()));
  if (delta) {
    if (!index.header.base) return fail("delta chunk in a blob without a base");
    if (index.base_offsets[c] > UINT64_MAX - chunk.logical_length) return fail("base offset overflows");
  } else if (index.base_offsets[c] != 0) {
    return fail(fmt::format("base offset {} on a non-delta chunk, want 0", index.base_offsets[c]));
  }
  return Status::Ok();
}

// A step-predicted chunk reads this file's optimizer state while it is
// decoded: each such range must lie inside the file and cover no chunk with
// a step term, so that a prediction never waits for another (no cycle);
// a copy's range (a master copy of the weights) may cover step-predicted
// chunks but no other copy, so reads nest three levels at most (a copy, its
// master, the master's first moment in step space, its second moment). The
// base's ranges are checked by the same rule against the base when a chunk
// is read (blob_reader.cc). Fills step_predicted_before, so each check is
// two binary searches (a hostile index may cover millions of chunks).
Status ValidateStepPredictions(BlobIndex& index) {
  const size_t count = index.chunks.size();
  std::vector<std::optional<StepPrediction>> steps(count);
  std::vector<std::optional<StepSpace>> spaces(count);
  index.step_predicted_before.assign(count + 1, 0);
  index.step_space_before.assign(count + 1, 0);
  std::vector<uint32_t> copies_before(count + 1, 0);
  for (size_t c = 0; c < count; ++c) {
    bool step = false;
    if (index.chunks[c].codec == ChunkCodec::kLossy) {
      Result<LossyChunkParams> params = LossyChunkParams::DecodeFrom(index.params[c]);  // validated before
      // Only a step term reads this file; a scaled base does not. A ref
      // copy reads the ref instead (its range is checked against the ref
      // when it is read), and counts as step-predicted too: no base range
      // of a later version may cover it, so that reads never fan out
      // through a chain of bases and refs.
      step = params.ok() && params->prediction && params->prediction->has_step;
      if (step) steps[c] = params->prediction;
      if (params.ok()) spaces[c] = params->step_space;
    }
    index.step_predicted_before[c + 1] = index.step_predicted_before[c] + (step ? 1 : 0);
    // A ref copy reads another blob: a master in this file may be one.
    copies_before[c + 1] = copies_before[c] + (step && steps[c]->copy && !steps[c]->ref ? 1 : 0);
    index.step_space_before[c + 1] = index.step_space_before[c] + (spaces[c] ? 1 : 0);
  }
  const uint64_t size = index.header.logical_size;
  // (chunk, a later chunk that reads it), at most kMaxLaterReadersPerChunk
  // per chunk of the file on average: a hostile index of millions of
  // chunks, each marking 64, would otherwise take gigabytes for a hint.
  std::vector<std::pair<uint32_t, uint32_t>> read_later;
  const uint64_t max_pairs = uint64_t{BlobIndex::kMaxLaterReadersPerChunk} * count;
  // Chunk `reader` reads [offset, +length) (checked to lie in the file).
  auto mark = [&](size_t reader, uint64_t offset, uint64_t length) {
    const uint32_t first = ChunkIndexAt(index.chunks, offset);
    const uint32_t last = ChunkIndexAt(index.chunks, offset + length - 1);
    if (last - first >= BlobIndex::kMaxMarkedChunks) return;
    for (uint32_t k = first; k <= last && k < reader && read_later.size() < max_pairs; ++k)
      read_later.emplace_back(k, static_cast<uint32_t>(reader));
  };
  // A step-space chunk reads its second moment from this file: f32 like the
  // chunk, and a range of plain chunks (neither step-predicted nor in step
  // space), so that decoding it never comes back to itself.
  for (size_t c = 0; c < count; ++c) {
    if (!spaces[c]) continue;
    const ChunkInfo& chunk = index.chunks[c];
    auto fail = [&](std::string why) {
      return Status::Corruption(
          fmt::format("blob index: chunk {} at logical offset {}: step space {}", c, chunk.logical_offset, why));
    };
    if (chunk.segment < 0 || index.segments[chunk.segment].tensor < 0 ||
        index.tensors[index.segments[chunk.segment].tensor].dtype != DType::kF32)
      return fail("in a chunk that is not of an f32 tensor");
    const uint64_t offset = spaces[c]->v_offset, length = chunk.logical_length;
    if (offset > size || length > size - offset || length == 0)
      return fail(fmt::format("range [{}, +{}) past the logical size {}", offset, length, size));
    // Inside one f32 tensor (segments tile the file in order: validated).
    const auto seg = std::upper_bound(index.segments.begin(), index.segments.end(), offset,
                                      [](uint64_t at, const SegmentInfo& s) { return at < s.offset; }) - 1;
    if (seg->tensor < 0 || index.tensors[seg->tensor].dtype != DType::kF32 || offset + length > seg->offset + seg->length)
      return fail(fmt::format("range [{}, +{}) not inside one f32 tensor", offset, length));
    if (index.CoversStepPredicted(offset, length) || index.CoversStepSpace(offset, length))
      return fail(fmt::format("range [{}, +{}) covers a step-predicted or step-space chunk", offset, length));
    mark(c, offset, length);
  }
  for (size_t c = 0; c < count; ++c) {
    if (!steps[c] || steps[c]->ref) continue;
    const ChunkInfo& chunk = index.chunks[c];
    const uint64_t n = chunk.logical_length / DTypeSize(index.tensors[index.segments[chunk.segment].tensor].dtype);
    const uint64_t length = n * lossy::ElementSize(steps[c]->state_type);
    auto check = [&](uint64_t offset, const char* what) -> Status {
      auto fail = [&](std::string why) {
        return Status::Corruption(
            fmt::format("blob index: chunk {} at logical offset {}: step {} {}", c, chunk.logical_offset, what, why));
      };
      if (offset > size || length > size - offset)
        return fail(fmt::format("range [{}, +{}) past the logical size {}", offset, length, size));
      if (steps[c]->copy ? index.Covers(copies_before, offset, length) : index.CoversStepPredicted(offset, length))
        return fail(fmt::format("range [{}, +{}) covers a {} chunk", offset, length,
                                steps[c]->copy ? "copy-predicted" : "step-predicted"));
      return Status::Ok();
    };
    RETURN_IF_ERROR(check(steps[c]->m_offset, "m"));
    if (steps[c]->has_v) RETURN_IF_ERROR(check(steps[c]->v_offset, "v"));
    if (length > 0) {
      mark(c, steps[c]->m_offset, length);
      if (steps[c]->has_v) mark(c, steps[c]->v_offset, length);
    }
  }
  std::sort(read_later.begin(), read_later.end());
  read_later.erase(std::unique(read_later.begin(), read_later.end()), read_later.end());
  index.later_reader_start.assign(count + 1, 0);
  index.later_readers.clear();
  index.later_readers.reserve(read_later.size());
  for (auto [chunk, reader] : read_later) {
    ++index.later_reader_start[chunk + 1];
    index.later_readers.push_back(reader);
  }
  for (size_t c = 0; c < count; ++c) index.later_reader_start[c + 1] += index.later_reader_start[c];
  return Status::Ok();
}

}  // namespace

bool BlobIndex::Covers(const std::vector<uint32_t>& before, uint64_t offset, uint64_t length) const {
  const uint32_t first = ChunkIndexAt(chunks, offset);
  const uint32_t last = ChunkIndexAt(chunks, offset + length - 1);
  return before[last + 1] > before[first];
}

Result<BlobIndex> BlobIndex::DecodeFrom(ByteSpan bytes, uint64_t payload_end, const DecodeLimits& limits) {
  ByteReader r(bytes, "blob index");
  BlobIndex index;
  ASSIGN_OR_RETURN(index.header, IndexHeader::DecodeFrom(r));
  const IndexHeader& h = index.header;
  if (h.logical_size > limits.max_logical_size)
    return Status::Corruption(
        fmt::format("blob index: logical size {} exceeds the limit {}", h.logical_size, limits.max_logical_size));
  // Bound the counts by the bytes present before allocating anything.
  const uint64_t min_bytes = uint64_t{h.tensor_count} * TensorRecord::kFixedSize +
                             uint64_t{h.segment_count} * SegmentRecord::kEncodedSize +
                             uint64_t{h.chunk_count} * ChunkRecord::kFixedSize;
  if (min_bytes > r.remaining())
    return Status::Corruption(fmt::format("blob index: {} tensors, {} segments, {} chunks need {} bytes, have {}",
                                          h.tensor_count, h.segment_count, h.chunk_count, min_bytes, r.remaining()));

  index.tensors.reserve(h.tensor_count);
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    ASSIGN_OR_RETURN(TensorInfo t, TensorRecord::DecodeFrom(r));
    index.tensors.push_back(std::move(t));
  }
  index.segments.reserve(h.segment_count);
  for (uint32_t i = 0; i < h.segment_count; ++i) {
    ASSIGN_OR_RETURN(SegmentInfo s, SegmentRecord::DecodeFrom(r));
    index.segments.push_back(s);
  }
  index.chunks.reserve(h.chunk_count);
  index.stored_checksums.reserve(h.chunk_count);
  index.base_offsets.reserve(h.chunk_count);
  index.params.reserve(h.chunk_count);
  for (uint32_t i = 0; i < h.chunk_count; ++i) {
    ASSIGN_OR_RETURN(ChunkRecord c, ChunkRecord::DecodeFrom(r));
    index.chunks.push_back(c.info);
    index.stored_checksums.push_back(c.stored_checksum);
    index.base_offsets.push_back(c.base_offset);
    index.params.push_back(std::move(c.params));
  }
  if (r.remaining() != 0)
    return Status::Corruption(fmt::format("blob index: {} bytes after the chunk table", r.remaining()));

  // Segments tile [0, logical_size); their chunks tile each segment and
  // the stored payloads tile [header end, payload_end), all in order.
  uint64_t at = 0;
  uint64_t next_chunk = 0;
  uint64_t stored_at = BlobHeader::kEncodedSize;
  for (uint32_t s = 0; s < h.segment_count; ++s) {
    const SegmentInfo& seg = index.segments[s];
    auto fail = [&](std::string why) {
      return Status::Corruption(fmt::format("blob index: segment {} at offset {}: {}", s, seg.offset, why));
    };
    if (seg.offset != at) return fail(fmt::format("want offset {}", at));
    if (seg.length == 0) return fail("empty segment");
    if (seg.length > h.logical_size - at)
      return fail(fmt::format("length {} runs past the logical size {}", seg.length, h.logical_size));
    if (seg.tensor < -1 || (seg.tensor >= 0 && static_cast<uint32_t>(seg.tensor) >= h.tensor_count))
      return fail(fmt::format("names tensor {} of {}", seg.tensor, h.tensor_count));
    if (seg.tensor >= 0 && seg.length % DTypeSize(index.tensors[seg.tensor].dtype) != 0)
      return fail(fmt::format("length {} is not whole elements", seg.length));
    if (seg.first_chunk != next_chunk) return fail(fmt::format("first chunk {}, want {}", seg.first_chunk, next_chunk));
    if (seg.chunk_count == 0 || seg.chunk_count > h.chunk_count - next_chunk)
      return fail(fmt::format("chunk count {} of {} remaining", seg.chunk_count, h.chunk_count - next_chunk));
    uint64_t segment_at = seg.offset;
    for (uint32_t c = seg.first_chunk; c < seg.first_chunk + seg.chunk_count; ++c) {
      RETURN_IF_ERROR(ValidateChunk(index, c, seg, segment_at, stored_at, payload_end, limits));
      index.chunks[c].segment = static_cast<int32_t>(s);
      segment_at += index.chunks[c].logical_length;
      stored_at += index.chunks[c].stored_length;
    }
    if (segment_at != seg.offset + seg.length)
      return fail(fmt::format("chunks cover {} of {} bytes", segment_at - seg.offset, seg.length));
    at += seg.length;
    next_chunk += seg.chunk_count;
  }
  if (at != h.logical_size)
    return Status::Corruption(fmt::format("blob index: segments cover {} bytes, want {}", at, h.logical_size));
  if (next_chunk != h.chunk_count)
    return Status::Corruption(fmt::format("blob index: segments use {} chunks, want {}", next_chunk, h.chunk_count));
  if (stored_at != payload_end)
    return Status::Corruption(fmt::format("blob index: chunks store {} payload bytes, want {}",
                                          stored_at - BlobHeader::kEncodedSize, payload_end - BlobHeader::kEncodedSize));
  RETURN_IF_ERROR(ValidateStepPredictions(index));
  return index;
}

}  // namespace ckptfs
