// Decoding one chunk of a blob (BlobReaderImpl::DecodeChunk): its stored
// bytes, the base version's bytes a delta chunk is coded against, and the
// inputs of a step prediction (the optimizer state of this version and of
// its base), read through the chunk cache one level down the chain.
#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "codec/common/hash.h"
#include "codec/container/blob_reader_impl.h"
#include "codec/optimizer/step_space.h"
#include "codec/optimizer/step_space_slices.h"
#include "codec/tensor/chunk_codec.h"
#include "codec/tensor/lossy/dither.h"
#include "codec/tensor/lossy/low_rank.h"
#include "codec/tensor/lossy/row_column_base.h"

namespace ckptfs::blob_internal {

namespace {
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

}  // namespace ckptfs::blob_internal
