// EncodeBlob: chunk the file, encode the chunks in parallel windows, append
// them in order, then the index and the footer. Memory stays bounded by the
// window of chunks in flight; the output does not depend on the thread count.
#include <fmt/format.h>
#include <zstd.h>

#include <atomic>
#include <memory>
#include <thread>

#include "codec/container/blob_format.h"
#include "codec/tensor/chunk_encoder.h"

namespace ckptfs {
namespace {

struct PlannedChunk {
  uint64_t offset = 0;
  uint64_t length = 0;
  DType dtype = DType::kU8;
  std::optional<uint64_t> base_offset;  // set when the base holds this range
};

struct EncodedChunkSlot {
  ScratchBuffer stored;
  ChunkEncoding encoding;
  uint64_t stored_checksum = 0;
  uint64_t decoded_checksum = 0;
  bool delta = false;
  Status status;
};

// The base tensor's offset for each tensor of `layout` that the base holds
// with the same name, dtype, shape and byte order, each as one segment of
// the same length; nullopt otherwise.
std::vector<std::optional<uint64_t>> MatchBaseTensors(const Layout& layout, const BlobReader& base) {
  std::vector<std::optional<uint64_t>> matches(layout.tensors.size());
  auto single_segment = [](const auto& segments, int32_t tensor) -> const auto* {
    decltype(&segments[0]) found = nullptr;
    for (const auto& s : segments) {
      if (s.tensor != tensor) continue;
      if (found != nullptr) return decltype(found){nullptr};
      found = &s;
    }
    return found;
  };
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorInfo& mine = layout.tensors[t];
    if (!IsCodecFloat(mine.dtype)) continue;
    const auto* my_segment = single_segment(layout.segments, static_cast<int32_t>(t));
    if (my_segment == nullptr) continue;
    for (size_t b = 0; b < base.tensors().size(); ++b) {
      const TensorInfo& theirs = base.tensors()[b];
      if (theirs.name != mine.name || theirs.dtype != mine.dtype || theirs.shape != mine.shape ||
          theirs.big_endian != mine.big_endian)
        continue;
      const auto* base_segment = single_segment(base.segments(), static_cast<int32_t>(b));
      if (base_segment != nullptr && base_segment->length == my_segment->length) matches[t] = base_segment->offset;
      break;
    }
  }
  return matches;
}

Status EncodeOne(ByteSpan file, const PlannedChunk& plan, const BaseRef* base, const EncodeOptions& options,
                 CodecScratch& scratch, EncodedChunkSlot* slot) {
  ByteSpan data = file.subspan(plan.offset, plan.length);
  ByteSpan base_bytes;
  if (plan.base_offset) {
    // A base that cannot be read (damaged, or its own base is gone) must not
    // stop the new version from being stored: the chunk becomes a key frame.
    std::byte* buffer = scratch.base.Reserve(plan.length);
    if (base->reader->ReadAt(*plan.base_offset, MutableByteSpan(buffer, plan.length)).ok())
      base_bytes = ByteSpan(buffer, plan.length);
  }
  ASSIGN_OR_RETURN(slot->encoding,
                   EncodeChunkBest(data, plan.dtype, options.zstd_level, base_bytes, scratch, &slot->stored));
  slot->delta = slot->encoding.codec == ChunkCodec::kBytePlaneXorZstd;
  slot->stored_checksum = Checksum64(ByteSpan(slot->stored.data(), slot->encoding.stored_size));
  slot->decoded_checksum = Checksum64(data);
  return Status::Ok();
}

// Buffers of the calling thread kept from one EncodeBlob to the next:
// fresh memory costs page faults (~2 GB/s here, against ~25 GB/s for reused
// memory), which for files of a few chunks would cost more than encoding
// them. Holds about 2 + 2 * threads chunks of memory per encoding thread.
struct EncodeWorkspace {
  CodecScratch scratch;
  std::vector<EncodedChunkSlot> slots;
  bool in_use = false;  // a nested EncodeBlob (from a sink) gets its own
};

class WorkspaceLease {
 public:
  WorkspaceLease() {
    thread_local EncodeWorkspace cached;
    if (cached.in_use) {
      owned_ = std::make_unique<EncodeWorkspace>();
      workspace_ = owned_.get();
    } else {
      workspace_ = &cached;
    }
    workspace_->in_use = true;
  }
  ~WorkspaceLease() { workspace_->in_use = false; }
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  EncodeWorkspace& operator*() { return *workspace_; }

 private:
  std::unique_ptr<EncodeWorkspace> owned_;
  EncodeWorkspace* workspace_;
};

Status CheckOptions(const EncodeOptions& options) {
  if (options.chunk_bytes == 0 || options.chunk_bytes > DecodeLimits{}.max_chunk_bytes)
    return Status::InvalidArgument(fmt::format("encode: chunk_bytes {} outside [1, {}]", options.chunk_bytes,
                                               DecodeLimits{}.max_chunk_bytes));
  if (options.zstd_level < ZSTD_minCLevel() || options.zstd_level > ZSTD_maxCLevel())
    return Status::InvalidArgument(fmt::format("encode: zstd level {} outside [{}, {}]", options.zstd_level,
                                               ZSTD_minCLevel(), ZSTD_maxCLevel()));
  return Status::Ok();
}

}  // namespace

Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout& layout, const BaseRef* base,
                               const EncodeOptions& options, ByteSink* sink) {
  RETURN_IF_ERROR(ValidateLayout(layout, file.size()));
  RETURN_IF_ERROR(CheckOptions(options));
  if (layout.tensors.size() > UINT32_MAX || layout.segments.size() > UINT32_MAX)
    return Status::InvalidArgument("encode: too many tensors or segments");
  for (const TensorInfo& t : layout.tensors)
    if (t.name.size() > UINT16_MAX || t.shape.size() > kMaxTensorRank)
      return Status::InvalidArgument(fmt::format("encode: tensor '{:.64}' name or rank too long", t.name));
  const bool have_base = base != nullptr && base->reader != nullptr;
  std::vector<std::optional<uint64_t>> base_match;
  if (have_base) base_match = MatchBaseTensors(layout, *base->reader);

  // Plan the chunks: whole elements, about chunk_bytes each.
  BlobIndex index;
  index.header.logical_size = file.size();
  index.header.format = layout.format;
  index.tensors = layout.tensors;
  std::vector<PlannedChunk> plan;
  for (const Segment& s : layout.segments) {
    SegmentInfo info{s.offset, s.length, s.tensor, static_cast<uint32_t>(plan.size()), 0};
    const DType dtype = s.is_tensor() ? layout.tensors[s.tensor].dtype : DType::kU8;
    const uint64_t elem = s.is_tensor() ? DTypeSize(dtype) : 1;
    const uint64_t step = std::max<uint64_t>(1, options.chunk_bytes / elem) * elem;
    std::optional<uint64_t> base_start;
    if (s.is_tensor() && have_base) base_start = base_match[s.tensor];
    for (uint64_t at = 0; at < s.length; at += step) {
      PlannedChunk c{s.offset + at, std::min(step, s.length - at), dtype, std::nullopt};
      if (base_start) c.base_offset = *base_start + at;
      plan.push_back(c);
      ++info.chunk_count;
    }
    index.segments.push_back(info);
  }
  if (plan.size() > UINT32_MAX) return Status::InvalidArgument("encode: too many chunks");

  std::vector<std::byte> out;
  ByteWriter w(&out);
  BlobHeader{}.EncodeTo(w);
  RETURN_IF_ERROR(sink->Append(out));
  uint64_t stored_at = out.size();

  const unsigned threads = std::max(1u, options.threads);
  const size_t window = size_t{threads} * 2;
  WorkspaceLease lease;
  std::vector<EncodedChunkSlot>& slots = (*lease).slots;
  slots.resize(std::min(window, std::max<size_t>(plan.size(), 1)));
  // Helper threads get scratch for this call only; the caller's is kept.
  std::vector<CodecScratch> helper_scratches(threads - 1);
  Checksum64Stream file_checksum;
  EncodeStats stats;
  for (size_t first = 0; first < plan.size(); first += slots.size()) {
    const size_t count = std::min(slots.size(), plan.size() - first);
    std::atomic<size_t> next{0};
    auto work = [&](CodecScratch& scratch) {
      for (size_t i = next++; i < count; i = next++)
        slots[i].status = EncodeOne(file, plan[first + i], base, options, scratch, &slots[i]);
    };
    {
      std::vector<std::jthread> helpers;
      for (unsigned t = 1; t < std::min<size_t>(threads, count); ++t)
        helpers.emplace_back(work, std::ref(helper_scratches[t - 1]));
      work((*lease).scratch);
    }
    for (size_t i = 0; i < count; ++i) {
      const EncodedChunkSlot& slot = slots[i];
      const PlannedChunk& p = plan[first + i];
      RETURN_IF_ERROR(slot.status.WithContext(fmt::format("encode: chunk {} at offset {}", first + i, p.offset)));
      RETURN_IF_ERROR(sink->Append(ByteSpan(slot.stored.data(), slot.encoding.stored_size)));
      file_checksum.Update(file.subspan(p.offset, p.length));
      ChunkInfo info{p.offset, p.length, stored_at, slot.encoding.stored_size, slot.encoding.codec,
                     slot.decoded_checksum, -1};
      index.chunks.push_back(info);
      index.stored_checksums.push_back(slot.stored_checksum);
      index.base_offsets.push_back(slot.delta ? *p.base_offset : 0);
      index.params.emplace_back();
      stored_at += slot.encoding.stored_size;
      if (slot.delta) ++stats.delta_chunks;
    }
  }

  index.header.file_checksum = file_checksum.Digest();
  index.header.tensor_count = static_cast<uint32_t>(index.tensors.size());
  index.header.segment_count = static_cast<uint32_t>(index.segments.size());
  index.header.chunk_count = static_cast<uint32_t>(index.chunks.size());
  // Reference the base only when a chunk needs it: a blob whose chunks all
  // stand alone stays readable after the base is deleted.
  if (stats.delta_chunks > 0) index.header.base = base->id;
  out.clear();
  index.EncodeTo(w);
  BlobFooter footer{stored_at, out.size(), Checksum64(out), kBlobVersion};
  footer.EncodeTo(w);
  RETURN_IF_ERROR(sink->Append(out));

  stats.logical_bytes = file.size();
  stats.stored_bytes = stored_at + out.size();
  stats.chunks = static_cast<uint32_t>(index.chunks.size());
  stats.uses_base = stats.delta_chunks > 0;
  return stats;
}

}  // namespace ckptfs
