// AVX2 paths of the CPU kernels for f32, f16 and bf16 (see kernels_cpu_simd.h). Compiled
// with -ffp-contract=off like the rest of the codec; the intrinsics used are
// plain IEEE adds, subtracts, multiplies, compares and conversions, so the
// results equal the scalar reference bit for bit.
#include "codec/tensor/lossy/kernels_cpu_simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "codec/common/simd_level.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

void BuildLookup(const QuantizeTable& t, LevelLookup* lut) {
  for (uint32_t j = 0; j < kMaxLevels + kProbe; ++j) {
    lut->bounds[j] = j < kMaxLevels ? t.bounds[j] : BitsFloat(kNonFiniteBits);
    lut->levels[j] = j < kMaxLevels ? t.levels[j] : 0.0f;
  }
  lut->symbol_values[0] = 0.0f;
  for (uint32_t s = 1; s < 256; ++s) lut->symbol_values[s] = t.levels[s - 1];
  std::fill(std::begin(lut->start), std::end(lut->start), 0);
  lut->probe_ok = true;
  lut->max_span = 0;
  lut->max_start = 0;
  lut->bounds_ascend = !std::isnan(t.bounds[0]);
  for (uint32_t j = 0; j + 1 < kMaxLevels; ++j)
    if (!(t.bounds[j] <= t.bounds[j + 1])) lut->bounds_ascend = false;
  const uint32_t prune_key = t.prune_below >> kHistogramShift;
  const uint32_t exact_key =
      std::min<uint32_t>(kMagnitudeBins, (t.exact_from + (1u << kHistogramShift) - 1) >> kHistogramShift);
  if (t.num_levels == 0) return;  // nothing is quantized
  for (uint32_t mag_key = prune_key; mag_key < exact_key; ++mag_key) {
    for (uint32_t sign : {0u, kMagnitudeBins}) {
      const uint32_t key = mag_key | sign;
      const float a = BitsFloat(key << kHistogramShift);
      const float b = BitsFloat((key << kHistogramShift) | ((1u << kHistogramShift) - 1));
      const uint32_t lo = NearestLevel(t.bounds, sign ? b : a);
      const uint32_t hi = NearestLevel(t.bounds, sign ? a : b);
      lut->start[key] = static_cast<int32_t>(lo);
      if (hi - lo > kProbe) lut->probe_ok = false;
      lut->max_span = std::max(lut->max_span, hi - lo);
      lut->max_start = std::max(lut->max_start, lo);
    }
  }
}

LevelFind ChooseLevelFind(const QuantizeTable& t, const LevelLookup& lut, uint32_t register_entries) {
  if (t.num_levels >= 1 && t.num_levels <= kCompareLevels && lut.bounds_ascend &&
      t.bounds[t.num_levels - 1] == std::numeric_limits<float>::infinity())
    return LevelFind::kCompare;
  // The largest bound index is max_start + probes - 1, the largest level
  // index max_start + probes.
  if (lut.max_start + ProbesFor(lut.max_span) < register_entries) return LevelFind::kRegisters;
  return LevelFind::kGather;
}

#if defined(__x86_64__)

// F16C (half <-> float conversion instructions) comes with every AVX2 CPU;
// checked with CPUID (leaf 1, ECX bit 29) because not every compiler's
// __builtin_cpu_supports knows "f16c". Once per process: CPUID traps to
// the hypervisor on a virtual machine (tens of microseconds), and every
// new lossy scratch asks (it was 4-6 % of a deep chain decode's time).
bool SimdAvailable() {
  static const bool available = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return CpuHasSimd(SimdLevel::kAvx2) && f16c;
  }();
  return available;
}

namespace {

#define CKPTFS_AVX2 __attribute__((target("avx2,f16c"), always_inline)) inline

// Vector element traits: 8 elements held as 32-bit lanes (16-bit types
// zero-extended). ToFloat/FromFloat are the lane-wise versions of the
// element_ops.h functions, with the same results bit for bit.
struct F32V {
  using Bits = uint32_t;
  static CKPTFS_AVX2 __m256i Load(const Bits* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static CKPTFS_AVX2 void Store(Bits* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static CKPTFS_AVX2 __m256 ToFloat(__m256i b) { return _mm256_castsi256_ps(b); }
  static CKPTFS_AVX2 __m256i FromFloat(__m256 f) { return _mm256_castps_si256(f); }
};

struct Half16 {
  using Bits = uint16_t;
  static CKPTFS_AVX2 __m256i Load(const Bits* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static CKPTFS_AVX2 void Store(Bits* p, __m256i v) {
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

struct BF16V : Half16 {
  static CKPTFS_AVX2 __m256 ToFloat(__m256i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)); }
  static CKPTFS_AVX2 __m256i FromFloat(__m256 f) {
    const __m256i bits = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(static_cast<int32_t>(kNonFiniteBits)));
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, nan, is_nan);
  }
};

// With F16C: VCVTPH2PS converts every half exactly (subnormals included),
// like HalfToFloat, except that it quiets a signalling NaN; HalfToFloat keeps
// NaN payloads bit for bit, so NaN lanes are rebuilt. VCVTPS2PH with
// round-to-nearest-even equals FloatToHalf: overflow to +-Inf, subnormal
// results rounded (not flushed: FTZ applies to arithmetic results only, and
// the codec never sets it), and NaN to a quiet NaN with the top 10 mantissa
// bits, i.e. 0x7e00 | (bits >> 13 & 0x3ff) with the sign. The exhaustive
// checks in lossy_kernels_test.cc compare both with element_ops.h.
struct F16V : Half16 {
  static CKPTFS_AVX2 __m256 ToFloat(__m256i h) {
    const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m256i converted = _mm256_castps_si256(_mm256_cvtph_ps(halves));
    const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
    const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7c00));
    const __m256i nan = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_set1_epi32(0x7f800000)),
        _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x3ff)), 13));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(converted, nan, is_nan));
  }
  static CKPTFS_AVX2 __m256i FromFloat(__m256 f) {
    return _mm256_cvtepu16_epi32(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// LevelFind::kRegisters: two 8-entry permutes, the index's bit 3 picking
// one.
inline constexpr uint32_t kAvx2RegisterEntries = 16;

struct RegisterTable {
  __m256 lo, hi;
};

__attribute__((target("avx2"), always_inline)) inline RegisterTable LoadRegisterTable(const float* table) {
  return {_mm256_load_ps(table), _mm256_load_ps(table + 8)};
}

// table[index] for indices under 16.
__attribute__((target("avx2"), always_inline)) inline __m256 LookupRegisters(const RegisterTable& t, __m256i index) {
  const __m256 low = _mm256_permutevar8x32_ps(t.lo, index), high = _mm256_permutevar8x32_ps(t.hi, index);
  return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
}

// kProbes: how many bounds past the bin's start are compared; enough when
// it is at least the table's max_span (bounds beyond never compare below r).
template <typename V, typename E, uint32_t kProbes, LevelFind kFind>
__attribute__((target("avx2,f16c"))) void QuantizeBlockAvx2(const QuantizeTable& t, const LevelLookup& lut,
                                                       const typename V::Bits* values, const typename V::Bits* base,
                                                       uint64_t start, uint64_t end, const float* residual,
                                                       uint8_t* symbols, typename V::Bits* recon, double* lanes,
                                                       double* max_err, uint64_t* pruned, uint64_t* exact) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i exact_lim = _mm256_set1_epi32(static_cast<int32_t>(t.exact_from) - 1);
  const __m256i prune_lim = _mm256_set1_epi32(static_cast<int32_t>(t.prune_below));
  const __m256i no_levels = _mm256_set1_epi32(t.num_levels == 0 ? -1 : 0);
  const __m256i non_finite = _mm256_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i byte_pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                             -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256d sign_pd = _mm256_set1_pd(-0.0);
  const RegisterTable bounds = LoadRegisterTable(lut.bounds), levels = LoadRegisterTable(lut.levels);
  __m256 bound_each[kCompareLevels - 1];
  const uint32_t bound_count = kFind == LevelFind::kCompare ? t.num_levels - 1 : 0;
  for (uint32_t j = 0; j < bound_count; ++j) bound_each[j] = _mm256_set1_ps(t.bounds[j]);
  __m256d acc[8];
  for (int v = 0; v < 8; ++v) acc[v] = _mm256_loadu_pd(lanes + 4 * v);
  __m256d vmax = _mm256_set1_pd(*max_err);
  uint64_t n_pruned = 0, n_exact = 0;
  uint64_t i = start;
  for (; i + kReduceLanes <= end; i += kReduceLanes) {
    for (uint32_t o = 0; o < kReduceLanes; o += 8) {
      const uint64_t at = i + o;
      const __m256i rb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(residual + at));
      const __m256 rv = _mm256_castsi256_ps(rb);
      const __m256i xb = V::Load(values + at);
      const __m256i bb = base ? V::Load(base + at) : _mm256_setzero_si256();
      const __m256i mag = _mm256_and_si256(rb, abs_mask);
      const __m256i is_exact = _mm256_cmpgt_epi32(mag, exact_lim);
      const __m256i is_pruned =
          _mm256_andnot_si256(is_exact, _mm256_or_si256(_mm256_cmpgt_epi32(prune_lim, mag), no_levels));
      __m256i k = _mm256_setzero_si256();
      if constexpr (kFind == LevelFind::kCompare) {
        for (uint32_t j = 0; j < bound_count; ++j)
          k = _mm256_sub_epi32(k, _mm256_castps_si256(_mm256_cmp_ps(bound_each[j], rv, _CMP_LT_OQ)));
      } else {
        const __m256i first = _mm256_i32gather_epi32(lut.start, _mm256_srli_epi32(rb, kHistogramShift), 4);
        k = first;
        for (uint32_t p = 0; p < kProbes; ++p) {
          const __m256 bound =
              kFind == LevelFind::kRegisters
                  ? LookupRegisters(bounds, _mm256_add_epi32(first, _mm256_set1_epi32(static_cast<int>(p))))
                  : _mm256_i32gather_ps(lut.bounds + p, first, 4);
          k = _mm256_sub_epi32(k, _mm256_castps_si256(_mm256_cmp_ps(bound, rv, _CMP_LT_OQ)));
        }
      }
      const __m256 level =
          kFind == LevelFind::kGather ? _mm256_i32gather_ps(lut.levels, k, 4) : LookupRegisters(levels, k);
      const __m256 bf = base ? V::ToFloat(bb) : _mm256_setzero_ps();
      const __m256i q = V::FromFloat(_mm256_add_ps(bf, level));
      __m256i out = _mm256_blendv_epi8(q, bb, is_pruned);
      out = _mm256_blendv_epi8(out, xb, is_exact);
      V::Store(recon + at, out);
      const __m256i sym = _mm256_andnot_si256(_mm256_or_si256(is_exact, is_pruned), _mm256_add_epi32(k, one));
      const __m256i picked = _mm256_shuffle_epi8(sym, byte_pick);
      const uint32_t sym_lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(picked)));
      const uint32_t sym_hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(picked, 1)));
      std::memcpy(symbols + (at - start), &sym_lo, 4);
      std::memcpy(symbols + (at - start) + 4, &sym_hi, 4);
      n_pruned += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(is_pruned))));
      n_exact += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(is_exact))));

      const __m256 xf = V::ToFloat(xb), of = V::ToFloat(out);
      const __m256i finite = _mm256_cmpgt_epi32(non_finite, _mm256_and_si256(_mm256_castps_si256(xf), abs_mask));
      const __m256d e_lo =
          _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(of)), _mm256_cvtps_pd(_mm256_castps256_ps128(xf)));
      const __m256d e_hi =
          _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(of, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1)));
      const __m256d m_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(finite)));
      const __m256d m_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(finite, 1)));
      acc[o / 4] = _mm256_add_pd(acc[o / 4], _mm256_and_pd(_mm256_mul_pd(e_lo, e_lo), m_lo));
      acc[o / 4 + 1] = _mm256_add_pd(acc[o / 4 + 1], _mm256_and_pd(_mm256_mul_pd(e_hi, e_hi), m_hi));
      vmax = _mm256_max_pd(vmax, _mm256_and_pd(_mm256_andnot_pd(sign_pd, e_lo), m_lo));
      vmax = _mm256_max_pd(vmax, _mm256_and_pd(_mm256_andnot_pd(sign_pd, e_hi), m_hi));
    }
  }
  for (int v = 0; v < 8; ++v) _mm256_storeu_pd(lanes + 4 * v, acc[v]);
  double m[4];
  _mm256_storeu_pd(m, vmax);
  double mx = std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
  // The tail (fewer than 32 elements, only in the chunk's last block).
  for (; i < end; ++i) {
    const typename E::Bits x = values[i], b = base ? base[i] : typename E::Bits{0};
    const float r = residual[i];
    const uint32_t mag = FloatBits(r) & 0x7fffffffu;
    const bool is_exact = mag >= t.exact_from;
    const bool is_pruned = !is_exact && (mag < t.prune_below || t.num_levels == 0);
    const uint32_t k = LookupLevel(lut, r);
    const float bf = base ? E::ToFloat(b) : 0.0f;
    const typename E::Bits out = is_exact ? x : (is_pruned ? b : E::FromFloat(bf + lut.levels[k]));
    symbols[i - start] = static_cast<uint8_t>((is_exact || is_pruned) ? 0u : k + 1);
    recon[i] = out;
    n_pruned += is_pruned;
    n_exact += is_exact;
    double abs_err;
    lanes[i % kReduceLanes] += SquaredError<E>(x, out, &abs_err);
    mx = std::max(mx, abs_err);
  }
  *max_err = mx;
  *pruned += n_pruned;
  *exact += n_exact;
}

template <typename V, typename E>
__attribute__((target("avx2,f16c"))) void ResidualBlockAvx2(const typename V::Bits* values, const typename V::Bits* base,
                                                       uint64_t start, uint64_t end, float* residual, double* lanes) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i non_finite = _mm256_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  __m256d acc[8];
  for (int v = 0; v < 8; ++v) acc[v] = _mm256_loadu_pd(lanes + 4 * v);
  uint64_t i = start;
  for (; i + kReduceLanes <= end; i += kReduceLanes) {
    for (uint32_t o = 0; o < kReduceLanes; o += 8) {
      const uint64_t at = i + o;
      const __m256 x = V::ToFloat(V::Load(values + at));
      const __m256 r = base ? _mm256_sub_ps(x, V::ToFloat(V::Load(base + at))) : x;
      _mm256_storeu_ps(residual + at, r);
      const __m256i finite = _mm256_cmpgt_epi32(non_finite, _mm256_and_si256(_mm256_castps_si256(x), abs_mask));
      const __m256d d_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
      const __m256d d_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      const __m256d m_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(finite)));
      const __m256d m_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(finite, 1)));
      acc[o / 4] = _mm256_add_pd(acc[o / 4], _mm256_and_pd(_mm256_mul_pd(d_lo, d_lo), m_lo));
      acc[o / 4 + 1] = _mm256_add_pd(acc[o / 4 + 1], _mm256_and_pd(_mm256_mul_pd(d_hi, d_hi), m_hi));
    }
  }
  for (int v = 0; v < 8; ++v) _mm256_storeu_pd(lanes + 4 * v, acc[v]);
  for (; i < end; ++i) {
    const float x = E::ToFloat(values[i]);
    residual[i] = base ? x - E::ToFloat(base[i]) : x;
    lanes[i % kReduceLanes] += FiniteSquare(x);
  }
}

template <typename V, typename E>
__attribute__((target("avx2,f16c"))) void DequantizeAvx2(const LevelLookup& lut, uint32_t bits, const uint8_t* packed,
                                                    const typename V::Bits* base, uint64_t g0, uint64_t groups,
                                                    typename V::Bits* out, uint32_t* max_symbol) {
  const int64_t b = bits;
  const __m256i shift_lo = _mm256_setr_epi64x(0, b, 2 * b, 3 * b);
  const __m256i shift_hi = _mm256_setr_epi64x(4 * b, 5 * b, 6 * b, 7 * b);
  const __m256i mask = _mm256_set1_epi64x((int64_t{1} << bits) - 1);
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  // Symbols of up to 4 bits look their values up in registers (the same
  // entries as the gathers).
  const bool in_registers = bits <= 4;
  const RegisterTable values = LoadRegisterTable(lut.symbol_values);
  __m256i vmax = _mm256_setzero_si256();
  for (uint64_t g = g0; g < g0 + groups; ++g) {
    uint64_t word;
    std::memcpy(&word, packed + g * bits, 8);
    const __m256i w = _mm256_set1_epi64x(static_cast<int64_t>(word));
    const __m256i s_lo = _mm256_and_si256(_mm256_srlv_epi64(w, shift_lo), mask);
    const __m256i s_hi = _mm256_and_si256(_mm256_srlv_epi64(w, shift_hi), mask);
    const __m256i sym = _mm256_set_m128i(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(s_hi, even)),
                                         _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(s_lo, even)));
    const __m256 vals = in_registers ? LookupRegisters(values, sym)
                                     : _mm256_set_m128(_mm256_i64gather_ps(lut.symbol_values, s_hi, 4),
                                                       _mm256_i64gather_ps(lut.symbol_values, s_lo, 4));
    vmax = _mm256_max_epu32(vmax, sym);
    const __m256i bb = base ? V::Load(base + g * kPackGroup) : _mm256_setzero_si256();
    const __m256 bf = base ? V::ToFloat(bb) : _mm256_setzero_ps();
    const __m256i q = V::FromFloat(_mm256_add_ps(bf, vals));
    const __m256i zero = _mm256_cmpeq_epi32(sym, _mm256_setzero_si256());
    V::Store(out + g * kPackGroup, _mm256_blendv_epi8(q, bb, zero));
  }
  uint32_t m[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(m), vmax);
  uint32_t mx = *max_symbol;
  for (uint32_t v : m) mx = std::max(mx, v);
  *max_symbol = mx;
}

template <typename Bits>
__attribute__((target("avx2,f16c"))) uint64_t CompactExactAvx2(uint32_t exact_from, const Bits* values,
                                                          const float* residual, uint64_t n, uint32_t* positions,
                                                          Bits* raw) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i lim = _mm256_set1_epi32(static_cast<int32_t>(exact_from) - 1);
  uint64_t k = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i rb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(residual + i));
    uint32_t mask = static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_and_si256(rb, abs_mask), lim))));
    while (mask != 0) {
      const uint32_t j = static_cast<uint32_t>(__builtin_ctz(mask));
      positions[k] = static_cast<uint32_t>(i + j);
      raw[k] = values[i + j];
      ++k;
      mask &= mask - 1;
    }
  }
  for (; i < n; ++i) {
    if ((FloatBits(residual[i]) & 0x7fffffffu) < exact_from) continue;
    positions[k] = static_cast<uint32_t>(i);
    raw[k] = values[i];
    ++k;
  }
  return k;
}

// Calls f.template operator()<V, E>() for the element type.
template <typename F>
void WithVector(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kF32: return f.template operator()<F32V, F32Elem>();
    case ElementType::kF16: return f.template operator()<F16V, F16Elem>();
    case ElementType::kBF16: return f.template operator()<BF16V, BF16Elem>();
  }
}

}  // namespace

void QuantizeBlockSimd(ElementType type, const QuantizeTable& t, const LevelLookup& lut, const void* values,
                       const void* base, uint64_t start, uint64_t end, const float* residual, uint8_t* symbols,
                       void* recon, double* lanes, double* max_err, uint64_t* pruned, uint64_t* exact) {
  WithVector(type, [&]<typename V, typename E>() {
    using Bits = typename V::Bits;
    WithLevelFind(t, lut, kAvx2RegisterEntries, [&]<uint32_t kProbes, LevelFind kFind>() {
      QuantizeBlockAvx2<V, E, kProbes, kFind>(t, lut, static_cast<const Bits*>(values), static_cast<const Bits*>(base),
                                              start, end, residual, symbols, static_cast<Bits*>(recon), lanes, max_err,
                                              pruned, exact);
    });
  });
}

void ResidualBlockSimd(ElementType type, const void* values, const void* base, uint64_t start, uint64_t end,
                       float* residual, double* lanes) {
  WithVector(type, [&]<typename V, typename E>() {
    using Bits = typename V::Bits;
    ResidualBlockAvx2<V, E>(static_cast<const Bits*>(values), static_cast<const Bits*>(base), start, end, residual,
                            lanes);
  });
}

uint64_t CompactExactSimd(ElementType type, uint32_t exact_from, const void* values, const float* residual, uint64_t n,
                          uint32_t* positions, void* raw) {
  uint64_t k = 0;
  WithVector(type, [&]<typename V, typename E>() {
    using Bits = typename V::Bits;
    k = CompactExactAvx2<Bits>(exact_from, static_cast<const Bits*>(values), residual, n, positions,
                               static_cast<Bits*>(raw));
  });
  return k;
}

void DequantizeSimd(ElementType type, const LevelLookup& lut, uint32_t bits, const uint8_t* packed, const void* base,
                    uint64_t g0, uint64_t groups, void* out, uint32_t* max_symbol) {
  WithVector(type, [&]<typename V, typename E>() {
    using Bits = typename V::Bits;
    DequantizeAvx2<V, E>(lut, bits, packed, static_cast<const Bits*>(base), g0, groups, static_cast<Bits*>(out),
                         max_symbol);
  });
}

__attribute__((target("bmi2"))) static void PackWithPext(const uint8_t* symbols, uint64_t count, uint32_t bits,
                                                         std::byte* out) {
  const uint64_t mask = ((uint64_t{1} << bits) - 1) * 0x0101010101010101ull;
  // A group stores a whole word while the groups after it cover its bytes
  // past `bits` (they overwrite them): a store of a variable size is a call
  // to memmove per group (it was a tenth of a key frame's decode). The last
  // groups, 8 bytes of output, store exactly.
  const uint64_t groups = count / kPackGroup;
  const uint64_t exact_groups = std::min<uint64_t>(groups, (8 + bits - 1) / bits);
  const uint64_t word_end = (groups - exact_groups) * kPackGroup;
  for (uint64_t g = 0; g < count; g += kPackGroup) {
    uint64_t word;
    std::memcpy(&word, symbols + g, 8);
    const uint64_t packed = _pext_u64(word, mask);  // symbol j lands at bit j * bits
    if (g < word_end) {
      std::memcpy(out, &packed, 8);
    } else {
      std::memcpy(out, &packed, bits);
    }
    out += bits;
  }
}

bool PackGroupsBmi2(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out) {
  if (!__builtin_cpu_supports("bmi2")) return false;
  PackWithPext(symbols, count, bits, out);
  return true;
}

__attribute__((target("bmi2"))) static void UnpackWithPdep(const std::byte* packed, uint64_t count, uint32_t bits,
                                                           uint8_t* out) {
  const uint64_t mask = ((uint64_t{1} << bits) - 1) * 0x0101010101010101ull;
  // A group loads a whole word (PDEP takes only its low 8 * bits bits):
  // the last groups, within 8 bytes of the packed end, load exactly, so
  // nothing past the packed bytes is read.
  const uint64_t groups = count / kPackGroup;
  const uint64_t exact_groups = std::min<uint64_t>(groups, (8 + bits - 1) / bits);
  const uint64_t word_end = (groups - exact_groups) * kPackGroup;
  for (uint64_t g = 0; g < count; g += kPackGroup, packed += bits) {
    uint64_t word = 0;
    if (g < word_end) {
      std::memcpy(&word, packed, 8);
    } else {
      std::memcpy(&word, packed, bits);
    }
    const uint64_t symbols = _pdep_u64(word, mask);  // symbol j to byte j
    std::memcpy(out + g, &symbols, 8);
  }
}

bool UnpackGroupsBmi2(const std::byte* packed, uint64_t count, uint32_t bits, uint8_t* out) {
  if (!__builtin_cpu_supports("bmi2")) return false;
  UnpackWithPdep(packed, count, bits, out);
  return true;
}

#else  // not x86-64: the scalar paths are used

bool SimdAvailable() { return false; }
bool PackGroupsBmi2(const uint8_t*, uint64_t, uint32_t, std::byte*) { return false; }
bool UnpackGroupsBmi2(const std::byte*, uint64_t, uint32_t, uint8_t*) { return false; }
void QuantizeBlockSimd(ElementType, const QuantizeTable&, const LevelLookup&, const void*, const void*, uint64_t,
                       uint64_t, const float*, uint8_t*, void*, double*, double*, uint64_t*, uint64_t*) {}
void ResidualBlockSimd(ElementType, const void*, const void*, uint64_t, uint64_t, float*, double*) {}
uint64_t CompactExactSimd(ElementType, uint32_t, const void*, const float*, uint64_t, uint32_t*, void*) { return 0; }
void DequantizeSimd(ElementType, const LevelLookup&, uint32_t, const uint8_t*, const void*, uint64_t, uint64_t, void*,
                    uint32_t*) {}

#endif

}  // namespace ckptfs::lossy
