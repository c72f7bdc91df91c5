// A low-rank term of a chunk's prediction (FORMAT.md "Low-rank term"). An
// optimizer's first moment is an average of recent gradients, and the
// gradient of a linear layer concentrates on a few directions: after the
// prediction from the previous version, what is left of a matrix's exp_avg
// (in step space) holds most of its energy in its top few singular vectors
// (docs/eval.md: rank 2-4 leave 0.06-0.28 of it on the eval's workloads).
// Those are stored as factors, 8 bits per element with one scale per
// factor, and the stream codes only what they leave.
//
// The chunk is a block of whole rows of its tensor, read as a rows x columns
// matrix in row-major order. The factor block, at the front of the chunk's
// stored bytes, is
//
//   scale_a[rank] f32, scale_b[rank] f32, a[rank][rows] i8, b[rank][columns] i8
//
// and element (i, j) of the term is sum over k of
// (scale_a[k] * a[k][i]) * (scale_b[k] * b[k][j]), in binary64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "codec/common/bytes.h"

namespace ckptfs::lossy {

inline constexpr uint32_t kMaxLowRank = 8;

// Bytes of a factor block; 0 when the geometry is not valid (a zero or
// out-of-range rank, a zero dimension, or a size that does not fit 64 bits).
uint64_t LowRankBlockSize(uint64_t rows, uint64_t columns, uint32_t rank);

// p[i * columns + j] = f32(double(p) + term(i, j)) for the f32 prediction `p`
// (rows * columns little-endian elements), in place; an element whose sum is
// not finite keeps its value. `block` holds LowRankBlockSize bytes. The
// arithmetic is binary64, round to nearest, no fused operations, the terms
// summed in order k = 0, 1, ...: writer and reader compute the same bits.
// false when a scale in the block is not finite.
bool AddLowRank(ByteSpan block, uint64_t rows, uint64_t columns, uint32_t rank, MutableByteSpan p);

// The encoder's factors for the residual `r` (rows x columns, row-major,
// finite), fitted one component at a time by power iteration on what the
// previous (quantized) components leave, at most `max_rank` of them; `r` is
// left holding what the kept components leave (no copy of a large chunk).
// energy_left[k] is ||r - term of the first k components||^2 (index 0: the
// residual's own energy). Deterministic: a fixed start vector.
struct LowRankFit {
  uint32_t rank = 0;
  std::vector<float> scale_a, scale_b;  // per component
  std::vector<int8_t> a, b;             // component-major: a[k * rows + i], b[k * columns + j]
  std::vector<double> energy_left;      // rank + 1 entries
};
LowRankFit FitLowRank(double* r, uint64_t rows, uint64_t columns, uint32_t max_rank);

// The factor block of the first `rank` components of `fit` (rank <= fit.rank).
std::vector<std::byte> TruncateLowRank(const LowRankFit& fit, uint64_t rows, uint64_t columns, uint32_t rank);

}  // namespace ckptfs::lossy
