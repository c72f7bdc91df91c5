// Compiled with -ffp-contract=off (the chosen configuration decides the
// encoded bytes).
#include "codec/tensor/lossy/search.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
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
constexpr uint32_t kLloydIterations = 12;
// Uniform candidates: prune below this fraction of the step (0.5: plain
// rounding; larger: a dead zone), steps from the largest magnitude / this,
// found to this many bisections (2^-12 of the log range: about 0.15 % of the step).
constexpr double kUniformDeadzones[] = {0.5, 0.6};
constexpr double kUniformMaxSteps = 127.0;
constexpr int kUniformBisections = 12;
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

// SeedMass of the chunk's bins (a cube root each), computed on first use:
// the candidates share most bins. Covers the keys from the smallest to the
// largest nonempty one.
class SeedCache {
 public:
  explicit SeedCache(const ChunkProfile& p) {
    while (first_ < kFiniteKeys && p.magnitude[first_] == 0) ++first_;
    uint32_t end = kFiniteKeys;
    while (end > first_ && p.magnitude[end - 1] == 0) --end;
    keys_ = end - first_;
    mass_.assign(2 * size_t{keys_}, std::numeric_limits<double>::quiet_NaN());  // NaN = not yet
  }
  // REQUIRES: the bin of (key, negative) is nonempty.
  double Get(uint32_t key, bool negative, const WeightedPoint& point) {
    double& m = mass_[key - first_ + (negative ? keys_ : 0)];
    if (std::isnan(m)) m = SeedMass(point);
    return m;
  }

 private:
  uint32_t first_ = 0, keys_ = 0;
  std::vector<double> mass_;
};

// The points of the bins between the thresholds into *points (replaced),
// and with `seeds`, their seed masses into *seed_mass.
void Points(std::span<const uint32_t> counts, uint32_t prune_key, uint32_t exact_key, SeedCache* seeds,
            std::vector<WeightedPoint>* points, std::vector<double>* seed_mass) {
  points->clear();
  if (seeds != nullptr) seed_mass->clear();
  auto add = [&](uint32_t key, bool negative) {
    uint32_t c = counts[key + (negative ? kMagnitudeBins : 0)];
    if (c == 0) return;
    BinGeometry g = Geometry(key);
    points->push_back({negative ? -g.mid : g.mid, static_cast<double>(c), g.width * 0.5});
    if (seeds != nullptr) seed_mass->push_back(seeds->Get(key, negative, points->back()));
  };
  for (uint32_t k = exact_key; k-- > prune_key;) add(k, true);
  for (uint32_t k = prune_key; k < exact_key; ++k) add(k, false);
}

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
  SeedCache seeds(profile);
  std::vector<double> seed_mass;
  std::vector<WeightedPoint> points;  // reused by every candidate
  uint32_t last_exact_key = UINT32_MAX;
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
  for (double fraction : kOutlierFractions) {
    uint32_t exact_key = ExactKey(profile, fraction);
    if (exact_key == last_exact_key) continue;
    last_exact_key = exact_key;
    uint64_t exact = profile.tail[exact_key] + profile.non_finite;
    uint32_t last_prune_key = UINT32_MAX;
    for (double share : kPruneShares) {
      uint32_t prune_key = PruneKey(profile, exact_key, share * target.max_error_sq, target.max_abs);
      if (prune_key == last_prune_key) continue;
      last_prune_key = prune_key;
      double prune_err = profile.prune_error[prune_key];
      double prune_max = prune_key == 0 ? 0.0 : Geometry(prune_key - 1).hi;
      if (prune_err > target.max_error_sq || prune_max > target.max_abs) continue;
      Points(counts, prune_key, exact_key, &seeds, &points, &seed_mass);
      double quantized = 0.0;
      for (const WeightedPoint& pt : points) quantized += pt.weight;

      auto fits = [&](const Codebook& book) {
        return prune_err + book.est_error_sq <= target.max_error_sq && book.est_max_abs <= target.max_abs;
      };
      // Smallest b whose estimate fits (the error falls as b grows).
      Codebook chosen;
      uint32_t bits = 0;
      if (points.empty()) {
        bits = 1;
      } else {
        Codebook widest = FitCodebook(points, seed_mass, (1u << kMaxBits) - 1, kLloydIterations);
        if (!fits(widest)) continue;
        chosen = std::move(widest);
        bits = kMaxBits;
        uint32_t lo = 1, hi = kMaxBits;  // hi fits
        while (lo < hi) {
          uint32_t mid = (lo + hi) / 2;
          Codebook book = FitCodebook(points, seed_mass, (1u << mid) - 1, kLloydIterations);
          if (fits(book)) {
            hi = mid;
            chosen = std::move(book);
            bits = mid;
          } else {
            lo = mid + 1;
          }
        }
        // The codebook may use fewer levels than 2^bits - 1: shrink bits.
        while (bits > 1 && chosen.levels.size() <= (1u << (bits - 1)) - 1) --bits;
      }
      consider(prune_key, exact_key, exact, prune_err, quantized, chosen, bits);
    }

    // Uniform candidates: levels at multiples of a step, pruned below a
    // fraction of it; the largest step whose estimate fits, by bisection
    // in log space (the error grows with the step).
    double top = 0.0;
    for (uint32_t k = exact_key; k-- > 0;)
      if (profile.magnitude[k] > 0) {
        top = Geometry(k).hi;
        break;
      }
    if (!(top > 0)) continue;
    for (double deadzone : kUniformDeadzones) {
      struct Trial {
        bool fits = false;
        uint32_t prune_key = 0;
        double prune_err = 0.0, quantized = 0.0;
        Codebook book;
      };
      auto trial = [&](double step) {
        Trial t;
        t.prune_key = std::min(exact_key, KeyOf(deadzone * step));
        t.prune_err = profile.prune_error[t.prune_key];
        const double prune_max = t.prune_key == 0 ? 0.0 : Geometry(t.prune_key - 1).hi;
        if (t.prune_err > target.max_error_sq || prune_max > target.max_abs) return t;
        Points(counts, t.prune_key, exact_key, nullptr, &points, nullptr);
        for (const WeightedPoint& pt : points) t.quantized += pt.weight;
        t.book = UniformCodebook(points, step, (1u << kMaxBits) - 1);
        // (Kept points need a level: an empty codebook fits nothing.)
        t.fits = (points.empty() || !t.book.levels.empty()) &&
                 t.prune_err + t.book.est_error_sq <= target.max_error_sq && t.book.est_max_abs <= target.max_abs;
        return t;
      };
      double lo = top / kUniformMaxSteps, hi = 2.0 * top;  // lo must fit, hi need not
      Trial good = trial(lo);
      if (!good.fits) continue;
      for (int it = 0; it < kUniformBisections; ++it) {
        const double mid = std::sqrt(lo * hi);
        Trial t = trial(mid);
        if (t.fits) lo = mid, good = std::move(t);
        else hi = mid;
      }
      uint32_t bits = 1;
      while ((1u << bits) - 1 < good.book.levels.size()) ++bits;
      consider(good.prune_key, exact_key, exact, good.prune_err, good.quantized, good.book, bits);
    }
  }
  return best;
}

}  // namespace ckptfs::lossy
