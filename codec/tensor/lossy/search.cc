// Compiled with -ffp-contract=off (the chosen configuration decides the
// encoded bytes).
#include "codec/tensor/lossy/search.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <iterator>
#include <limits>

#include "codec/tensor/lossy/codebook.h"

namespace ckptfs::lossy {
namespace {

// Magnitude keys at or above this are Inf/NaN.
constexpr uint32_t kFiniteKeys = kNonFiniteBits >> kHistogramShift;
// Candidate fractions of finite elements kept exact (largest magnitudes).
constexpr double kOutlierFractions[] = {0.0, 1e-4, 1e-3, 1e-2};
// Candidate shares of the error target spent on pruning.
constexpr double kPruneShares[] = {0.0, 0.5, 0.9, 0.99};
// Lloyd-Max candidates are fitted at the first outlier fraction only (no
// element exact), and at the others only when no candidate fits (a budget
// too tight for 8 bits of evenly spaced levels): with outliers the uniform
// candidates won (on the codec suite's key and delta frames, 14 of 1700
// searches chose a Lloyd-Max codebook with outliers, and without those
// candidates the suite's blobs were 0.0004 % smaller in total), and the 12
// pairs of them were three quarters of the search's codebook fits.
constexpr size_t kLloydOutlierFractions = 1;
// The Panter-Dite seeding leaves little to move: 4 iterations instead of
// 12 changed the suite's bytes by 0.002 %.
constexpr uint32_t kLloydIterations = 4;
// Uniform candidates: prune below this fraction of the step (0.5: plain
// rounding; larger: a dead zone), steps from the largest magnitude / this,
// found to this many bisections (2^-10 of the log range: about 0.5 % of
// the step; 12 bisections gave 0.01 % more bytes on the suite, 8 gave
// 0.005 % less in total but 0.1 % more on three of its five workloads).
constexpr double kUniformDeadzones[] = {0.5, 0.6};
constexpr double kUniformMaxSteps = 127.0;
constexpr int kUniformBisections = 10;
constexpr uint32_t kMaxBits = 8;

struct BinGeometry {
  double lo, hi, mid, width;
};
BinGeometry Geometry(uint32_t key) {
  BinGeometry g;
  g.lo = BitsFloat(key << kHistogramShift);
  g.hi = key + 1 >= kFiniteKeys ? static_cast<double>(FLT_MAX) : BitsFloat((key + 1) << kHistogramShift);
  g.width = g.hi - g.lo;
  g.mid = g.lo + g.width * 0.5;
  return g;
}

// Per-chunk tables shared by all candidates.
struct ChunkProfile {
  std::vector<uint64_t> magnitude;  // count per magnitude key (both signs)
  std::vector<double> prune_error;  // prune_error[k]: est. error of pruning keys < k
  std::vector<uint64_t> tail;       // tail[k]: finite elements with key >= k
  uint64_t non_finite = 0;
};

ChunkProfile Profile(std::span<const uint32_t> counts) {
  ChunkProfile p;
  p.magnitude.resize(kFiniteKeys);
  p.prune_error.resize(kFiniteKeys + 1);
  p.tail.resize(kFiniteKeys + 1);
  for (uint32_t k = 0; k < kFiniteKeys; ++k) p.magnitude[k] = uint64_t{counts[k]} + counts[k + kMagnitudeBins];
  for (uint32_t k = kFiniteKeys; k < kMagnitudeBins; ++k)
    p.non_finite += uint64_t{counts[k]} + counts[k + kMagnitudeBins];
  p.prune_error[0] = 0.0;
  for (uint32_t k = 0; k < kFiniteKeys; ++k) {
    // An empty bin adds exactly 0 (most of the 8 k keys are empty).
    if (p.magnitude[k] == 0) {
      p.prune_error[k + 1] = p.prune_error[k];
      continue;
    }
    BinGeometry g = Geometry(k);
    double second_moment = g.mid * g.mid + g.width * g.width / 12.0;
    p.prune_error[k + 1] = p.prune_error[k] + static_cast<double>(p.magnitude[k]) * second_moment;
  }
  p.tail[kFiniteKeys] = 0;
  for (uint32_t k = kFiniteKeys; k-- > 0;) p.tail[k] = p.tail[k + 1] + p.magnitude[k];
  return p;
}

// The histogram key of a magnitude (the bin it falls in), kFiniteKeys for
// anything not below FLT_MAX.
uint32_t KeyOf(double magnitude) {
  if (!(magnitude < static_cast<double>(FLT_MAX))) return kFiniteKeys;
  return FloatBits(static_cast<float>(magnitude)) >> kHistogramShift;
}

// Smallest key whose tail holds at most `fraction` of the finite elements.
// (tail never grows with the key and tail[kFiniteKeys] = 0: a binary search.)
uint32_t ExactKey(const ChunkProfile& p, double fraction) {
  uint64_t allowed = static_cast<uint64_t>(fraction * static_cast<double>(p.tail[0]));
  auto first = std::partition_point(p.tail.begin(), p.tail.end(), [&](uint64_t t) { return t > allowed; });
  return static_cast<uint32_t>(first - p.tail.begin());
}

// The smallest key in [0, kFiniteKeys) for which pred is false, or
// kFiniteKeys; pred must be true on a prefix of the keys.
template <typename Pred>
uint32_t FirstKeyFailing(Pred pred) {
  uint32_t lo = 0, hi = kFiniteKeys;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Largest key <= exact_key whose pruning error fits `budget` and whose pruned
// magnitudes stay below max_abs. Always at least 1 (bin 0 holds exact zeros
// and values below 2^-130) when that bin is small enough.
// Each condition, once false, stays false for larger keys (prune_error never
// falls, bin edges rise), so the first key failing one is found by binary
// searches instead of a walk through thousands of empty bins.
uint32_t PruneKey(const ChunkProfile& p, uint32_t exact_key, double budget, double max_abs) {
  const uint32_t error_fails =
      FirstKeyFailing([&](uint32_t key) { return key == 0 || p.prune_error[key + 1] <= budget; });
  const uint32_t abs_fails = FirstKeyFailing([&](uint32_t key) { return Geometry(key).hi <= max_abs; });
  return std::min({exact_key, error_fails, abs_fails});
}

// The chunk's nonempty bins as points with their seed masses (a cube root
// each), made once per search: every candidate's points are the bins
// between its prune and exact keys, two ranges of these (the negative bins
// by descending key, then the positive ones by ascending key), copied
// rather than made again from the histogram's thousands of mostly empty
// keys for each of the candidates.
class BinPoints {
 public:
  explicit BinPoints(std::span<const uint32_t> counts) {
    for (uint32_t k = kFiniteKeys; k-- > 0;) Add(counts, k, true, &negative_);
    for (uint32_t k = 0; k < kFiniteKeys; ++k) Add(counts, k, false, &positive_);
  }
  // The points of the bins with prune_key <= key < exact_key into *points
  // (replaced), ascending by value, and with `seed_mass` their seed masses.
  void Get(uint32_t prune_key, uint32_t exact_key, std::vector<WeightedPoint>* points,
           std::vector<double>* seed_mass) const {
    points->clear();
    if (seed_mass != nullptr) seed_mass->clear();
    auto below = [](uint32_t key) { return [key](uint32_t k) { return k < key; }; };
    auto at_or_above = [](uint32_t key) { return [key](uint32_t k) { return k >= key; }; };
    // Negative bins: keys descending, so [prune_key, exact_key) is after
    // the keys >= exact_key and before those < prune_key.
    const auto& nk = negative_.keys;
    const size_t n_begin = std::partition_point(nk.begin(), nk.end(), at_or_above(exact_key)) - nk.begin();
    const size_t n_end = std::partition_point(nk.begin(), nk.end(), at_or_above(prune_key)) - nk.begin();
    const auto& pk = positive_.keys;
    const size_t p_begin = std::partition_point(pk.begin(), pk.end(), below(prune_key)) - pk.begin();
    const size_t p_end = std::partition_point(pk.begin(), pk.end(), below(exact_key)) - pk.begin();
    auto append = [&](const Side& side, size_t begin, size_t end) {
      if (begin >= end) return;
      points->insert(points->end(), side.points.begin() + begin, side.points.begin() + end);
      if (seed_mass != nullptr)
        seed_mass->insert(seed_mass->end(), side.seed_mass.begin() + begin, side.seed_mass.begin() + end);
    };
    append(negative_, n_begin, n_end);
    append(positive_, p_begin, p_end);
  }

 private:
  struct Side {
    std::vector<uint32_t> keys;
    std::vector<WeightedPoint> points;
    std::vector<double> seed_mass;
  };
  static void Add(std::span<const uint32_t> counts, uint32_t key, bool negative, Side* side) {
    const uint32_t c = counts[key + (negative ? kMagnitudeBins : 0)];
    if (c == 0) return;
    const BinGeometry g = Geometry(key);
    side->keys.push_back(key);
    side->points.emplace_back(negative ? -g.mid : g.mid, static_cast<double>(c), g.width * 0.5);
    side->seed_mass.push_back(SeedMass(side->points.back()));
  }
  Side negative_, positive_;
};

double EntropyBits(const std::vector<double>& cells, double zero_count, double n) {
  double bits = 0.0;
  auto term = [&](double w) {
    if (w > 0) bits += w * -std::log2(w / n);
  };
  for (double w : cells) term(w);
  term(zero_count);
  return bits;
}

}  // namespace

double EstimateEnergy(std::span<const uint32_t> counts) {
  double energy = 0.0;
  for (uint32_t k = 0; k < kFiniteKeys; ++k) {
    const uint64_t c = uint64_t{counts[k]} + counts[k + kMagnitudeBins];
    if (c == 0) continue;
    const BinGeometry g = Geometry(k);
    energy += static_cast<double>(c) * (g.mid * g.mid + g.width * g.width / 12.0);
  }
  return energy;
}

std::optional<SearchResult> AllPrunedConfig(std::span<const uint32_t> counts, double max_abs) {
  const ChunkProfile profile = Profile(counts);
  const uint32_t exact_key = ExactKey(profile, 0.0);
  if (exact_key > 0 && Geometry(exact_key - 1).hi > max_abs) return std::nullopt;
  SearchResult r;
  r.table.prune_below = exact_key << kHistogramShift;
  r.table.exact_from = exact_key << kHistogramShift;
  r.table.bits = 1;
  r.table.num_levels = 0;
  FillBounds(&r.table);
  r.est_error_sq = profile.prune_error[exact_key];
  r.est_exact = profile.non_finite;
  return r;
}

std::optional<SearchResult> UniformGridConfig(std::span<const uint32_t> counts, float step) {
  if (!(step > 0.0f) || !std::isfinite(step)) return std::nullopt;
  double largest = 0.0;
  for (uint32_t k = kFiniteKeys; k-- > 0;)
    if (counts[k] != 0 || counts[k + kMagnitudeBins] != 0) {
      largest = Geometry(k).hi;
      break;
    }
  constexpr uint32_t kMaxK = (kMaxLevels - 1) / 2;  // 127: 2K levels fit 8-bit symbols
  const double wanted = std::ceil(largest / step + 0.5);
  const uint32_t levels_per_side = static_cast<uint32_t>(std::clamp(wanted, 1.0, static_cast<double>(kMaxK)));
  const float edge = static_cast<float>((levels_per_side + 0.5) * static_cast<double>(step));
  if (!std::isfinite(edge)) return std::nullopt;
  SearchResult r;
  QuantizeTable& t = r.table;
  t.num_levels = 2 * levels_per_side;
  for (uint32_t j = 0; j < levels_per_side; ++j) {
    const float level = static_cast<float>(static_cast<double>(levels_per_side - j) * step);
    t.levels[j] = -level;
    t.levels[t.num_levels - 1 - j] = level;
  }
  t.bits = static_cast<uint32_t>(std::bit_width(t.num_levels));
  t.prune_below = FloatBits(step * 0.5f);
  t.exact_from = std::min(FloatBits(edge), kNonFiniteBits);
  FillBounds(&t);
  return r;
}

void FillBounds(QuantizeTable* t) {
  for (uint32_t j = 0; j < kMaxLevels; ++j) {
    if (j >= t->num_levels) t->levels[j] = 0.0f;
    t->bounds[j] =
        j + 1 < t->num_levels ? (t->levels[j] + t->levels[j + 1]) * 0.5f : std::numeric_limits<float>::infinity();
  }
}

std::optional<SearchResult> SearchConfig(std::span<const uint32_t> counts, uint64_t n, uint32_t element_size,
                                         const SearchTarget& target) {
  ChunkProfile profile = Profile(counts);
  const double dn = static_cast<double>(n);
  std::optional<SearchResult> best;
  const BinPoints bins(counts);
  std::vector<double> seed_mass;
  std::vector<WeightedPoint> points;  // reused by every candidate
  CodebookWork work;                  // so are the fits' buffers
  Codebook fitted, trial_book;  // the bisection's best so far and its trial
  // A uniform candidate at one step; two of them are reused by every bisection.
  struct Trial {
    bool fits = false;
    uint32_t prune_key = 0;
    double prune_err = 0.0, quantized = 0.0;
    Codebook book;
  };
  Trial good, next;
  // Keeps the candidate with the smallest estimated size.
  auto consider = [&](uint32_t prune_key, uint32_t exact_key, uint64_t exact, double prune_err, double quantized,
                      const Codebook& chosen, uint32_t bits) {
    double entropy = EntropyBits(chosen.cell_weights, dn - quantized, dn);
    double symbol_bits = std::min(static_cast<double>(bits) * dn, entropy * 1.05 + 0.01 * dn);
    double est_bytes = symbol_bits / 8.0 + static_cast<double>(exact) * (element_size + 1.5) +
                       4.0 * static_cast<double>(chosen.levels.size()) + 64.0;
    if (best && best->est_bytes <= est_bytes) return;
    SearchResult r;
    r.table.prune_below = prune_key << kHistogramShift;
    r.table.exact_from = exact_key << kHistogramShift;
    r.table.bits = bits;
    r.table.num_levels = static_cast<uint32_t>(chosen.levels.size());
    std::copy(chosen.levels.begin(), chosen.levels.end(), r.table.levels);
    FillBounds(&r.table);
    r.est_error_sq = prune_err + chosen.est_error_sq;
    r.est_bytes = est_bytes;
    r.est_exact = exact;
    best = r;
  };
  // The Lloyd-Max candidates of one exact threshold (a prune share each).
  auto lloyd_candidates = [&](uint32_t exact_key, uint64_t exact) {
    uint32_t last_prune_key = UINT32_MAX;
    for (double share : kPruneShares) {
      uint32_t prune_key = PruneKey(profile, exact_key, share * target.max_error_sq, target.max_abs);
      if (prune_key == last_prune_key) continue;
      last_prune_key = prune_key;
      double prune_err = profile.prune_error[prune_key];
      double prune_max = prune_key == 0 ? 0.0 : Geometry(prune_key - 1).hi;
      if (prune_err > target.max_error_sq || prune_max > target.max_abs) continue;
      bins.Get(prune_key, exact_key, &points, &seed_mass);
      double quantized = 0.0;
      for (const WeightedPoint& pt : points) quantized += pt.weight;

      auto fits = [&](const Codebook& book) {
        return prune_err + book.est_error_sq <= target.max_error_sq && book.est_max_abs <= target.max_abs;
      };
      // Smallest b whose estimate fits (the error falls as b grows).
      uint32_t bits = 0;
      if (points.empty()) {
        fitted = Codebook();
        bits = 1;
      } else {
        FitCodebook(points, seed_mass, (1u << kMaxBits) - 1, kLloydIterations, &work, &trial_book);
        if (!fits(trial_book)) continue;
        std::swap(fitted, trial_book);
        bits = kMaxBits;
        uint32_t lo = 1, hi = kMaxBits;  // hi fits
        while (lo < hi) {
          uint32_t mid = (lo + hi) / 2;
          FitCodebook(points, seed_mass, (1u << mid) - 1, kLloydIterations, &work, &trial_book);
          if (fits(trial_book)) {
            hi = mid;
            std::swap(fitted, trial_book);
            bits = mid;
          } else {
            lo = mid + 1;
          }
        }
        // The codebook may use fewer levels than 2^bits - 1: shrink bits.
        while (bits > 1 && fitted.levels.size() <= (1u << (bits - 1)) - 1) --bits;
      }
      consider(prune_key, exact_key, exact, prune_err, quantized, fitted, bits);
    }

  };
  // The uniform candidates of one exact threshold (a dead zone each).
  auto uniform_candidates = [&](uint32_t exact_key, uint64_t exact) {
    // Uniform candidates: levels at multiples of a step, pruned below a
    // fraction of it; the largest step whose estimate fits, by bisection
    // in log space (the error grows with the step).
    double top = 0.0;
    for (uint32_t k = exact_key; k-- > 0;)
      if (profile.magnitude[k] > 0) {
        top = Geometry(k).hi;
        break;
      }
    if (!(top > 0)) return;
    for (double deadzone : kUniformDeadzones) {
      // Fills *t (its codebook's vectors reused).
      auto trial = [&](double step, Trial* t) {
        t->fits = false;
        t->quantized = 0.0;
        t->prune_key = std::min(exact_key, KeyOf(deadzone * step));
        t->prune_err = profile.prune_error[t->prune_key];
        const double prune_max = t->prune_key == 0 ? 0.0 : Geometry(t->prune_key - 1).hi;
        if (t->prune_err > target.max_error_sq || prune_max > target.max_abs) return;
        bins.Get(t->prune_key, exact_key, &points, nullptr);
        for (const WeightedPoint& pt : points) t->quantized += pt.weight;
        UniformCodebook(points, step, (1u << kMaxBits) - 1, &work, &t->book);
        // (Kept points need a level: an empty codebook fits nothing.)
        t->fits = (points.empty() || !t->book.levels.empty()) &&
                  t->prune_err + t->book.est_error_sq <= target.max_error_sq && t->book.est_max_abs <= target.max_abs;
      };
      double lo = top / kUniformMaxSteps, hi = 2.0 * top;  // lo must fit, hi need not
      trial(lo, &good);
      if (!good.fits) continue;
      for (int it = 0; it < kUniformBisections; ++it) {
        const double mid = std::sqrt(lo * hi);
        trial(mid, &next);
        if (next.fits) lo = mid, std::swap(good, next);
        else hi = mid;
      }
      uint32_t bits = 1;
      while ((1u << bits) - 1 < good.book.levels.size()) ++bits;
      consider(good.prune_key, exact_key, exact, good.prune_err, good.quantized, good.book, bits);
    }
  };
  // Each outlier fraction's exact threshold, duplicates skipped.
  std::vector<std::pair<uint32_t, uint64_t>> thresholds;
  for (double fraction : kOutlierFractions) {
    const uint32_t exact_key = ExactKey(profile, fraction);
    if (!thresholds.empty() && thresholds.back().first == exact_key) continue;
    thresholds.emplace_back(exact_key, profile.tail[exact_key] + profile.non_finite);
  }
  for (size_t f = 0; f < thresholds.size(); ++f) {
    if (f < kLloydOutlierFractions) lloyd_candidates(thresholds[f].first, thresholds[f].second);
    uniform_candidates(thresholds[f].first, thresholds[f].second);
  }
  // A budget too tight for those (8 bits of evenly spaced levels do not
  // fit, nor all elements quantized): Lloyd-Max levels with outliers exact.
  if (!best)
    for (size_t f = kLloydOutlierFractions; f < thresholds.size(); ++f)
      lloyd_candidates(thresholds[f].first, thresholds[f].second);
  return best;
}

}  // namespace ckptfs::lossy
