// The per-chunk configuration search: from the residual histogram (integer
// counts, identical on both backends) it chooses the prune threshold, the
// outlier threshold and the symbol width b, and fits the codebook, so that
// the *estimated* encoded size is minimal subject to the *estimated* error
// fitting a target. The encoder then measures the real error and, on a miss,
// searches again with a tighter target (see LOSSY.md, "Search").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "codec/tensor/lossy/element_ops.h"

namespace ckptfs::lossy {

struct SearchTarget {
  double max_error_sq;  // estimated sum of squared errors must stay below (may be +inf)
  double max_abs;       // estimated max |error| must stay below (may be +inf)
};

struct SearchResult {
  QuantizeTable table;  // thresholds, bits and codebook, bounds filled in
  double est_error_sq = 0.0;
  double est_bytes = 0.0;
  uint64_t est_exact = 0;  // finite outliers + non-finite elements
};

// Searches the configuration of a chunk of `n` elements of `element_size`
// bytes whose residual histogram is `counts` (kHistogramBins entries).
// Returns nothing when no lossy configuration is estimated to fit.
// Cost: up to 4 Lloyd-Max candidates (prune shares, no outliers), each a
// binary search over b of at most 4 codebook fits, and for each of 4
// outlier fractions and 2 dead zones a bisection of 11 uniform codebooks,
// on at most ~2 * 32 * (octaves) points.
// Thread safety: pure function.
std::optional<SearchResult> SearchConfig(std::span<const uint32_t> counts, uint64_t n, uint32_t element_size,
                                         const SearchTarget& target);

// Every finite element pruned (non-finite ones exact): the configuration of
// a delta frame that keeps its base, with the pruning error as its estimate.
// Nothing when a pruned magnitude could exceed max_abs.
std::optional<SearchResult> AllPrunedConfig(std::span<const uint32_t> counts, double max_abs);

// The grid of a subtractively dithered chunk (the container's dither.h):
// levels k * step for k = -K..-1, 1..K, |r| < step / 2 pruned (level 0),
// nearest level otherwise, and beyond (K + 1/2) * step exact; K the
// smallest that covers the largest finite residual in `counts`, at most
// 127. Nothing when step is not a positive finite float whose grid fits.
std::optional<SearchResult> UniformGridConfig(std::span<const uint32_t> counts, float step);

// Estimated sum of squares of the finite values counted in `counts` (from
// the bin centres; within a few percent).
double EstimateEnergy(std::span<const uint32_t> counts);

// Fills table.bounds from table.levels (midpoints in float, then +Inf).
void FillBounds(QuantizeTable* table);

}  // namespace ckptfs::lossy
