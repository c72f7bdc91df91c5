#include "codec/container/lossy_report.h"

#include <algorithm>
#include <cmath>

#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {

Result<std::vector<TensorLossyReport>> LossyTensorReports(const BlobReader& reader) {
  const auto& tensors = reader.tensors();
  std::vector<TensorLossyReport> all(tensors.size());
  std::vector<double> err2(tensors.size()), ref2(tensors.size());
  std::vector<double> budget2(tensors.size()), update2(tensors.size()), update_ref2(tensors.size());
  for (uint32_t c = 0; c < reader.chunks().size(); ++c) {
    const ChunkInfo& chunk = reader.chunks()[c];
    if (chunk.segment < 0) continue;
    const int32_t t = reader.segments()[chunk.segment].tensor;
    if (t < 0) continue;
    TensorLossyReport& r = all[t];
    ++r.chunks;
    if (chunk.codec != ChunkCodec::kLossy) continue;
    ASSIGN_OR_RETURN(LossyChunkParams p, LossyChunkParams::DecodeFrom(reader.chunk_params(c)));
    ++r.lossy_chunks;
    if (p.predicted()) ++r.predicted_chunks;
    if (p.ref_copy()) {
      ++r.ref_copy_chunks;
    } else if (p.copy()) {
      ++r.copy_chunks;
    }
    if (p.step_space) ++r.step_space_chunks;
    if (p.dither) ++r.dithered_chunks;
    if (p.row_column) ++r.row_column_chunks;
    if (p.mode == 3) ++r.trellis_chunks;
    if (p.low_rank) {
      ++r.low_rank_chunks;
      r.max_low_rank = std::max(r.max_low_rank, p.low_rank->rank);
    }
    err2[t] += p.err2_sum;
    ref2[t] += p.ref2_sum;
    budget2[t] += p.budget_rel_l2 * p.budget_rel_l2 * p.ref2_sum;
    if (p.update_rel > 0) {
      update2[t] += static_cast<double>(p.update_rel) * p.update_rel * p.ref2_sum;
      update_ref2[t] += p.ref2_sum;
    }
    r.max_abs = std::max(r.max_abs, p.max_abs);
    r.max_bits = std::max(r.max_bits, p.bits);
    if (p.mode == 2) {
      ++r.log_chunks;
      r.max_rel = std::max(r.max_rel, p.max_rel);
    }
    r.pruned += p.pruned;
    r.quantized += p.quantized;
    r.exact += p.exact;
  }
  std::vector<TensorLossyReport> out;
  for (size_t t = 0; t < all.size(); ++t) {
    if (all[t].lossy_chunks == 0) continue;
    all[t].tensor = static_cast<int32_t>(t);
    all[t].rel_l2 = ref2[t] > 0 ? std::sqrt(err2[t] / ref2[t]) : (err2[t] > 0 ? 1.0 : 0.0);
    all[t].budget_rel_l2 = ref2[t] > 0 ? std::sqrt(budget2[t] / ref2[t]) : 0.0;
    all[t].update_rel = update_ref2[t] > 0 ? std::sqrt(update2[t] / update_ref2[t]) : 0.0;
    out.push_back(all[t]);
  }
  return out;
}

Result<std::optional<double>> MaxLossyRelL2(const BlobReader& reader) {
  ASSIGN_OR_RETURN(std::vector<TensorLossyReport> reports, LossyTensorReports(reader));
  if (reports.empty()) return std::optional<double>();
  double worst = 0;
  for (const TensorLossyReport& r : reports) worst = std::max(worst, r.rel_l2);
  return std::optional<double>(worst);
}

}  // namespace ckptfs
