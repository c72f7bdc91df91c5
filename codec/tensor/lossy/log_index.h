// The log mode's per-element passes (LOSSY.md section 9), private to
// log_codec.cc: step 1 (grid index, reconstruction, error sums, shift votes)
// and step 2 (symbols). The scalar templates here are the reference; the
// AVX2 paths (log_index.cc, log_symbols_avx2.cc, log_hysteresis_avx2.cc;
// f32 key and delta frames) give the same results
// bit for bit, which tests/unit/codec/lossy_log_simd_test.cc checks.
#pragma once

#include <endian.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/log_codec.h"

namespace ckptfs::lossy {

// Grid indices of finite floats fit in 32 bits: |e| <= 149 octaves of at
// most 2^16 levels (|q| < 2^24). kNoIndex marks an element without one
// (stored exactly), kZeroIndex an element that is +0.0 (its own symbol).
inline constexpr int32_t kNoIndex = std::numeric_limits<int32_t>::min();
inline constexpr int32_t kZeroIndex = std::numeric_limits<int32_t>::min() + 1;
// The delta shift is the most frequent index difference within this range.
inline constexpr int64_t kMaxShift = 64;
// Symbols: 0 = the predicted index, 1 = +0.0, s >= 2 = predicted + Unzigzag(s - 1).
inline constexpr uint32_t kSymbolZero = 1;

// True when the element's value has a grid index (finite and > 0).
inline bool OnGrid(float x) { return x > 0 && std::isfinite(x); }

// Step 1's results besides the per-element arrays. The error sums run over
// the quantized elements in element order, ref2 over the finite ones.
struct LogIndexSums {
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
  double err2 = 0, max_abs = 0, achieved_rel = 0, ref2 = 0;
  uint64_t quantized = 0;
  // Four interleaved vote tables (votes[.][d + kMaxShift] counts the index
  // difference d to the base): most differences are alike, and one counter
  // would serialize the loop on its own increments.
  uint64_t votes[4][2 * kMaxShift + 1] = {};
};

template <typename E>
typename E::Bits LoadLogBits(const std::byte* p, size_t i) {
  typename E::Bits b;
  std::memcpy(&b, p + i * sizeof b, sizeof b);
  return b;
}
template <typename E>
void StoreLogBits(std::byte* p, size_t i, typename E::Bits b) {
  std::memcpy(p + i * sizeof b, &b, sizeof b);
}

// Symbol i of a packed bit string (b <= 24 bits each) by one unaligned
// 8-byte load: the bit offset in the byte plus b stays below 64. REQUIRES
// kPackedSlack readable bytes after the packed size.
inline constexpr size_t kPackedSlack = 8;
inline uint32_t SymbolAt(const std::byte* packed, uint64_t i, uint32_t bits, uint32_t mask) {
  const uint64_t pos = i * bits;
  uint64_t word;
  std::memcpy(&word, packed + pos / 8, 8);
  return static_cast<uint32_t>(le64toh(word) >> (pos % 8)) & mask;
}

// The grid index of a base element, or kNoIndex when it is not on the grid.
template <typename E>
int32_t BaseIndex(const LogGrid& grid, typename E::Bits bits) {
  const float b = E::ToFloat(bits);
  return OnGrid(b) ? static_cast<int32_t>(grid.FloatIndex(b)) : kNoIndex;
}

// The log mode's bound: y within a factor 1 + max_rel of x, either way
// (y <= (1 + max_rel) x and x <= (1 + max_rel) y; false for y <= 0 or NaN).
// Symmetric in log, as the rounding is; it implies |y - x| <= max_rel x.
// The vector paths make the same double products and compares.
inline bool WithinFactor(double y, double x, double max_rel) {
  const double factor = 1.0 + max_rel;
  return y <= factor * x && x <= factor * y;
}

struct LogFractionTable;

// The encoder's grids for step 1: `code` rounds the elements it codes
// (LogRounding::kLog), `base` finds a delta frame's base indices as the
// decoder does (kValue, the format's); both of one ratio. The vector
// tables are theirs (LogFractionTable::Build), or null for the scalar path.
struct IndexGrids {
  const LogGrid& code;
  const LogGrid& base;
  const LogFractionTable* code_table = nullptr;
  const LogFractionTable* base_table = nullptr;
};

// Step 1 for element i: its index (kNoIndex when the grid point would miss
// the bound or the element is off the grid, kZeroIndex for +0.0), its
// reconstruction, the sums and, in a delta frame, the base's index and vote.
template <typename E, bool kDelta>
[[gnu::always_inline]] inline void IndexElement(const IndexGrids& grids, const std::byte* values,
                                                const std::byte* base, double max_rel, uint64_t i, int32_t* index,
                                                int32_t* base_index, std::byte* recon, LogIndexSums* sums) {
  using Bits = typename E::Bits;
  const Bits bits = LoadLogBits<E>(values, i);
  const float x = E::ToFloat(bits);
  Bits stored = bits;  // exact unless quantized
  int32_t q = bits == 0 ? kZeroIndex : kNoIndex;
  if (OnGrid(x)) {
    const LogGrid::Point p = grids.code.Locate(x);
    const Bits r = E::FromFloat(p.value);
    const double e = static_cast<double>(E::ToFloat(r)) - x;
    if (WithinFactor(E::ToFloat(r), x, max_rel)) {
      q = static_cast<int32_t>(p.q);
      stored = r;
      sums->lo = std::min(sums->lo, q);
      sums->hi = std::max(sums->hi, q);
      sums->err2 += e * e;
      sums->max_abs = std::max(sums->max_abs, std::fabs(e));
      sums->achieved_rel = std::max(sums->achieved_rel, std::fabs(e) / x);
      ++sums->quantized;
    }
  }
  if (std::isfinite(x)) sums->ref2 += static_cast<double>(x) * x;
  index[i] = q;
  StoreLogBits<E>(recon, i, stored);
  if constexpr (kDelta) {
    const int32_t qb = BaseIndex<E>(grids.base, LoadLogBits<E>(base, i));
    base_index[i] = qb;
    if (q != kNoIndex && q != kZeroIndex && qb != kNoIndex) {
      const int64_t d = int64_t{q} - qb;
      if (d >= -kMaxShift && d <= kMaxShift) ++sums->votes[i & 3][d + kMaxShift];
    }
  }
}

// Step 4 for element i when some quantized elements were escaped or kept
// their predicted level (step 1b): the error sums over the elements that
// stay quantized (an index, symbol <= limit), which the caller has reset.
// Called for every i in order.
template <typename E>
inline void AddEscapedErrors(const std::byte* values, const std::byte* recon, const int32_t* index,
                             const uint32_t* symbols, uint32_t limit, uint64_t i, LogIndexSums* sums) {
  if (symbols[i] > limit || index[i] == kNoIndex || index[i] == kZeroIndex) return;
  const float x = E::ToFloat(LoadLogBits<E>(values, i));
  const double e = static_cast<double>(E::ToFloat(LoadLogBits<E>(recon, i))) - x;
  sums->err2 += e * e;
  sums->max_abs = std::max(sums->max_abs, std::fabs(e));
  sums->achieved_rel = std::max(sums->achieved_rel, std::fabs(e) / x);
  ++sums->quantized;
}

// Branch-free: 0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3 (|d| < 2^31).
inline uint32_t Zigzag(int64_t d) { return static_cast<uint32_t>((d << 1) ^ (d >> 63)); }
inline int64_t Unzigzag(uint32_t z) { return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1); }

// The predicted index of an element: in a delta frame, the base element's
// index plus the chunk's shift when the base element is on the grid (a
// second moment that decays between versions moves most indices alike);
// else the stream's origin.
inline int64_t Predict(int32_t base_index, int64_t origin, int64_t shift) {
  return base_index == kNoIndex ? origin : base_index + shift;
}

// The decoder's element: its value from symbol `sym` and, in a delta frame
// (base not null), base element i. With zero_carry (kFlagZeroCarry),
// symbols 0 and 1 exchange their meanings over a +0.0 base element.
template <typename E>
[[gnu::always_inline]] inline typename E::Bits DecodeLogElement(const LogGrid& grid, uint32_t sym,
                                                                const std::byte* base, uint64_t i, int64_t origin,
                                                                int64_t shift, bool zero_carry) {
  const typename E::Bits base_bits = base == nullptr ? typename E::Bits{0} : LoadLogBits<E>(base, i);
  if (zero_carry && sym <= kSymbolZero && base != nullptr && base_bits == 0) sym ^= 1;
  if (sym == kSymbolZero) return typename E::Bits{0};
  const int64_t predicted = base == nullptr ? origin : Predict(BaseIndex<E>(grid, base_bits), origin, shift);
  const int64_t q = predicted + (sym == 0 ? 0 : Unzigzag(sym - 1));
  return E::FromFloat(grid.FloatValue(q));
}

// Step 1b (hysteresis, log_codec.cc) for element i of a delta frame: when
// its predicted level (the base's, moved by the shift) is another than its
// index and its reconstruction there is positive and within `bound` of the
// value (a factor 1 + bound either way, WithinFactor), the element takes
// it (index and reconstruction). Returns whether it did.
template <typename E>
[[gnu::always_inline]] inline bool KeepPredictedLevel(const LogGrid& grid, const std::byte* values,
                                                      const int32_t* base_index, int64_t origin, int64_t shift,
                                                      double bound, uint64_t i, int32_t* index, std::byte* recon) {
  const int32_t q = index[i];
  if (q == kNoIndex || q == kZeroIndex || base_index[i] == kNoIndex) return false;
  const int64_t predicted = Predict(base_index[i], origin, shift);
  if (predicted == q || predicted < std::numeric_limits<int32_t>::min() + 2 ||
      predicted > std::numeric_limits<int32_t>::max())
    return false;
  const float x = E::ToFloat(LoadLogBits<E>(values, i));
  const typename E::Bits r = E::FromFloat(grid.FloatValue(predicted));
  if (!WithinFactor(E::ToFloat(r), x, bound)) return false;
  index[i] = static_cast<int32_t>(predicted);
  StoreLogBits<E>(recon, i, r);
  return true;
}

// Step 2: the symbol of an element of index q (as step 1 left it);
// UINT32_MAX = exact.
inline uint32_t Symbol(int32_t q, int64_t predicted) {
  if (q == kZeroIndex) return kSymbolZero;
  if (q == kNoIndex) return UINT32_MAX;
  const int64_t d = q - predicted;
  if (d <= -(int64_t{1} << 30) || d >= (int64_t{1} << 30)) return UINT32_MAX;
  const uint32_t sym = Zigzag(d) + 1;
  return d == 0 ? 0 : sym;  // a select, not a branch: d == 0 is common and unpredictable
}

// Step 2's histogram of the symbols' bit widths (symbols wider than the
// chosen width are escaped). Widths above 24 may be counted one too high
// by the vector path (a float conversion rounds): every width > 24 is
// escaped alike, so only their total matters. Four interleaved tables: most
// symbols share a width, and one counter would serialize the loop on its own
// increments.
struct LogWidthCounts {
  uint64_t counts[4][33] = {};
  uint64_t far = 0;  // quantized elements whose difference is too large for a symbol
  void Add(uint64_t i, uint32_t sym, int32_t q) {
    if (sym != UINT32_MAX) ++counts[i & 3][std::bit_width(sym)];
    else if (q != kNoIndex) ++far;
  }
};

// For the vector index pass: the rounded level of a binary32 fraction f
// (23 bits, exponent 0) in a bucket table. r(f) = Locate(1 + f 2^-23).q
// lies in [0, K] (K = the next octave's first level) and steps up by one at
// each of K thresholds; bucket b = f >> shift holds at most one, so
// r(f) = entry >> 16 + ((f & (2^shift - 1)) >= (entry & 0xffff)).
// level_bits[r] = bits of FloatValue(r): the level's value for exponent 0,
// to which e << 23 is added for a normal result. low_bits[b] and
// high_bits[b] are level_bits of bucket b's two possible levels (r0 and
// r0 + 1), so that the value's lookup does not wait for the entry's.
struct LogFractionTable {
  double ratio = 0;
  LogRounding rounding = LogRounding::kValue;
  uint32_t shift = 0;
  std::vector<uint32_t> entry;
  std::vector<uint32_t> level_bits;
  std::vector<uint32_t> low_bits, high_bits;
  // The same split into 64 buckets (shift 17) as separate arrays, for the
  // AVX-512 path's two-register permutes; has_small when K < 64 and no
  // bucket holds two boundaries.
  bool has_small = false;
  alignas(64) uint32_t small_level[64] = {}, small_offset[64] = {}, small_low_bits[64] = {}, small_high_bits[64] = {};
  // Nullopt when the grid has too many levels per octave for 16-bit fields
  // (the scalar path then serves).
  static std::optional<LogFractionTable> Build(const LogGrid& grid);
  // Whether this is the table of `grid` (its ratio and rounding).
  bool Serves(const LogGrid& grid) const { return ratio == grid.ratio() && rounding == grid.rounding(); }
};

// Whether the AVX2 paths run here (AVX2 CPU, x86-64 build).
bool LogSimdAvailable();

// Step 1 for f32 elements [0, n) by AVX2 (groups of 8 with an element
// needing the general path, such as a subnormal, run IndexElement).
// Equal to IndexElement<F32Elem, base != nullptr> for each i in order.
// REQUIRES: LogSimdAvailable(); both of grids' tables built from their grids.
void IndexPassF32Avx2(const IndexGrids& grids, const std::byte* values, const std::byte* base, double max_rel,
                      uint64_t n, int32_t* index, int32_t* base_index, std::byte* recon, LogIndexSums* sums);

// Whether the AVX-512 index pass runs here (AVX-512 F/BW/VL CPU, x86-64 build).
bool LogAvx512Available();

// IndexPassF32Avx2 by AVX-512 with permutes of the 64-bucket tables instead
// of gathers. REQUIRES: LogAvx512Available(), both tables has_small.
void IndexPassF32Avx512(const IndexGrids& grids, const std::byte* values, const std::byte* base, double max_rel,
                        uint64_t n, int32_t* index, int32_t* base_index, std::byte* recon, LogIndexSums* sums);

// Step 2 by AVX2: symbols[i] = Symbol(index[i], predicted) with the
// prediction as in the scalar pass (base_index null in a key frame), and
// their widths added to *widths.
// REQUIRES: LogSimdAvailable().
void SymbolPassAvx2(const int32_t* index, const int32_t* base_index, int64_t origin, int64_t shift, uint64_t n,
                    uint32_t* symbols, LogWidthCounts* widths);

// AddEscapedErrors<F32Elem> for every element by AVX2 (the same sums).
// REQUIRES: LogSimdAvailable(); sums' error fields reset.
void EscapedErrorSumsF32Avx2(const std::byte* values, const std::byte* recon, const int32_t* index,
                             const uint32_t* symbols, uint32_t limit, uint64_t n, LogIndexSums* sums);

// Step 1b's candidates by AVX2: bit l of masks[g] is set when element
// i = 8 g + l has a level (index[i] neither kNoIndex nor kZeroIndex), its
// base has an index and base_index[i] + shift != index[i] (in int32
// arithmetic: a sum that wraps is outside the int32 range step 1b keeps).
// A clear bit is an element step 1b leaves as it is. masks holds
// (n + 7) / 8 bytes. REQUIRES: LogSimdAvailable().
void MovedLevelMasksAvx2(const int32_t* index, const int32_t* base_index, int32_t shift, uint64_t n,
                         uint8_t* masks);

// Step 1b by AVX2 for f32 elements: KeepPredictedLevel<F32Elem> for every
// element whose bit is set in masks (MovedLevelMasksAvx2's), with the same
// results; a group of 8 with a level outside the normal floats, or an index
// near the int32 limits, runs the scalar element. Returns whether any
// element changed. REQUIRES: LogSimdAvailable(); table built from grid.
bool KeepPredictedLevelsF32Avx2(const LogGrid& grid, const LogFractionTable& table, const std::byte* values,
                                const int32_t* base_index, int64_t origin, int32_t shift, double bound, uint64_t n,
                                int32_t* index, std::byte* recon, const uint8_t* masks);

// KeepPredictedLevelsF32Avx2 by AVX-512, sixteen lanes at a time (the
// level's bits by register permutes instead of a gather), with the same
// results. REQUIRES: LogAvx512Available(), table.has_small and built from
// grid.
bool KeepPredictedLevelsF32Avx512(const LogGrid& grid, const LogFractionTable& table, const std::byte* values,
                                  const int32_t* base_index, int64_t origin, int32_t shift, double bound, uint64_t n,
                                  int32_t* index, std::byte* recon, const uint8_t* masks);

// Step 2b's candidates by AVX2 (f32 elements): bit l of masks[g] is set
// when element i = 8 g + l has symbols[i] <= kSymbolZero and base bits 0
// (+0.0). masks holds (n + 7) / 8 bytes. REQUIRES: LogSimdAvailable().
void ZeroCarryMasksF32Avx2(const uint32_t* symbols, const std::byte* base, uint64_t n, uint8_t* masks);

// Step 4 by AVX2: the positions (ascending) of the symbols above `limit`
// (escaped); returns their number. REQUIRES: LogSimdAvailable().
uint64_t ListEscapesAvx2(const uint32_t* symbols, uint64_t n, uint32_t limit, uint32_t* positions);

// Step 4 by AVX2: packs n symbols of `bits` bits (symbol i at bits
// [i bits, (i + 1) bits) of a little-endian bit string, the last byte
// padded with zeros), each symbol above 2^bits - 1 as 0; returns how many
// packed symbols are kSymbolZero.
// REQUIRES: LogSimdAvailable(), bits <= kMaxPackSimdBits, out writable for
// kPackSimdSlack bytes past the packed size.
inline constexpr uint32_t kMaxPackSimdBits = 16;
inline constexpr size_t kPackSimdSlack = 16;
uint64_t PackSymbolsAvx2(const uint32_t* symbols, uint64_t n, uint32_t bits, std::byte* out);

// The decode of an f32 delta frame by AVX-512: out[i] =
// DecodeLogElement<F32Elem>(grid, symbol i, base, i, origin, shift, zero_carry) for
// i < n, the symbols `bits` wide in `packed` (the layout of step 4). Groups
// of 16 with a lane for the general path (a subnormal base or one >= 2^126,
// a value outside the normal range) run DecodeLogElement.
// REQUIRES: LogAvx512Available(), table.has_small and built from grid,
// |origin| < kMaxVectorOrigin, |shift| <= kMaxShift, 1 <= bits <= 24,
// packed readable for 8 bytes past its packed size.
inline constexpr int64_t kMaxVectorOrigin = int64_t{1} << 28;
// A key frame's decode through its table of all 2^bits symbols' elements by
// AVX-512: out[i] = table[symbol i] for i < n.
// REQUIRES: LogAvx512Available(), 1 <= bits <= 24, table has 2^bits
// entries, packed readable for 8 bytes past its packed size.
void DecodeKeyTableF32Avx512(const uint32_t* table, const std::byte* packed, uint32_t bits, uint64_t n,
                             std::byte* out);
// The widest symbols the AVX2 decodes unpack a group of 8 of in one vector
// (two 64-bit windows; wider ones are read one at a time).
inline constexpr uint32_t kMaxAvx2UnpackBits = 15;
// DecodeKeyTableF32Avx512 by AVX2.
// REQUIRES: LogSimdAvailable(), 1 <= bits <= kMaxAvx2UnpackBits, table has
// 2^bits entries, packed readable for 8 bytes past its packed size.
void DecodeKeyTableF32Avx2(const uint32_t* table, const std::byte* packed, uint32_t bits, uint64_t n,
                           std::byte* out);
void DecodeDeltaF32Avx512(const LogGrid& grid, const LogFractionTable& table, const std::byte* packed, uint32_t bits,
                          int64_t origin, int64_t shift, bool zero_carry, const std::byte* base, uint64_t n,
                          std::byte* out);
// The two AVX-512 decodes read their symbols through this: `groups` groups
// of 16 `bits`-wide symbols (2 * bits bytes each) from `packed` into
// `out`, by byte permutes with `vbmi` (AVX-512 VBMI), else by gathers. The
// decodes take the permutes where the CPU has VBMI; tests compare both.
// REQUIRES: LogAvx512Available() (and LogVbmiAvailable() for vbmi),
// 1 <= bits <= 24, packed readable for 8 bytes past the groups.
bool LogVbmiAvailable();
void UnpackSymbolGroupsAvx512(const std::byte* packed, uint32_t bits, uint64_t groups, uint32_t* out, bool vbmi);
// DecodeDeltaF32Avx512 by AVX2 (groups of 8; gathers instead of permutes,
// so any table serves). REQUIRES: LogSimdAvailable(), table built from
// grid, |origin| < kMaxVectorOrigin, |shift| <= kMaxShift, 1 <= bits <= 24,
// packed readable for 8 bytes past its packed size.
void DecodeDeltaF32Avx2(const LogGrid& grid, const LogFractionTable& table, const std::byte* packed, uint32_t bits,
                        int64_t origin, int64_t shift, bool zero_carry, const std::byte* base, uint64_t n,
                        std::byte* out);

}  // namespace ckptfs::lossy
