// Private to the CPU kernels: the nearest-level lookup table and the AVX2
// paths of the hottest loops. Their results equal element_ops.h exactly
// (same IEEE operations, no FMA), which tests/unit/codec/lossy_kernels_test.cc
// checks element by element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

// NearestLevel(r) is the number of bounds below r. For every histogram bin
// (the float's top 14 bits) the answer lies between NearestLevel(smallest r
// of the bin) = start and NearestLevel(largest r of the bin); bounds past
// that never compare below r. So start + (the number of
// bounds[start .. start + kProbe - 1] below r) equals NearestLevel(r) when
// the bin spans at most kProbe bounds; a table where some bin spans more is
// not `probe_ok` and the callers use the binary search instead.
inline constexpr uint32_t kProbe = 4;

struct LevelLookup {
  alignas(64) float bounds[kMaxLevels + kProbe];  // +Inf padded
  alignas(64) float levels[kMaxLevels + kProbe];  // 0 padded
  alignas(64) float symbol_values[256];           // [0] = 0, [s] = levels[s - 1]
  alignas(64) int32_t start[kHistogramBins];
  bool probe_ok = true;
  uint32_t max_span = 0;   // the most bounds inside one quantized bin
  uint32_t max_start = 0;  // the largest start
  // Every bound of the table (all kMaxLevels) at most the next one (a NaN
  // fails): NearestLevel's answer is then the count of bounds below r.
  bool bounds_ascend = false;
};

// Fills `lut` for table `t` (only bins between the prune and exact
// thresholds matter; others get start 0).
void BuildLookup(const QuantizeTable& t, LevelLookup* lut);

// How a vector quantize pass finds a lane's level. kGather: the bin's
// first candidate from LevelLookup::start, then the probed bounds, then the
// level, each by a gather. kRegisters, when every bound and level index the
// lookup can form (a start plus its probes) fits the pass's registers: the
// same entries by register permutes. kCompare, for tables of 1 to
// kCompareLevels levels whose bounds ascend and whose bound past the last
// level is +Inf: the level's index counted as the bounds below the
// residual (NearestLevel's count, ties included), without a gather. On the
// AMD EPYC the project is measured on, the gathers were most of the pass's
// time in cache, and the default's tables mostly have 3 to 12 levels.
enum class LevelFind { kGather, kRegisters, kCompare };
inline constexpr uint32_t kCompareLevels = 8;

// The bounds a pass probes past a bin's start for a table of `max_span`.
constexpr uint32_t ProbesFor(uint32_t max_span) { return max_span <= 2 ? max_span : kProbe; }

// The way for table `t` with lookup `lut`, for a pass whose registers hold
// `register_entries` bounds and as many levels.
LevelFind ChooseLevelFind(const QuantizeTable& t, const LevelLookup& lut, uint32_t register_entries);

// Calls run.operator()<kProbes, kFind>() with the way ChooseLevelFind
// picks and ProbesFor(lut.max_span) probes (none for kCompare): a pass's
// kernel instantiated for the table.
template <typename Run>
void WithLevelFind(const QuantizeTable& t, const LevelLookup& lut, uint32_t register_entries, const Run& run) {
  const auto by_probes = [&]<LevelFind kFind>() {
    if (lut.max_span == 0) return run.template operator()<0, kFind>();
    if (lut.max_span == 1) return run.template operator()<1, kFind>();
    if (lut.max_span == 2) return run.template operator()<2, kFind>();
    return run.template operator()<kProbe, kFind>();
  };
  switch (ChooseLevelFind(t, lut, register_entries)) {
    case LevelFind::kCompare:
      return run.template operator()<0, LevelFind::kCompare>();
    case LevelFind::kRegisters:
      return by_probes.template operator()<LevelFind::kRegisters>();
    case LevelFind::kGather:
      return by_probes.template operator()<LevelFind::kGather>();
  }
}

// The nearest level by lookup. REQUIRES: lut.probe_ok.
CKPTFS_HD uint32_t LookupLevel(const LevelLookup& lut, float r) {
  const uint32_t start = static_cast<uint32_t>(lut.start[FloatBits(r) >> kHistogramShift]);
  const float* b = lut.bounds + start;
  return start + (b[0] < r) + (b[1] < r) + (b[2] < r) + (b[3] < r);
}

// AVX2 versions of the hot loops for every element type, used when the CPU
// has AVX2 (SimdAvailable()). Element pointers are `type` elements.
bool SimdAvailable();

// Quantizes elements [start, end) of one reduction block (start is a
// multiple of kReduceBlock): symbols, reconstruction bits, lane sums of the
// squared error (lanes[i % 32]), running max abs error and class counts.
// REQUIRES: SimdAvailable(), lut.probe_ok, base null or n elements.
void QuantizeBlockSimd(ElementType type, const QuantizeTable& t, const LevelLookup& lut, const void* values,
                       const void* base, uint64_t start, uint64_t end, const float* residual, uint8_t* symbols,
                       void* recon, double* lanes, double* max_err, uint64_t* pruned, uint64_t* exact);

// The same for f32 with AVX-512 (sixteen lanes, mask registers).
// REQUIRES: QuantizeAvx512Available(), lut.probe_ok, base null or n elements.
bool QuantizeAvx512Available();
void QuantizeBlockF32Avx512(const QuantizeTable& t, const LevelLookup& lut, const void* values, const void* base,
                            uint64_t start, uint64_t end, const float* residual, uint8_t* symbols, void* recon,
                            double* lanes, double* max_err, uint64_t* pruned, uint64_t* exact);

// Relevel (kernels.h) of f32 elements [start, end) of one reduction block
// (start a multiple of kReduceBlock): the symbols from `packed` (the whole
// chunk's stream, `packed_bytes` long), quantized elements (symbol > 0)
// reconstructed as base + lut.symbol_values[symbol], the others left as
// `recon` holds them; the squared errors into lanes[i % 32] in element
// order and the running max abs error, as QuantizeBlockF32Avx512 adds them.
// REQUIRES: QuantizeAvx512Available(), lut.symbol_values filled from the
// table's levels, base null or n elements.
void RelevelBlockF32Avx512(const LevelLookup& lut, uint32_t bits, const uint8_t* packed, uint64_t packed_bytes,
                           const void* values, const void* base, uint64_t start, uint64_t end, void* recon,
                           double* lanes, double* max_err);

// DequantizeSimd for f32 with AVX-512: groups [0, groups), sixteen lanes,
// the symbols' values by register permutes (the same entries a gather
// reads); the same bits. REQUIRES: QuantizeAvx512Available(), as
// DequantizeSimd.
void DequantizeF32Avx512(const LevelLookup& lut, uint32_t bits, const uint8_t* packed, const void* base,
                         uint64_t groups, void* out, uint32_t* max_symbol);

// Residual and norm lanes of elements [start, end) of one reduction block
// (start a multiple of kReduceBlock): residual[i] = x[i] - base[i] (or x[i]),
// lanes[i % 32] += x[i]^2 for finite x[i]. REQUIRES: SimdAvailable().
void ResidualBlockSimd(ElementType type, const void* values, const void* base, uint64_t start, uint64_t end,
                       float* residual, double* lanes);

// Packs `count` symbols (a multiple of 8; each < 2^bits) into `bits` bytes per
// group of 8 with BMI2 PEXT; false (nothing written) without BMI2.
bool PackGroupsBmi2(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out);

// The inverse: `count` symbols (a multiple of 8) from `bits` bytes per group
// with BMI2 PDEP, reading no byte past count / 8 * bits; false (nothing
// written) without BMI2.
bool UnpackGroupsBmi2(const std::byte* packed, uint64_t count, uint32_t bits, uint8_t* out);

// Lists the positions (ascending) and raw bits of the elements whose
// residual magnitude bits are >= exact_from; returns their number.
// REQUIRES: SimdAvailable(); positions/raw large enough.
uint64_t CompactExactSimd(ElementType type, uint32_t exact_from, const void* values, const float* residual, uint64_t n,
                          uint32_t* positions, void* raw);

// Dequantizes `groups` full groups of 8 symbols starting at group g0.
// REQUIRES: SimdAvailable(); packed readable for 8 bytes at every group.
void DequantizeSimd(ElementType type, const LevelLookup& lut, uint32_t bits, const uint8_t* packed, const void* base,
                    uint64_t g0, uint64_t groups, void* out, uint32_t* max_symbol);

}  // namespace ckptfs::lossy
