// Compiled with -ffp-contract=off: the fitted levels decide the encoded bytes
// and must not depend on the compiler's choice to fuse multiply-adds.
#include "codec/tensor/lossy/codebook.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ckptfs::lossy {
namespace {

// One Lloyd sweep's sums per level: sum_w[k] and sum_wv[k] over the points
// nearest to level k (by the midpoints between levels). A level's points are
// consecutive, so each sum runs in a register from 0.0 and is stored once:
// the same additions in the same order as `sum_w[k] += w` on a zeroed
// array, without a store-to-load round trip per point.
void CellSums(std::span<const WeightedPoint> points, const std::vector<double>& levels, std::vector<double>& mids,
              std::vector<double>& sum_w, std::vector<double>& sum_wv) {
  std::fill(sum_w.begin(), sum_w.end(), 0.0);
  std::fill(sum_wv.begin(), sum_wv.end(), 0.0);
  if (levels.empty()) return;
  mids.resize(levels.size());
  for (size_t k = 0; k + 1 < levels.size(); ++k) mids[k] = (levels[k] + levels[k + 1]) * 0.5;
  mids[levels.size() - 1] = std::numeric_limits<double>::infinity();
  size_t k = 0;
  double w = 0.0, wv = 0.0;
  for (const WeightedPoint& p : points) {
    const double v = p.value;
    if (v > mids[k]) {
      sum_w[k] = w, sum_wv[k] = wv;
      w = 0.0, wv = 0.0;
      do ++k;
      while (v > mids[k]);
    }
    w += p.weight;
    wv += p.weight * v;
  }
  sum_w[k] = w, sum_wv[k] = wv;
}

void ClearCodebook(Codebook* out) {
  out->levels.clear();
  out->cell_weights.clear();
  out->est_error_sq = 0.0;
  out->est_max_abs = 0.0;
}

// Rounds `levels` to float (ascending, unique, finite) into out->levels and
// estimates the error, max error and cell weights of nearest-level coding.
// (work->mids and work->finals are its own; `levels` may be work->levels.)
void FinishCodebook(std::span<const WeightedPoint> points, std::span<const double> levels, CodebookWork* work,
                    Codebook* out) {
  Codebook& book = *out;
  ClearCodebook(&book);
  // Round to float, keep strictly ascending unique finite levels.
  for (double l : levels) {
    float f = static_cast<float>(l);
    if (!std::isfinite(f)) continue;
    if (book.levels.empty() || f > book.levels.back()) book.levels.push_back(f);
  }
  if (book.levels.empty()) return;

  std::vector<double>& final_levels = work->finals;
  final_levels.assign(book.levels.begin(), book.levels.end());
  const size_t count = final_levels.size();
  std::vector<double>& mids = work->mids;
  mids.resize(count);
  for (size_t k = 0; k + 1 < count; ++k) mids[k] = (final_levels[k] + final_levels[k + 1]) * 0.5;
  mids[count - 1] = std::numeric_limits<double>::infinity();
  std::vector<double>& cell_weight = book.cell_weights;
  cell_weight.assign(count, 0.0);
  // cell_weight[cell] is held in a register while the points add to it
  // (they reach the cells in ascending order, one after the other): the
  // same additions in the same order, without a store-to-load round trip
  // per point; a point that goes back to an earlier cell reloads it.
  size_t cell = 0;
  double cell_sum = 0.0;
  auto add_to_cell = [&](size_t j, double w) {
    if (j != cell) {
      cell_weight[cell] = cell_sum;
      cell = j;
      cell_sum = cell_weight[j];
    }
    cell_sum += w;
  };
  double err = 0.0, max_abs = 0.0;
  // Each point is its bin, [value - half_width, value + half_width], with
  // its elements spread evenly; the part in each level's cell (up to the
  // midpoints) adds its exact squared error and its share of the weight.
  // Within one cell this is weight * (d^2 + width^2 / 12); a bin that
  // several cells share (fine steps, wide bins far from zero) would
  // otherwise count the whole bin at one level, overstating the error and
  // understating the entropy.
  size_t k = 0;
  for (const WeightedPoint& p : points) {
    if (p.weight <= 0) continue;
    const double lo = p.lo, hi = p.hi;
    while (lo > mids[k]) ++k;
    if (!(hi > lo)) {
      const double d = p.value - final_levels[k];
      err += p.weight * d * d;
      max_abs = std::max(max_abs, std::fabs(d));
      add_to_cell(k, p.weight);
      continue;
    }
    const double density = p.density;
    if (hi <= mids[k]) {
      // The whole bin in one cell (most points): the loop below's first
      // step, with its weight density * (hi - lo) made with the point.
      const double l = final_levels[k];
      const double da = lo - l, db = hi - l;
      err += density * (db * db * db - da * da * da) / 3.0;
      max_abs = std::max({max_abs, std::fabs(da), std::fabs(db)});
      add_to_cell(k, p.whole);
      continue;
    }
    for (size_t j = k;; ++j) {
      const double a = j == k ? lo : mids[j - 1];
      const double b = std::min(hi, mids[j]);
      const double l = final_levels[j];
      const double da = a - l, db = b - l;
      err += density * (db * db * db - da * da * da) / 3.0;
      max_abs = std::max({max_abs, std::fabs(da), std::fabs(db)});
      add_to_cell(j, density * (b - a));
      if (hi <= mids[j]) break;
    }
  }
  cell_weight[cell] = cell_sum;
  book.est_error_sq = err;
  book.est_max_abs = max_abs;
}

}  // namespace

WeightedPoint::WeightedPoint(double value_in, double weight_in, double half_width_in)
    : value(value_in), weight(weight_in), half_width(half_width_in) {
  lo = value - half_width;
  hi = value + half_width;
  if (hi > lo) {
    density = weight / (hi - lo);
    whole = density * (hi - lo);
  }
}

double SeedMass(const WeightedPoint& p) {
  const double width = 2.0 * p.half_width;
  return p.weight > 0 && width > 0 ? std::cbrt(p.weight / width) * width : 0.0;
}

Codebook FitCodebook(std::span<const WeightedPoint> points, uint32_t max_levels, uint32_t iterations) {
  std::vector<double> seed_mass(points.size());
  for (size_t p = 0; p < points.size(); ++p) seed_mass[p] = SeedMass(points[p]);
  return FitCodebook(points, seed_mass, max_levels, iterations);
}

Codebook FitCodebook(std::span<const WeightedPoint> points, std::span<const double> seed_mass, uint32_t max_levels,
                     uint32_t iterations) {
  CodebookWork work;
  Codebook book;
  FitCodebook(points, seed_mass, max_levels, iterations, &work, &book);
  return book;
}

void FitCodebook(std::span<const WeightedPoint> points, std::span<const double> seed_mass, uint32_t max_levels,
                 uint32_t iterations, CodebookWork* work, Codebook* out) {
  std::vector<double>& levels = work->levels;
  levels.clear();
  size_t nonempty = 0;
  for (const WeightedPoint& p : points) nonempty += p.weight > 0 ? 1 : 0;
  if (nonempty == 0) return ClearCodebook(out);

  if (nonempty <= max_levels) {
    for (const WeightedPoint& p : points)
      if (p.weight > 0) levels.push_back(p.value);
  } else {
    // Seed level j at quantile (j + 0.5) / K of the density^(1/3) measure:
    // the MSE-optimal level density of high-resolution quantization theory
    // (Panter-Dite), so few Lloyd steps are needed even at 8 bits.
    double seed_total = 0.0;
    for (size_t p = 0; p < points.size(); ++p) seed_total += seed_mass[p];
    double cumulative = 0.0;
    size_t p = 0;
    for (uint32_t j = 0; j < max_levels; ++j) {
      double target = (j + 0.5) / max_levels * seed_total;
      while (p + 1 < points.size() && cumulative + seed_mass[p] < target) cumulative += seed_mass[p++];
      if (levels.empty() || points[p].value > levels.back()) levels.push_back(points[p].value);
    }
    std::vector<double>& sum_w = work->sum_w;
    std::vector<double>& sum_wv = work->sum_wv;
    sum_w.resize(levels.size());
    sum_wv.resize(levels.size());
    for (uint32_t it = 0; it < iterations; ++it) {
      CellSums(points, levels, work->mids, sum_w, sum_wv);
      bool moved = false;
      for (size_t k = 0; k < levels.size(); ++k) {
        if (sum_w[k] <= 0) continue;
        double centroid = sum_wv[k] / sum_w[k];
        moved |= centroid != levels[k];
        levels[k] = centroid;
      }
      if (!moved) break;
    }
  }
  FinishCodebook(points, levels, work, out);
}

Codebook UniformCodebook(std::span<const WeightedPoint> points, double step, uint32_t max_levels) {
  CodebookWork work;
  Codebook book;
  UniformCodebook(points, step, max_levels, &work, &book);
  return book;
}

void UniformCodebook(std::span<const WeightedPoint> points, double step, uint32_t max_levels, CodebookWork* work,
                     Codebook* out) {
  if (points.empty() || !(step > 0) || max_levels == 0) return ClearCodebook(out);
  // The multiples of step nearest to the extreme points, zero excepted (it
  // is the pruned symbol), trimmed from the longer side to max_levels.
  int64_t lo = static_cast<int64_t>(std::llround(std::max(points.front().value / step, -1e9)));
  int64_t hi = static_cast<int64_t>(std::llround(std::min(points.back().value / step, 1e9)));
  // A point that rounds to zero still needs a level of its sign.
  if (points.front().value < 0) lo = std::min<int64_t>(lo, -1);
  if (points.back().value > 0) hi = std::max<int64_t>(hi, 1);
  auto count = [&] { return (hi - lo + 1) - (lo <= 0 && hi >= 0 ? 1 : 0); };
  while (count() > static_cast<int64_t>(max_levels)) {
    if (-lo > hi) ++lo;
    else --hi;
  }
  std::vector<double>& levels = work->levels;
  levels.clear();
  for (int64_t k = lo; k <= hi; ++k)
    if (k != 0) levels.push_back(static_cast<double>(k) * step);
  if (levels.empty()) return ClearCodebook(out);
  // One centroid step: each level moves to the mean of its cell (the cells
  // stay the uniform ones), and a level no point uses is dropped (the used
  // ones move down in place).
  std::vector<double>& sum_w = work->sum_w;
  std::vector<double>& sum_wv = work->sum_wv;
  sum_w.resize(levels.size());
  sum_wv.resize(levels.size());
  CellSums(points, levels, work->mids, sum_w, sum_wv);
  size_t used = 0;
  for (size_t k = 0; k < levels.size(); ++k)
    if (sum_w[k] > 0) levels[used++] = sum_wv[k] / sum_w[k];
  levels.resize(used);
  FinishCodebook(points, levels, work, out);
}

}  // namespace ckptfs::lossy
