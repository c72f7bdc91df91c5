#include "codec/optimizer/lossy_passes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "codec/common/hash.h"
#include "codec/optimizer/dither_candidate.h"
#include "codec/optimizer/low_rank_candidate.h"
#include "codec/optimizer/master_copies.h"
#include "codec/optimizer/step_sources.h"
#include "codec/optimizer/step_space.h"
#include "codec/tensor/chunk_encoder.h"
#include "codec/tensor/lossy/row_column_base.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {
namespace {
// A lossy stream at most this share of the raw chunk is kept without
// encoding the lossless candidates: float data never compresses losslessly
// that far (fp32 about 80%, bf16 about 67% of its size) except when it is
// (nearly) all zeros or unchanged, and then the lossy stream prunes it to
// almost nothing too. Skipping them doubles the encode speed of a lossy
// checkpoint (fp32 model + Adam: 146 -> 300 MB/s on one core) at the same
// stored size. At 0.25 every log-mode chunk (Adam's exp_avg_sq, about 35%)
// still paid for the candidates, which never won.
constexpr double kTryLosslessAbove = 0.5;

// Encodes `plan` lossily against the base's reconstruction (closed loop),
// writes the reconstruction into `recon` (the same range), and keeps the
// result unless the lossless candidates (which always meet the budget) are
// smaller; they are only tried when the lossy stream is poor. Otherwise
// the original bytes are copied into `recon`.
// `base_bytes` is the base's reconstruction of the chunk (empty: none).
// With `prediction` the stream is a delta frame against the prediction
// instead (the lossless candidates still XOR against the base). With
// `space` the stream codes the chunk in step space (step_space.h): its
// values, base and prediction are m / s, and the reconstruction x_hat * s.
struct StepSpaceInput {
  ByteSpan x;              // m / s
  ByteSpan base_x;         // the base's reconstruction / s (empty: none)
  const std::byte* scales; // s, f32
  StepSpace params;
  // A dithered chunk (dither_candidate.h): the grid of its stream, no
  // schedule and no other base; its prediction holds the dither.
  std::optional<DitheredPrediction> dithered;
};
Status EncodeLossy(ByteSpan file, const PlannedChunk& plan, ByteSpan base_bytes, const SourceMatch& source,
                   const ChunkPrediction* prediction, const EncodeOptions& options, lossy::LossyKernels* kernels,
                   CodecScratch& scratch, std::byte* recon, LossyResult* result, const StepSpaceInput* space = nullptr) {
  ByteSpan data = file.subspan(plan.offset, plan.length);
  MutableByteSpan out(recon + plan.offset, plan.length);
  // All zeros is stored as nothing (kZeros) and exactly.
  if (IsAllZero(data)) {
    std::copy(data.begin(), data.end(), out.begin());
    result->used = false;
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(lossy::ElementType type, lossy::ElementTypeOf(plan.dtype));
  // The lossy kernels load whole elements: give them aligned spans (tensor
  // data in a file is not always aligned to its element size).
  const size_t align = lossy::ElementSize(type);
  auto misaligned = [align](const void* p) { return reinterpret_cast<uintptr_t>(p) % align != 0; };
  ByteSpan values = space != nullptr ? space->x : data;
  const ByteSpan codec_base = space != nullptr ? space->base_x : base_bytes;
  if (misaligned(values.data())) {
    std::byte* copy = scratch.planes.Reserve(values.size());
    std::copy(values.begin(), values.end(), copy);
    values = ByteSpan(copy, values.size());
  }
  const bool direct_out = !misaligned(out.data());
  lossy::EncodeOptions lossy_options{options.lossy_zstd_level, kernels, direct_out ? out : MutableByteSpan(),
                                     &options.budget_schedule};
  lossy_options.source_unchanged = source.unchanged;
  // Unbiased levels: a shrunk first moment (the policy gives it a budget on
  // the step) shortens every step after a restore, and may spend 1.25 times
  // its budget on the gain; shrunk weights lag behind their run, and their
  // gain stays within the budget (the room the search left).
  lossy_options.unbiased_levels = true;
  lossy_options.unbias_allowance = plan.budget.step_rel_l2 > 0 ? lossy::kUnbiasAllowance : 1.0;
  lossy_options.trellis = options.trellis;
  if (prediction != nullptr) {
    lossy_options.measured_update = prediction->update_rel;
    lossy_options.alternative_base = codec_base;
    // A copy in a key frame (master_copies.h) has no update to tie its
    // budget to: the configured one.
    if (prediction->step.copy && codec_base.empty()) lossy_options.schedule = nullptr;
  }
  const bool dithered = space != nullptr && space->dithered && prediction != nullptr;
  if (dithered) {
    lossy_options.uniform_step = space->dithered->grid_step;
    lossy_options.schedule = nullptr;
    lossy_options.alternative_base = {};
    lossy_options.symbol_contexts = space->dithered->contexts;
  }
  ASSIGN_OR_RETURN(lossy::EncodedChunk encoded,
                   lossy::EncodeChunk(type, values, prediction != nullptr ? prediction->prediction : codec_base,
                                      plan.budget, &scratch.lossy(), lossy_options));
  if (!direct_out) std::copy(encoded.reconstruction.begin(), encoded.reconstruction.end(), out.begin());
  if (space != nullptr) FromStepSpace(out, space->scales);
  if (encoded.stats.bits == 0 ||
      static_cast<double>(encoded.bytes.size()) > kTryLosslessAbove * static_cast<double>(data.size())) {
    // The lossless candidates only for their size (scratch.decoded is unused
    // while encoding); the main pass encodes the winner again.
    ASSIGN_OR_RETURN(ChunkEncoding lossless,
                     EncodeChunkBest(data, plan.dtype, options.zstd_level, base_bytes, scratch, &scratch.decoded));
    if (lossless.stored_size <= encoded.bytes.size()) {
      std::copy(data.begin(), data.end(), out.begin());
      result->used = false;
      return Status::Ok();
    }
  }
  ASSIGN_OR_RETURN(lossy::StreamHeader header, lossy::StreamHeader::DecodeFrom(encoded.bytes));
  // The encoder measured the error on this very reconstruction (same
  // definition as MeasureError, in its fixed reduction order): no extra pass.
  LossyChunkParams& p = result->params;
  p.flags = (header.flags & lossy::kFlagDelta) != 0 ? LossyChunkParams::kFlagDelta : 0;
  p.bits = encoded.stats.bits;
  p.mode = encoded.stats.mode;
  p.max_rel = encoded.stats.max_rel;
  p.err2_sum = encoded.stats.err2_sum;
  p.ref2_sum = encoded.stats.ref2_sum;
  p.max_abs = encoded.stats.max_abs;
  p.pruned = encoded.stats.pruned;
  p.quantized = encoded.stats.quantized;
  p.exact = encoded.stats.exact;
  // The parameters reject a non-finite update (a blob must always open).
  const float update_rel = static_cast<float>(encoded.stats.update_rel);  // Inf when not finite as a float
  p.update_rel = std::isfinite(update_rel) ? update_rel : 0.0f;
  p.budget_rel_l2 = encoded.stats.budget.rel_l2;
  p.source_digest = source.digest;
  // A key frame (chosen when smaller) reads neither base nor prediction.
  if (prediction != nullptr && p.delta() && !encoded.stats.used_alternative_base) p.prediction = prediction->step;
  if (space != nullptr) p.step_space = space->params;
  if (dithered && p.prediction) p.dither = space->dithered->dither;
  result->stored = std::move(encoded.bytes);
  result->used = true;
  return Status::Ok();
}

// A step-space first moment encoded again against a prediction with a
// low-rank term (low_rank_candidate.h), kept when its factors and stream
// are smaller than `result` (the chunk encoded lossily without one, whose
// reconstruction is in `recon`); otherwise `result` and `recon` stay. Only
// with options.low_rank_moments, a base, and a range that changed.
// *tried: whether the candidate was encoded.
Status TryLowRank(ByteSpan file, const PlannedChunk& plan, const Layout& layout, const StepStates& states,
                  ByteSpan base_bytes, const SourceMatch& source, const EncodeOptions& options, CodecScratch& scratch,
                  MutableByteSpan recon, LossyResult* result, const StepSpaceInput& space, bool* tried) {
  if (!options.low_rank_moments || source.unchanged || space.base_x.empty() || !result->used) return Status::Ok();
  const std::optional<uint64_t> tensor_offset = states.tensor_offset[plan.tensor];
  if (!tensor_offset || plan.offset < *tensor_offset || !(result->params.budget_rel_l2 > 0)) return Status::Ok();
  const std::optional<uint64_t> columns =
      ChunkColumns(layout.tensors[plan.tensor], (plan.offset - *tensor_offset) / 4, plan.length / 4);
  if (!columns) return Status::Ok();
  std::optional<LowRankCandidate> candidate =
      PredictLowRank(space.x, space.base_x, *columns, result->params.budget_rel_l2, scratch);
  if (!candidate) return Status::Ok();
  *tried = true;
  MutableByteSpan range = recon.subspan(plan.offset, plan.length);
  std::byte* kept = scratch.step_inputs[3].Reserve(plan.length);  // unused by this pass otherwise
  std::copy(range.begin(), range.end(), kept);
  LossyResult low_rank;
  RETURN_IF_ERROR(EncodeLossy(file, plan, base_bytes, source, &candidate->prediction, options, options.lossy_kernels,
                              scratch, recon.data(), &low_rank, &space));
  // Only a delta frame against the prediction reads the term.
  if (low_rank.used && low_rank.params.prediction &&
      low_rank.stored.size() + candidate->block.size() < result->stored.size()) {
    low_rank.stored.insert(low_rank.stored.begin(), candidate->block.begin(), candidate->block.end());
    low_rank.params.low_rank = candidate->term;
    *result = std::move(low_rank);
  } else {
    std::copy(kept, kept + plan.length, range.begin());
  }
  return Status::Ok();
}

// The row-column candidate: an update denominator's log-mode chunk coded as
// a delta frame against a row-column base (codec/tensor/lossy/
// row_column_base.h). Only for chunks of whole rows of a matrix whose plain
// stream costs more than kRowColumnFromBits per element: a key frame, or a
// delta against a version far back (an anchor frame); a near version
// predicts its successor better than any outer product.
constexpr double kRowColumnFromBits = 1.0;
// The candidate costs a second encode of the chunk, and on most chunks it
// saved little (`ckptfs encode --stages` on a 201 MB MLP near
// initialization: 45 % of the key frame's time for 0.4 % of its bytes; on
// a transformer 36 % for 9 %): a chunk of at least kRowColumnSampleRows
// rows is first encoded both ways on a band of 1/kRowColumnSampleShare of
// its rows (middle rows; the candidate with the band's own fit), and only
// the winner is then encoded whole: the candidate when it is below
// kRowColumnSampleGain of the plain band. (The whole chunk was encoded
// plainly, then the candidate was tried on a band and encoded whole again
// when the band said so: a third of a transformer's key frame.) A chunk
// of fewer rows is encoded whole both ways (TryRowColumnBase).
constexpr uint64_t kRowColumnSampleShare = 8;
constexpr uint64_t kRowColumnSampleRows = 64;
constexpr double kRowColumnSampleGain = 0.97;

// The number of columns of a chunk the row-column candidate may apply to
// (an f32 chunk with a per-element bound, of whole rows of one tensor).
std::optional<uint64_t> RowColumnColumns(const PlannedChunk& plan, const Layout& layout,
                                         const std::vector<std::optional<uint64_t>>& tensor_offsets) {
  if (plan.dtype != DType::kF32 || !(plan.budget.max_rel > 0) || plan.tensor < 0) return std::nullopt;
  // A tensor split over several segments has no rows here.
  const std::optional<uint64_t>& tensor_offset = tensor_offsets[plan.tensor];
  if (!tensor_offset || plan.offset < *tensor_offset) return std::nullopt;
  return ChunkColumns(layout.tensors[plan.tensor], (plan.offset - *tensor_offset) / 4, plan.length / 4);
}

// `plan` encoded as a delta frame against its own row-column fit: *ok when
// the stream is a log-mode delta frame (then *out holds it with its block,
// and its reconstruction is in `recon`).
Status EncodeWithRowColumnBase(ByteSpan file, const PlannedChunk& plan, uint64_t columns, const SourceMatch& source,
                               const EncodeOptions& options, CodecScratch& scratch, MutableByteSpan recon,
                               LossyResult* out, bool* ok) {
  *ok = false;
  std::optional<std::vector<std::byte>> block = lossy::FitRowColumnBase(file.subspan(plan.offset, plan.length), columns);
  if (!block) return Status::Ok();
  MutableByteSpan base(scratch.step_inputs[3].Reserve(plan.length), plan.length);
  if (!lossy::SynthesizeRowColumnBase(*block, columns, base)) return Status::Ok();
  LossyResult candidate;
  RETURN_IF_ERROR(EncodeLossy(file, plan, base, source, nullptr, options, options.lossy_kernels, scratch,
                              recon.data(), &candidate));
  if (!candidate.used || !candidate.params.delta() || candidate.params.mode != 2) return Status::Ok();
  candidate.stored.insert(candidate.stored.begin(), block->begin(), block->end());
  candidate.params.flags &= static_cast<uint8_t>(~LossyChunkParams::kFlagDelta);
  candidate.params.row_column = RowColumnTerm{static_cast<uint32_t>(columns), block->size()};
  *out = std::move(candidate);
  *ok = true;
  return Status::Ok();
}

// Whether the base's chunk at `plan`'s base range was coded against a
// row-column base. A delta frame's second moment then nearly always is
// too (early in training, or where gradients fade, it moves by more than
// its row and column scales explain; docs/bench.md, 2026-12-06): the band
// decides first and only the winner is encoded whole, instead of the
// plain stream first and then the band and the candidate (two whole
// encodes). Elsewhere the plain stream comes first, as most second
// moments against a near version cost under kRowColumnFromBits.
bool BaseUsedRowColumn(const BaseRef* base, const PlannedChunk& plan) {
  if (base == nullptr || base->reader == nullptr || !plan.base_offset) return false;
  const std::vector<ChunkInfo>& chunks = base->reader->chunks();
  if (chunks.empty() || *plan.base_offset >= base->reader->logical_size()) return false;
  const uint32_t c = ChunkIndexAt(chunks, *plan.base_offset);
  if (chunks[c].codec != ChunkCodec::kLossy) return false;
  Result<LossyChunkParams> params = LossyChunkParams::DecodeFrom(base->reader->chunk_params(c));
  return params.ok() && params->row_column.has_value();
}

// The band of a chunk of `rows` rows (RowColumnBandVerdict): its bytes'
// offset in the chunk and their count.
struct RowColumnBand {
  uint64_t skip = 0;
  uint64_t length = 0;
};
RowColumnBand BandOf(uint64_t rows, uint64_t columns) {
  const uint64_t band_rows = rows / kRowColumnSampleShare;
  return {(rows - band_rows) / 2 * columns * 4, band_rows * columns * 4};
}

// The band's verdict (above). kNoBand: too few rows. With kRowColumn,
// *saved estimates the bytes the candidate saves on the whole chunk.
enum class BandVerdict { kNoBand, kPlain, kRowColumn };
BandVerdict RowColumnBandVerdict(ByteSpan file, const PlannedChunk& plan, uint64_t columns, ByteSpan base_bytes,
                                 const SourceMatch& source, const EncodeOptions& options, CodecScratch& scratch,
                                 MutableByteSpan recon, int64_t* saved) {
  const uint64_t rows = plan.length / 4 / columns;
  if (rows < kRowColumnSampleRows) return BandVerdict::kNoBand;
  const RowColumnBand where = BandOf(rows, columns);
  const uint64_t skip = where.skip;
  PlannedChunk band = plan;
  band.offset += skip;
  band.length = where.length;
  if (band.base_offset) *band.base_offset += skip;
  // Both write their reconstruction over the band's; the whole chunk's
  // encode that follows writes it again.
  LossyResult plain;
  const ByteSpan band_base = base_bytes.empty() ? ByteSpan() : base_bytes.subspan(skip, band.length);
  if (!EncodeLossy(file, band, band_base, source, nullptr, options, options.lossy_kernels, scratch, recon.data(),
                   &plain)
           .ok() ||
      !plain.used || plain.params.mode != 2 ||
      static_cast<double>(plain.stored.size()) * 8 < kRowColumnFromBits * static_cast<double>(band.length / 4))
    return BandVerdict::kPlain;
  LossyResult probe;
  bool ok = false;
  if (!EncodeWithRowColumnBase(file, band, columns, source, options, scratch, recon, &probe, &ok).ok() || !ok)
    return BandVerdict::kPlain;
  if (!(static_cast<double>(probe.stored.size()) < kRowColumnSampleGain * static_cast<double>(plain.stored.size())))
    return BandVerdict::kPlain;
  *saved = static_cast<int64_t>((plain.stored.size() - probe.stored.size()) * (rows / (where.length / 4 / columns)));
  return BandVerdict::kRowColumn;
}

// After the plain stream `result` (a delta frame's, or a key frame's chunk
// of too few rows for a band): the candidate, when the band says so (a
// delta frame's chunk of enough rows), encoded whole and kept when smaller
// (else `result` and its reconstruction in `recon` stay). In a delta frame
// the plain stream comes first: against a near version most second
// moments cost under kRowColumnFromBits, and the band is not encoded for
// them. *tried: whether the whole candidate was encoded.
Status TryRowColumnBase(ByteSpan file, const PlannedChunk& plan, uint64_t columns, ByteSpan base_bytes,
                        const SourceMatch& source, const EncodeOptions& options, CodecScratch& scratch,
                        MutableByteSpan recon, LossyResult* result, bool* tried) {
  if (!result->used || result->params.mode != 2 ||
      static_cast<double>(result->stored.size()) * 8 < kRowColumnFromBits * static_cast<double>(plan.length / 4))
    return Status::Ok();
  // The plain stream's reconstruction, put back unless the candidate wins
  // (the band's encodes and the candidate's write over it). Only the band's
  // part while the band decides (it writes no other): the whole chunk's
  // copies, twice per second moment, were a third of this candidate's time
  // in a delta frame, where the band almost always says no.
  MutableByteSpan range = recon.subspan(plan.offset, plan.length);
  std::byte* kept = scratch.step_inputs[2].Reserve(plan.length);
  const uint64_t rows = plan.length / 4 / columns;
  if (rows >= kRowColumnSampleRows) {
    const RowColumnBand where = BandOf(rows, columns);
    const MutableByteSpan band = range.subspan(where.skip, where.length);
    std::copy(band.begin(), band.end(), kept);
    int64_t saved = 0;
    const BandVerdict verdict =
        RowColumnBandVerdict(file, plan, columns, base_bytes, source, options, scratch, recon, &saved);
    std::copy(kept, kept + band.size(), band.begin());
    if (verdict != BandVerdict::kRowColumn) return Status::Ok();
  }
  std::copy(range.begin(), range.end(), kept);
  *tried = true;
  LossyResult candidate;
  bool ok = false;
  RETURN_IF_ERROR(EncodeWithRowColumnBase(file, plan, columns, source, options, scratch, recon, &candidate, &ok));
  if (ok && candidate.stored.size() < result->stored.size()) {
    *result = std::move(candidate);
  } else {
    std::copy(kept, kept + plan.length, range.begin());
  }
  return Status::Ok();
}

}  // namespace

Status EncodeLossyChunks(const LossyPassesInput& in, MutableByteSpan recon, std::vector<LossyResult>* results,
                         std::vector<double>* err2_out, std::vector<double>* ref2_out) {
  const ByteSpan file = in.file;
  const Layout& layout = in.layout;
  const std::vector<PlannedChunk>& plan = in.plan;
  const BaseRef* base = in.base;
  const bool have_base = base != nullptr && base->reader != nullptr;
  const std::vector<std::optional<uint64_t>>& base_match = in.base_match;
  const EncodeOptions& options = in.options;
  const unsigned threads = in.threads;
  EncodeStageRecorder& stages = in.stages;
  std::vector<LossyResult>& lossy_results = *results;
  std::vector<double>& tensor_err2 = *err2_out;
  std::vector<double>& tensor_ref2 = *ref2_out;
  auto parallel = [&](size_t count, unsigned max_threads, const std::function<void(size_t, CodecScratch&)>& body) {
    in.parallel(count, max_threads, body);
  };
  // The base's reconstruction of a chunk, timed.
  auto read_base_bytes = [&](const PlannedChunk& p, CodecScratch& scratch) {
    StageTimer timer;
    const ByteSpan bytes = ReadBaseBytes(p, base, scratch);
    stages.Add(EncodeStage::kBaseRead, timer.Seconds(), !bytes.empty());
    return bytes;
  };
  lossy_results.resize(plan.size());
  std::vector<Status> statuses(plan.size());
  // Weights that an optimizer's state in this file may predict wait for
  // a second pass: their prediction reads that state's reconstruction.
  const bool predict = have_base && options.step_prediction;
  const StepStates states = predict || options.momentum_step_space ? FindStepStates(layout) : StepStates{};
  // Second moments' rows for their row-column bases (TryRowColumnBase).
  const std::vector<std::optional<uint64_t>> tensor_offsets = SingleSegmentOffsets(layout);
  // Low-precision weights whose fp32 master copy is in this file wait for
  // the master's reconstruction: a last pass (master_copies.h).
  // (A tensor's chunks share its budget: a tensor is eligible when its
  // chunks are lossy under an L2 budget, and then all of them are copies.)
  std::vector<bool> copy(plan.size(), false);
  std::vector<int32_t> master_of;
  if (options.step_prediction) {
    std::vector<bool> eligible(layout.tensors.size(), false);
    for (const PlannedChunk& p : plan)
      if (p.lossy() && p.budget.rel_l2 > 0 && p.tensor >= 0) eligible[p.tensor] = true;
    const std::vector<bool> excluded =
        states.is_state.empty() ? std::vector<bool>(layout.tensors.size(), false) : states.is_state;
    master_of = FindMasterCopies(layout, file, eligible, excluded);
    for (size_t i = 0; i < plan.size(); ++i) copy[i] = plan[i].tensor >= 0 && master_of[plan[i].tensor] >= 0;
  }
  // f32 weights that an earlier file's blob holds too: coded in the first
  // pass against its reconstruction (ref_copies.h).
  // (The writer sets ref_offset only on lossy f32 weights under an L2
  // budget: never on a bf16/f16 copy of a master.)
  auto ref_copy = [&](size_t i) { return in.ref != nullptr && plan[i].ref_offset.has_value(); };
  std::vector<bool> deferred(plan.size());
  for (size_t i = 0; i < plan.size(); ++i)
    deferred[i] = predict && !states.states.empty() && plan[i].lossy() && plan[i].budget.rel_l2 > 0 &&
                  plan[i].base_offset.has_value() && !states.is_state[plan[i].tensor] && !copy[i] && !ref_copy(i);
  // First moments coded in step space wait for their second moment's
  // reconstruction (a pass between the state and the weights).
  const std::vector<std::optional<uint64_t>> space_v =
      options.momentum_step_space ? StepSpaceSources(layout, states, plan) : std::vector<std::optional<uint64_t>>();
  auto in_step_space = [&](size_t i) { return !space_v.empty() && space_v[i].has_value() && !ref_copy(i); };
  const unsigned lossy_threads = options.lossy_kernels != nullptr ? 1u : threads;
  auto chunk_data = [&](size_t i) { return file.subspan(plan[i].offset, plan[i].length); };
  // A lossy chunk coded as it is; a first moment against its decayed base
  // (scale * base), except an unchanged range (a frozen layer), which is
  // left to the plain delta.
  auto encode_as_is = [&](size_t i, ByteSpan base_bytes, const SourceMatch& source, CodecScratch& scratch) {
    std::optional<ChunkPrediction> scaled;
    if (predict && states.is_momentum.size() > 0 && states.is_momentum[plan[i].tensor] &&
        plan[i].budget.rel_l2 > 0 && !base_bytes.empty() && !source.unchanged) {
      StageTimer timer;
      scaled = PredictScaledBase(*lossy::ElementTypeOf(plan[i].dtype), chunk_data(i), base_bytes, scratch);
      stages.Add(EncodeStage::kPrediction, timer.Seconds());
    }
    // A key frame's row-column candidate, decided on a band of rows: then
    // only the winner is encoded whole. So is a delta frame's whose base
    // chunk was coded against its row-column base (it costs its band
    // encodes when the band says no; see BaseUsedRowColumn).
    const std::optional<uint64_t> columns = RowColumnColumns(plan[i], layout, tensor_offsets);
    BandVerdict verdict = BandVerdict::kNoBand;
    if (columns && (base_bytes.empty() || BaseUsedRowColumn(base, plan[i]))) {
      StageTimer timer;
      int64_t saved = 0;
      verdict = RowColumnBandVerdict(file, plan[i], *columns, base_bytes, source, options, scratch, recon, &saved);
      bool kept = false;
      if (verdict == BandVerdict::kRowColumn) {
        statuses[i] = EncodeWithRowColumnBase(file, plan[i], *columns, source, options, scratch, recon,
                                              &lossy_results[i], &kept);
        if (!statuses[i].ok()) return;
      }
      stages.Add(EncodeStage::kRowColumn, timer.Seconds(), verdict != BandVerdict::kNoBand, kept, kept ? saved : 0);
      if (kept) return;
    }
    StageTimer lossy_timer;
    statuses[i] = EncodeLossy(file, plan[i], base_bytes, source, scaled ? &*scaled : nullptr, options,
                              options.lossy_kernels, scratch, recon.data(), &lossy_results[i]);
    stages.Add(EncodeStage::kLossy, lossy_timer.Seconds());
    if (statuses[i].ok() && columns && verdict == BandVerdict::kNoBand) {
      StageTimer timer;
      const size_t before = lossy_results[i].stored.size();
      bool tried = false;
      statuses[i] = TryRowColumnBase(file, plan[i], *columns, base_bytes, source, options, scratch, recon,
                                     &lossy_results[i], &tried);
      const bool kept = lossy_results[i].params.row_column.has_value();
      stages.Add(EncodeStage::kRowColumn, timer.Seconds(), tried, kept,
                 static_cast<int64_t>(before) - static_cast<int64_t>(lossy_results[i].stored.size()));
    }
  };
  // A ref copy: a delta frame against the ref's reconstruction of its
  // values (or, when smaller, the plain delta against the base); coded as
  // it is when the ref cannot be read or its range covers a predicted chunk
  // there (a reader refuses that: refs do not chain).
  auto encode_ref_copy = [&](size_t i, ByteSpan base_bytes, const SourceMatch& source, CodecScratch& scratch) {
    StageTimer timer;
    MutableByteSpan values(scratch.step_inputs[0].Reserve(plan[i].length), plan[i].length);
    if (in.ref->reader->CoversPredicted(*plan[i].ref_offset, plan[i].length) ||
        !in.ref->reader->ReadAt(*plan[i].ref_offset, values).ok()) {
      encode_as_is(i, base_bytes, source, scratch);
      return;
    }
    ChunkPrediction prediction = PredictCopy(lossy::ElementType::kF32, chunk_data(i), base_bytes, values,
                                             *plan[i].ref_offset, scratch);
    prediction.step.ref = true;
    stages.Add(EncodeStage::kPrediction, timer.Seconds());
    StageTimer lossy_timer;
    statuses[i] = EncodeLossy(file, plan[i], base_bytes, source, &prediction, options, options.lossy_kernels, scratch,
                              recon.data(), &lossy_results[i]);
    stages.Add(EncodeStage::kLossy, lossy_timer.Seconds());
  };
  // A caller's kernel backend is one object: never used by two threads.
  parallel(plan.size(), lossy_threads, [&](size_t i, CodecScratch& scratch) {
    // Every chunk passes here first: its part of the reconstruction is
    // mapped by the thread that encodes it (scratch.h, PopulateForWrite).
    ScratchBuffer::PopulateForWrite(recon.subspan(plan[i].offset, plan[i].length));
    if (deferred[i] || in_step_space(i) || copy[i]) return;
    if (plan[i].lossy()) {
      const ByteSpan base_bytes = read_base_bytes(plan[i], scratch);
      const SourceMatch source = MatchSource(plan[i], base, chunk_data(i), base_bytes);
      if (ref_copy(i)) {
        encode_ref_copy(i, base_bytes, source, scratch);
        return;
      }
      encode_as_is(i, base_bytes, source, scratch);
    } else {
      ByteSpan data = file.subspan(plan[i].offset, plan[i].length);
      std::copy(data.begin(), data.end(), recon.begin() + static_cast<ptrdiff_t>(plan[i].offset));
    }
  });
  std::vector<size_t> moments;
  for (size_t i = 0; i < plan.size(); ++i)
    if (in_step_space(i)) moments.push_back(i);
  parallel(moments.size(), lossy_threads, [&](size_t k, CodecScratch& scratch) {
    const size_t i = moments[k];
    const ByteSpan base_bytes = read_base_bytes(plan[i], scratch);
    const SourceMatch source = MatchSource(plan[i], base, chunk_data(i), base_bytes);
    const uint64_t length = plan[i].length;
    std::byte* scales = scratch.step_inputs[0].Reserve(length);
    std::byte* x = scratch.step_inputs[1].Reserve(length);
    const ByteSpan v = ByteSpan(recon).subspan(*space_v[i], length);
    if (!StepScales(v, kStepSpaceEps, scales) || !DivideByScales(chunk_data(i), scales, x)) {
      // A negative or non-finite v or m: coded as m, as in the first pass.
      encode_as_is(i, base_bytes, source, scratch);
      return;
    }
    StepSpaceInput space{ByteSpan(x, length), {}, scales, StepSpace{*space_v[i], kStepSpaceEps}};
    // Its budget on the step, when the policy gives one.
    PlannedChunk in_space = plan[i];
    if (in_space.budget.step_rel_l2 > 0) in_space.budget.rel_l2 = in_space.budget.step_rel_l2;
    std::optional<ChunkPrediction> scaled;
    StageTimer prediction_timer;
    if (!base_bytes.empty()) {
      std::byte* base_x = scratch.step_inputs[2].Reserve(length);
      DivideByScales(base_bytes, scales, base_x);  // any values: the codec keeps non-finite ones
      space.base_x = ByteSpan(base_x, length);
      if (predict && !source.unchanged && options.momentum_dither > 0)
        space.dithered = PredictDithered(space.x, space.base_x, options.momentum_dither, source.digest, scratch);
      if (space.dithered) {
        scaled = space.dithered->prediction;
        in_space.budget.rel_l2 = options.momentum_dither * kDitherBudgetSlack;
      } else if (predict && !source.unchanged) {
        scaled = PredictScaledBase(lossy::ElementType::kF32, space.x, space.base_x, scratch);
      }
      stages.Add(EncodeStage::kPrediction, prediction_timer.Seconds());
    }
    StageTimer lossy_timer;
    statuses[i] = EncodeLossy(file, in_space, base_bytes, source, scaled ? &*scaled : nullptr, options,
                              options.lossy_kernels, scratch, recon.data(), &lossy_results[i], &space);
    stages.Add(EncodeStage::kLossy, lossy_timer.Seconds());
    if (statuses[i].ok() && predict && !space.dithered) {
      StageTimer timer;
      const size_t before = lossy_results[i].stored.size();
      bool tried = false;
      statuses[i] = TryLowRank(file, in_space, layout, states, base_bytes, source, options, scratch, recon,
                               &lossy_results[i], space, &tried);
      const bool kept = lossy_results[i].params.low_rank.has_value();
      stages.Add(EncodeStage::kLowRank, timer.Seconds(), tried, kept,
                 static_cast<int64_t>(before) - static_cast<int64_t>(lossy_results[i].stored.size()));
    }
  });
  std::vector<size_t> second;
  for (size_t i = 0; i < plan.size(); ++i)
    if (deferred[i]) second.push_back(i);
  parallel(second.size(), lossy_threads, [&](size_t k, CodecScratch& scratch) {
    const size_t i = second[k];
    ByteSpan base_bytes = read_base_bytes(plan[i], scratch);
    const SourceMatch source = MatchSource(plan[i], base, chunk_data(i), base_bytes);
    std::optional<ChunkPrediction> prediction;
    if (!base_bytes.empty() && !source.unchanged) {
      StageTimer timer;
      const std::vector<StepCandidate> candidates = StepCandidates(layout, states, base_match, plan[i]);
      auto read_base = [&](uint64_t offset, MutableByteSpan buffer, std::shared_ptr<const void>* hold) {
        return base->reader->ViewAt(offset, buffer, hold);
      };
      prediction = PredictChunk(*lossy::ElementTypeOf(plan[i].dtype), chunk_data(i), base_bytes, recon, candidates,
                                read_base, scratch);
      stages.Add(EncodeStage::kPrediction, timer.Seconds());
    }
    StageTimer lossy_timer;
    statuses[i] = EncodeLossy(file, plan[i], base_bytes, source, prediction ? &*prediction : nullptr, options,
                              options.lossy_kernels, scratch, recon.data(), &lossy_results[i]);
    stages.Add(EncodeStage::kLossy, lossy_timer.Seconds());
  });
  std::vector<size_t> copies;
  for (size_t i = 0; i < plan.size(); ++i)
    if (copy[i]) copies.push_back(i);
  parallel(copies.size(), lossy_threads, [&](size_t k, CodecScratch& scratch) {
    const size_t i = copies[k];
    const ByteSpan base_bytes = read_base_bytes(plan[i], scratch);
    const SourceMatch source = MatchSource(plan[i], base, chunk_data(i), base_bytes);
    const int32_t tensor = plan[i].tensor, master = master_of[tensor];
    const uint64_t element_size = DTypeSize(plan[i].dtype);
    const uint64_t first = (plan[i].offset - *tensor_offsets[tensor]) / element_size;
    const uint64_t master_offset = *tensor_offsets[master] + first * 4;
    const ByteSpan master_recon = ByteSpan(recon).subspan(master_offset, plan[i].length / element_size * 4);
    StageTimer timer;
    const ChunkPrediction prediction = PredictCopy(*lossy::ElementTypeOf(plan[i].dtype), chunk_data(i), base_bytes,
                                                   master_recon, master_offset, scratch);
    stages.Add(EncodeStage::kPrediction, timer.Seconds());
    StageTimer lossy_timer;
    statuses[i] = EncodeLossy(file, plan[i], base_bytes, source, &prediction, options, options.lossy_kernels, scratch,
                              recon.data(), &lossy_results[i]);
    stages.Add(EncodeStage::kLossy, lossy_timer.Seconds());
  });
  for (size_t i = 0; i < plan.size(); ++i) {
    RETURN_IF_ERROR(statuses[i].WithContext(fmt::format("encode: lossy chunk {} at offset {}", i, plan[i].offset)));
    if (!lossy_results[i].used) continue;
    tensor_err2[plan[i].tensor] += lossy_results[i].params.err2_sum;
    tensor_ref2[plan[i].tensor] += lossy_results[i].params.ref2_sum;
  }
  return Status::Ok();
}

}  // namespace ckptfs
