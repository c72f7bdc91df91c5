// EncodeBlob: chunk the file, encode its lossy chunks (codec/optimizer/
// lossy_passes.h), then every chunk in parallel windows, append them in
// order, then the index and the footer. Memory stays bounded by the window
// of chunks in flight; the output does not depend on the thread count.
#include <fmt/format.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "codec/common/hash.h"
#include "codec/container/blob_format.h"
#include "codec/container/chunk_plan.h"
#include "codec/optimizer/lossy_passes.h"
#include "codec/tensor/chunk_encoder.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

struct EncodedChunkSlot {
  ScratchBuffer stored;
  ChunkEncoding encoding;
  uint64_t stored_checksum = 0;
  std::optional<uint64_t> decoded_checksum;  // hashed by the worker (on several threads)
  bool delta = false;
  Status status;
};

// The reconstruction buffer of a file up to this size is kept for the next
// encode on the thread: the first touch of fresh memory (about 2 GB/s on a
// VM) costs a fifth of a lossy encode of the same bytes. Larger files pay
// it; the cap bounds what an idle encoding thread holds.
constexpr size_t kKeptReconBytes = size_t{64} << 20;

// The base's verbatim segments (headers, pickles, zip directories), in
// order: this version's k-th verbatim segment is coded against the base's
// k-th (kZstdWithBase), which in two saves of one model holds the same
// structure with a few values changed.
std::vector<SegmentInfo> BaseVerbatimSegments(const BlobReader& base) {
  std::vector<SegmentInfo> out;
  for (const SegmentInfo& s : base.segments())
    if (s.tensor < 0) out.push_back(s);
  return out;
}

// Where the base bytes for a chunk at `at` of `length` bytes inside this
// version's verbatim segment come from, given the base's matching segment
// `base` in a base file of `base_size` bytes: the same position when the
// base's segment is that long, else its last `length` bytes; when it is
// shorter than the chunk (a pickle that grew), from its start on, running
// into the bytes after it, unless the chunk is much longer than the
// segment (reading a base's tensors costs a decode and rarely matches).
std::optional<uint64_t> VerbatimBaseOffset(const SegmentInfo& base, uint64_t base_size, uint64_t at,
                                           uint64_t length) {
  if (base.length >= at + length) return base.offset + at;
  if (base.length >= length) return base.offset + base.length - length;
  if (length <= 2 * base.length + 4096 && base.offset + length <= base_size) return base.offset;
  return std::nullopt;
}

// Rewrites, in the reconstructed file, the CRC-32 of every zip entry whose
// payload holds a lossy chunk (the central and local headers both carry
// it), an entry per task of `parallel` (a gigabyte's CRC-32 took a tenth
// of a second on one core at the end of a large encode).
template <typename Parallel>
void RewriteZipCrcs(const Layout& layout, const std::vector<PlannedChunk>& plan,
                    const std::vector<LossyResult>& results, MutableByteSpan recon, unsigned threads,
                    const Parallel& parallel) {
  std::vector<const ZipCrcField*> touched;
  for (const ZipCrcField& field : layout.zip_crcs) {
    for (size_t i = 0; i < plan.size(); ++i)
      if (results[i].used && plan[i].offset < field.payload_offset + field.payload_length &&
          plan[i].offset + plan[i].length > field.payload_offset) {
        touched.push_back(&field);
        break;
      }
  }
  parallel(touched.size(), threads, [&](size_t k, CodecScratch&) {
    const ZipCrcField& field = *touched[k];
    const uint32_t crc = Crc32(ByteSpan(recon.data() + field.payload_offset, field.payload_length));
    for (uint64_t at : field.crc_offsets) StoreLE32(recon.data() + at, crc);
  });
}

// Encodes one chunk into `slot`; its decoded checksum is left to the
// caller, which hashes the chunk's bytes together with the file's checksum.
Status EncodeOne(ByteSpan file, const PlannedChunk& plan, const BaseRef* base, const EncodeOptions& options,
                 const LossyResult* lossy_result, CodecScratch& scratch, EncodedChunkSlot* slot) {
  ByteSpan data = file.subspan(plan.offset, plan.length);
  if (lossy_result != nullptr && lossy_result->used) {
    const std::vector<std::byte>& bytes = lossy_result->stored;
    std::copy(bytes.begin(), bytes.end(), slot->stored.Reserve(bytes.size()));
    slot->encoding = ChunkEncoding{ChunkCodec::kLossy, bytes.size()};
    slot->delta = lossy_result->params.reads_base();
    slot->stored_checksum = Checksum64(bytes);
    return Status::Ok();
  }
  ByteSpan base_bytes = ReadBaseBytes(plan, base, scratch);
  ASSIGN_OR_RETURN(slot->encoding,
                   EncodeChunkBest(data, plan.dtype, options.zstd_level, base_bytes, scratch, &slot->stored));
  slot->delta = slot->encoding.codec == ChunkCodec::kBytePlaneXorZstd || slot->encoding.codec == ChunkCodec::kZstdWithBase;
  slot->stored_checksum = Checksum64(ByteSpan(slot->stored.data(), slot->encoding.stored_size));
  return Status::Ok();
}

// The checksum of one chunk's bytes, adding them to the file's checksum in
// the same read: block by block, so that the second hash of a block finds it
// in the L1 cache instead of reading the chunk from memory twice (the two
// hashes were a tenth of a lossy encode).
uint64_t ChecksumChunkAndFile(ByteSpan data, Checksum64Stream& file_checksum) {
  constexpr size_t kBlock = size_t{16} << 10;
  Checksum64Stream chunk_checksum;
  for (size_t at = 0; at < data.size(); at += kBlock) {
    ByteSpan block = data.subspan(at, std::min(kBlock, data.size() - at));
    chunk_checksum.Update(block);
    file_checksum.Update(block);
  }
  return chunk_checksum.Digest();
}

// From this size a file's checksum is hashed on a thread of its own
// (smaller ones: in the stored pass, a thread's start is not worth it).
constexpr uint64_t kChecksumBesideBytes = uint64_t{16} << 20;

// Buffers of the calling thread kept from one EncodeBlob to the next:
// fresh memory costs page faults (~2 GB/s here, against ~25 GB/s for reused
// memory), which for files of a few chunks would cost more than encoding
// them. Holds about 2 + 2 * threads chunks of memory per encoding thread.
struct EncodeWorkspace {
  CodecScratch scratch;
  std::vector<EncodedChunkSlot> slots;
  // The reconstructed file of a lossy encode, kept for the next call when
  // at most kKeptReconBytes (larger ones are freed after use). Never
  // zero-filled: every byte is written by the copy or the chunk that owns it.
  ScratchBuffer recon;
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
  ~WorkspaceLease() {
    workspace_->scratch.base_hold.reset();  // the base's memory is not this workspace's to keep
    workspace_->in_use = false;
  }
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
  if (options.blob_version != kBlobVersion && options.blob_version != kBlobVersionRawIndex)
    return Status::InvalidArgument(fmt::format("encode: blob version {}, want {} or {}", options.blob_version,
                                               kBlobVersionRawIndex, kBlobVersion));
  if (options.zstd_level < ZSTD_minCLevel() || options.zstd_level > ZSTD_maxCLevel())
    return Status::InvalidArgument(fmt::format("encode: zstd level {} outside [{}, {}]", options.zstd_level,
                                               ZSTD_minCLevel(), ZSTD_maxCLevel()));
  return Status::Ok();
}

}  // namespace

Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout& layout, const BaseRef* base,
                               const EncodeOptions& options, ByteSink* sink) {
  return EncodeBlob(file, layout, base, nullptr, options, sink);
}

Result<EncodeStats> EncodeBlob(ByteSpan file, const Layout& layout, const BaseRef* base,
                               const std::vector<RefCandidate>* refs, const EncodeOptions& options, ByteSink* sink) {
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

  // Each tensor's lossy budget.
  std::vector<lossy::Budget> budgets(layout.tensors.size());
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const TensorInfo& tensor = layout.tensors[t];
    if (options.lossy_budget && IsCodecFloat(tensor.dtype) && !tensor.big_endian)
      budgets[t] = options.lossy_budget(layout.format, tensor);
    const lossy::Budget& budget = budgets[t];
    if (!(budget.rel_l2 >= 0 && budget.max_abs >= 0 && budget.max_rel >= 0))
      return Status::InvalidArgument(fmt::format("encode: lossy budget rel_l2={} max_abs={}, want >= 0",
                                                 budget.rel_l2, budget.max_abs));
  }
  const StepStates states = FindStepStates(layout);
  // SGD's momentum buffer is its own step: with first moments on their
  // step, its step budget applies to it as it is.
  if (options.momentum_step_space) {
    for (const StepStateTensors& s : states.states) {
      lossy::Budget& b = budgets[s.m];
      if (s.v < 0 && b.step_rel_l2 > 0 && b.rel_l2 > 0 && b.max_abs == 0) b.rel_l2 = b.step_rel_l2;
    }
  }
  // f32 weights that an earlier file holds too (ref_copies.h): chunks are
  // cut where the runs it holds end.
  RefRuns ref_runs;
  if (refs != nullptr && !refs->empty() && options.step_prediction) {
    std::vector<bool> eligible(layout.tensors.size());
    for (size_t t = 0; t < layout.tensors.size(); ++t)
      eligible[t] = layout.tensors[t].dtype == DType::kF32 && budgets[t].lossy() && budgets[t].rel_l2 > 0 &&
                    !states.is_state[t];
    ref_runs = FindRefRuns(layout, file, eligible, *refs);
  }
  const RefCandidate* ref = ref_runs.candidate >= 0 ? &(*refs)[static_cast<size_t>(ref_runs.candidate)] : nullptr;

  // Plan the chunks: whole elements, about chunk_bytes each.
  BlobIndex index;
  index.header.logical_size = file.size();
  index.header.format = layout.format;
  index.tensors = layout.tensors;
  std::vector<PlannedChunk> plan;
  const std::vector<SegmentInfo> base_verbatim = have_base ? BaseVerbatimSegments(*base->reader) : std::vector<SegmentInfo>();
  size_t verbatim_ordinal = 0;
  for (const Segment& s : layout.segments) {
    SegmentInfo info{s.offset, s.length, s.tensor, static_cast<uint32_t>(plan.size()), 0};
    const DType dtype = s.is_tensor() ? layout.tensors[s.tensor].dtype : DType::kU8;
    const uint64_t elem = s.is_tensor() ? DTypeSize(dtype) : 1;
    const uint64_t step = std::max<uint64_t>(1, options.chunk_bytes / elem) * elem;
    std::optional<uint64_t> base_start;
    if (s.is_tensor() && have_base) base_start = base_match[s.tensor];
    const SegmentInfo* base_verbatim_segment = nullptr;
    if (!s.is_tensor() && verbatim_ordinal < base_verbatim.size()) base_verbatim_segment = &base_verbatim[verbatim_ordinal];
    if (!s.is_tensor()) ++verbatim_ordinal;
    const lossy::Budget budget = s.is_tensor() ? budgets[s.tensor] : lossy::Budget{};
    // The segment's pieces: the ref runs in it, and what lies between them.
    std::vector<std::pair<uint64_t, std::optional<uint64_t>>> pieces{{0, std::nullopt}};  // (start, ref offset)
    for (const RefRun& run : ref_runs.runs) {
      if (run.offset < s.offset || run.offset + run.length > s.offset + s.length) continue;
      pieces.emplace_back(run.offset - s.offset, run.ref_offset);
      pieces.emplace_back(run.offset + run.length - s.offset, std::nullopt);
    }
    for (size_t k = 0; k < pieces.size(); ++k) {
      const uint64_t end = k + 1 < pieces.size() ? pieces[k + 1].first : s.length;
      for (uint64_t at = pieces[k].first; at < end; at += step) {
        PlannedChunk c{s.offset + at, std::min(step, end - at), dtype, std::nullopt, budget, s.tensor};
        if (base_start) c.base_offset = *base_start + at;
        if (base_verbatim_segment != nullptr)
          c.base_offset = VerbatimBaseOffset(*base_verbatim_segment, base->reader->logical_size(), at, c.length);
        if (pieces[k].second) c.ref_offset = *pieces[k].second + (at - pieces[k].first);
        plan.push_back(c);
        ++info.chunk_count;
      }
    }
    index.segments.push_back(info);
  }
  if (plan.size() > UINT32_MAX) return Status::InvalidArgument("encode: too many chunks");

  const unsigned threads = std::max(1u, options.threads);
  WorkspaceLease lease;
  // Helper threads get scratch for this call only; the caller's is kept.
  std::vector<CodecScratch> helper_scratches(threads - 1);
  // Runs work(i, scratch) for i in [0, count) on up to max_threads threads.
  auto parallel = [&](size_t count, unsigned max_threads, const auto& body) {
    std::atomic<size_t> next{0};
    auto work = [&](CodecScratch& scratch) {
      for (size_t i = next++; i < count; i = next++) body(i, scratch);
    };
    std::vector<std::jthread> helpers;
    for (unsigned t = 1; t < std::min<size_t>(max_threads, count); ++t)
      helpers.emplace_back(work, std::ref(helper_scratches[t - 1]));
    work((*lease).scratch);
  };

  // Lossy chunks first: the file that is stored is their reconstruction,
  // with the zip CRCs recomputed, and every other chunk is taken from it.
  ScratchBuffer& recon_buffer = (*lease).recon;
  struct ReleaseLargeRecon {
    ScratchBuffer& recon;
    ~ReleaseLargeRecon() {
      if (recon.capacity() > kKeptReconBytes) recon = ScratchBuffer();
    }
  } release_large_recon{recon_buffer};
  EncodeStageRecorder stages;
  std::vector<LossyResult> lossy_results;
  std::vector<double> tensor_err2(layout.tensors.size()), tensor_ref2(layout.tensors.size());
  if (std::any_of(plan.begin(), plan.end(), [](const PlannedChunk& c) { return c.lossy(); })) {
    // Each chunk fills its own range of the reconstruction: a lossy one
    // with its reconstruction (or the original bytes), any other with a copy
    // (the chunks cover the file exactly once).
    // Mapped kOnFirstTouch: each chunk's encode populates its part
    // (EncodeLossyChunks), so the zeroing runs on every encode thread.
    MutableByteSpan recon(recon_buffer.Reserve(file.size(), ScratchBuffer::Pages::kOnFirstTouch), file.size());
    const ParallelFor parallel_for = [&](size_t count, unsigned max_threads,
                                         const std::function<void(size_t, CodecScratch&)>& body) {
      parallel(count, max_threads, body);
    };
    const LossyPassesInput passes{file,  layout,       plan, have_base ? base : nullptr, base_match, options, threads,
                                  parallel_for, stages, ref};
    RETURN_IF_ERROR(EncodeLossyChunks(passes, recon, &lossy_results, &tensor_err2, &tensor_ref2));
    RewriteZipCrcs(layout, plan, lossy_results, recon, threads, parallel);
    file = ByteSpan(recon);
  }

  std::vector<std::byte> out;
  ByteWriter w(&out);
  BlobHeader{options.blob_version}.EncodeTo(w);
  RETURN_IF_ERROR(sink->Append(out));
  uint64_t stored_at = out.size();

  const size_t window = size_t{threads} * 2;
  std::vector<EncodedChunkSlot>& slots = (*lease).slots;
  slots.resize(std::min(window, std::max<size_t>(plan.size(), 1)));
  Checksum64Stream file_checksum;
  // On several threads the whole file's checksum, which is hashed in
  // order, runs beside the pass on a thread of its own when the file is
  // large (`file` is final here): hashed after each window of chunks, it
  // left the other threads idle, a tenth of a large lossy encode's time.
  std::future<uint64_t> whole_file_checksum;
  if (threads > 1 && file.size() >= kChecksumBesideBytes)
    whole_file_checksum = std::async(std::launch::async, [file] { return Checksum64(file); });
  EncodeStats stats;
  StageTimer stored_pass_timer;
  for (size_t first = 0; first < plan.size(); first += slots.size()) {
    const size_t count = std::min(slots.size(), plan.size() - first);
    parallel(count, threads, [&](size_t i, CodecScratch& scratch) {
      const LossyResult* lossy_result = lossy_results.empty() ? nullptr : &lossy_results[first + i];
      slots[i].status = EncodeOne(file, plan[first + i], base, options, lossy_result, scratch, &slots[i]);
      // On several threads each chunk's checksum is hashed here (the whole
      // file's beside the pass, above). On one thread both are hashed at
      // once below, from the L1 cache.
      slots[i].decoded_checksum.reset();
      if (threads > 1) slots[i].decoded_checksum = Checksum64(file.subspan(plan[first + i].offset, plan[first + i].length));
    });
    for (size_t i = 0; i < count; ++i) {
      const EncodedChunkSlot& slot = slots[i];
      const PlannedChunk& p = plan[first + i];
      RETURN_IF_ERROR(slot.status.WithContext(fmt::format("encode: chunk {} at offset {}", first + i, p.offset)));
      RETURN_IF_ERROR(sink->Append(ByteSpan(slot.stored.data(), slot.encoding.stored_size)));
      uint64_t decoded_checksum;
      if (slot.decoded_checksum) {
        decoded_checksum = *slot.decoded_checksum;
        if (!whole_file_checksum.valid()) file_checksum.Update(file.subspan(p.offset, p.length));
      } else {
        decoded_checksum = ChecksumChunkAndFile(file.subspan(p.offset, p.length), file_checksum);
      }
      ChunkInfo info{p.offset, p.length, stored_at, slot.encoding.stored_size, slot.encoding.codec, decoded_checksum,
                     -1};
      index.chunks.push_back(info);
      index.stored_checksums.push_back(slot.stored_checksum);
      index.base_offsets.push_back(slot.delta ? *p.base_offset : 0);
      index.params.emplace_back();
      if (slot.encoding.codec == ChunkCodec::kLossy) {
        ByteWriter params(&index.params.back());
        lossy_results[first + i].params.EncodeTo(params);
        ++stats.lossy_chunks;
        if (lossy_results[first + i].params.ref_copy()) ++stats.ref_chunks;
      }
      stored_at += slot.encoding.stored_size;
      if (slot.delta) ++stats.delta_chunks;
    }
  }

  stages.Add(EncodeStage::kStoredPass, stored_pass_timer.Seconds(), false);
  index.header.file_checksum = whole_file_checksum.valid() ? whole_file_checksum.get() : file_checksum.Digest();
  index.header.tensor_count = static_cast<uint32_t>(index.tensors.size());
  index.header.segment_count = static_cast<uint32_t>(index.segments.size());
  index.header.chunk_count = static_cast<uint32_t>(index.chunks.size());
  // Reference the base only when a chunk needs it: a blob whose chunks all
  // stand alone stays readable after the base is deleted.
  if (stats.delta_chunks > 0) index.header.base = base->id;
  // The same for the ref, which only ref copies read.
  if (stats.ref_chunks > 0) {
    stats.ref = ref->id;
    index.header.ref = stats.ref;
  }
  std::vector<std::byte> index_bytes;
  ByteWriter iw(&index_bytes);
  index.EncodeTo(iw);
  out.clear();
  RETURN_IF_ERROR(AppendIndexAndFooter(index_bytes, stored_at, options.blob_version, &out));
  RETURN_IF_ERROR(sink->Append(out));

  if (options.on_reconstruction) options.on_reconstruction(file, index.chunks);
  stats.logical_bytes = file.size();
  if (options.keep_reconstruction && !file.empty() && file.data() == recon_buffer.data()) {
    file = ByteSpan();  // the buffer may leave now
    options.keep_reconstruction(recon_buffer, stats.logical_bytes);
  }
  stats.stored_bytes = stored_at + out.size();
  stats.file_checksum = index.header.file_checksum;
  stats.chunks = static_cast<uint32_t>(index.chunks.size());
  stats.uses_base = stats.delta_chunks > 0;
  stats.stages = stages.Take();
  for (size_t t = 0; t < tensor_err2.size(); ++t)
    if (tensor_err2[t] > 0)
      stats.max_rel_l2 = std::max(stats.max_rel_l2, tensor_ref2[t] > 0 ? std::sqrt(tensor_err2[t] / tensor_ref2[t]) : 1.0);
  return stats;
}

}  // namespace ckptfs
