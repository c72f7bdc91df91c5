// Codebook fitting on the host (shared by both kernel backends): a 1-D
// Lloyd-Max / k-means fit of up to 2^b - 1 levels to a weighted set of points
// (the centres of the residual histogram's bins), seeded from quantiles, with
// a fixed iteration count so the result is deterministic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ckptfs::lossy {

// One histogram bin seen as a weighted point.
struct WeightedPoint {
  WeightedPoint() = default;
  WeightedPoint(double value, double weight, double half_width);
  double value = 0.0;       // bin centre
  double weight = 0.0;      // element count
  double half_width = 0.0;  // the bin spans value +- half_width, its elements spread evenly
  // Derived when the point is made: the bin's edges value -+ half_width,
  // its elements per unit of value (weight / (hi - lo), when hi > lo) and
  // that density times (hi - lo). A search fits dozens of codebooks to the
  // same points; each fit's estimate needs these, and the division was a
  // large part of it.
  double lo = 0.0, hi = 0.0, density = 0.0, whole = 0.0;
};

struct Codebook {
  std::vector<float> levels;         // strictly ascending, finite
  double est_error_sq = 0.0;         // estimated sum of squared quantization errors
  double est_max_abs = 0.0;          // estimated max |error| of a quantized element
  std::vector<double> cell_weights;  // estimated element count per level
};

// Buffers a caller fitting many codebooks passes to every fit, so that a
// fit allocates nothing once they have grown.
struct CodebookWork {
  std::vector<double> levels, mids, sum_w, sum_wv, finals;
};

// Fits at most `max_levels` levels to `points` (sorted by value ascending)
// with `iterations` Lloyd steps, and estimates its error and level usage.
// REQUIRES: points sorted ascending by value, max_levels >= 1.
// Thread safety: pure function.
Codebook FitCodebook(std::span<const WeightedPoint> points, uint32_t max_levels, uint32_t iterations);

// The seeding measure of a point, count^(1/3) * width^(2/3) (0 for an empty
// or zero-width point). A caller fitting many codebooks to the same points
// computes it once (a cube root per point) and passes it to the overload.
double SeedMass(const WeightedPoint& p);
// The same fit with seed_mass[i] = SeedMass(points[i]) precomputed.
// REQUIRES: seed_mass.size() == points.size().
Codebook FitCodebook(std::span<const WeightedPoint> points, std::span<const double> seed_mass, uint32_t max_levels,
                     uint32_t iterations);
// The same fit into *out (its vectors reused), with `work`'s buffers.
void FitCodebook(std::span<const WeightedPoint> points, std::span<const double> seed_mass, uint32_t max_levels,
                 uint32_t iterations, CodebookWork* work, Codebook* out);

// Entropy-coded uniform quantization: levels at the nonzero multiples of
// `step` that the points reach (at most max_levels, dropping the farthest),
// each moved to the centroid of its cell, with the same estimates. With
// rANS symbols, for a given error it needs fewer bits than a Lloyd-Max fit
// of 2^b - 1 levels, which minimises the error of a fixed level count.
// REQUIRES: points sorted ascending by value. Thread safety: pure function.
Codebook UniformCodebook(std::span<const WeightedPoint> points, double step, uint32_t max_levels);
// The same into *out (its vectors reused), with `work`'s buffers.
void UniformCodebook(std::span<const WeightedPoint> points, double step, uint32_t max_levels, CodebookWork* work,
                     Codebook* out);

}  // namespace ckptfs::lossy
