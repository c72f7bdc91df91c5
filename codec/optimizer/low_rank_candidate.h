// The encoder's side of a low-rank term (codec/tensor/lossy/low_rank.h;
// FORMAT.md "Low-rank term"): for a first moment coded in step space, the
// prediction scale * base plus rank-r factors of what that prediction
// leaves, the rank chosen by a model of the stream's cost. The writer
// encodes the chunk both ways and keeps the smaller.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/optimizer/step_sources.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

// The columns of a chunk of `tensor` that starts at element `first` and
// holds `n` elements when it is a block of whole rows (the tensor read as
// shape[0] x the product of the other dimensions) large enough for factors
// to pay (at least 8 rows and 8 columns); else nullopt.
std::optional<uint64_t> ChunkColumns(const TensorInfo& tensor, uint64_t first, uint64_t n);

struct LowRankCandidate {
  ChunkPrediction prediction;  // scale * base_x + the term, in scratch.prediction
  LowRankTerm term;
  std::vector<std::byte> block;  // the factor block (term.block_bytes)
};

// x and base_x: the chunk and its base in step space (f32, n elements, n a
// multiple of `columns`); budget_rel_l2: the budget the chunk is coded to.
// nullopt when a value is not finite, no component pays by the model, or the
// base is missing. Uses scratch.prediction.
std::optional<LowRankCandidate> PredictLowRank(ByteSpan x, ByteSpan base_x, uint64_t columns, double budget_rel_l2,
                                               CodecScratch& scratch);

}  // namespace ckptfs
