// Per-tensor error of the lossy chunks of a blob, from the chunk parameters
// (nothing is decoded): for inspect, the error xattr and the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/container/blob.h"

namespace ckptfs {

struct TensorLossyReport {
  int32_t tensor = -1;        // index into BlobReader::tensors()
  double rel_l2 = 0.0;        // sqrt(sum err^2 / sum w^2) over the tensor's finite elements
  double max_abs = 0.0;       // max |w_hat - w|
  uint8_t max_bits = 0;       // widest symbol width of its chunks
  double max_rel = 0.0;       // log-mode chunks: max |w_hat - w| / |w| (0 when none is in log mode)
  uint32_t log_chunks = 0;    // chunks in log mode (per-element relative bound)
  uint32_t lossy_chunks = 0;
  uint32_t predicted_chunks = 0;  // delta frames against a step prediction
  uint32_t copy_chunks = 0;       // ... of them, copies of a master in the same file
  uint32_t ref_copy_chunks = 0;   // ... of them, copies of values in the blob's ref
  uint32_t step_space_chunks = 0; // coded in step space (their errors are of m / s)
  uint32_t low_rank_chunks = 0;   // whose prediction has a low-rank term
  uint32_t max_low_rank = 0;      // the largest rank of those terms
  uint32_t dithered_chunks = 0;   // whose prediction has a dither
  uint32_t row_column_chunks = 0; // log mode against a row-column base
  uint32_t trellis_chunks = 0;    // in trellis mode (LOSSY.md section 11)
  uint32_t chunks = 0;
  uint64_t pruned = 0, quantized = 0, exact = 0;
  // The budget the tensor was encoded to, sqrt(sum b_c^2 ref2_c / sum ref2_c)
  // over its lossy chunks c (each chunk keeps err2_c <= b_c^2 ref2_c, so this
  // bounds rel_l2); below the configured budget where a budget schedule
  // tightened it. 0 when the blob predates recording it.
  double budget_rel_l2 = 0.0;
  // The measured update ||w - base|| / ||w|| aggregated the same way over the
  // chunks where the schedule measured one; 0 when none did.
  double update_rel = 0.0;
};

// One report per tensor that has at least one kLossy chunk, in tensor order.
// Chunks of other codecs count as exact (their error is 0).
// Thread safety: reads `reader` only.
Result<std::vector<TensorLossyReport>> LossyTensorReports(const BlobReader& reader);

// The largest per-tensor rel_l2 of the blob, or nullopt if no chunk is lossy.
Result<std::optional<double>> MaxLossyRelL2(const BlobReader& reader);

}  // namespace ckptfs
