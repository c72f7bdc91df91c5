// The AVX-512 quantize pass for f32 (see kernels_cpu_simd.h): sixteen
// elements per vector, the classes as mask registers, the probes as masked
// increments. The operations are those of the AVX2 pass (IEEE adds,
// subtracts, multiplies and compares, no FMA), the squared errors are added
// into the same 32 lanes in element order, and the max keeps the scalar
// rule (a NaN error never replaces the running max), so every output equals
// the scalar reference bit for bit.
#include <algorithm>
#include <cstring>

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/kernels_cpu_simd.h"

#if defined(__x86_64__)
CKPTFS_BEGIN_AVX512_CODE  // (GCC bug 105593: codec/common/simd_level.h)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

#if defined(__x86_64__)

bool QuantizeAvx512Available() { return CpuHasSimd(SimdLevel::kAvx512); }

namespace {

#define CKPTFS_Q512 __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline

// Elements 8..15 (AVX-512 F only: no DQ extract).
CKPTFS_Q512 __m256 UpperHalf(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// LevelFind::kRegisters (kernels_cpu_simd.h): a two-register permute.
inline constexpr uint32_t kAvx512RegisterEntries = 32;

struct Consts512 {
  __m512i abs_mask, exact_from, prune_below, non_finite, one;
  __mmask16 no_levels;
  // The first 32 bounds and levels, for tables that fit them (kRegisters,
  // kCompare).
  __m512 bounds_lo, bounds_hi, levels_lo, levels_hi;
  // kCompare: the table's bounds, each in every lane.
  __m512 bound[kCompareLevels - 1];
  uint32_t bound_count = 0;
};

// The squared errors of sixteen reconstructed elements `out` of values
// `xb` into acc_lo (the first eight lanes) and acc_hi, and their running
// max abs error, over the finite values.
CKPTFS_Q512 void AddErrors16(__m512i xb, __m512i out, __m512i abs_mask, __m512i non_finite, __m512d* acc_lo,
                             __m512d* acc_hi, __m512d* vmax) {
  const __mmask16 finite = _mm512_cmplt_epu32_mask(_mm512_and_si512(xb, abs_mask), non_finite);
  const __m512 xf = _mm512_castsi512_ps(xb), of = _mm512_castsi512_ps(out);
  const __m512d e_lo = _mm512_sub_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(of)),
                                     _mm512_cvtps_pd(_mm512_castps512_ps256(xf)));
  const __m512d e_hi = _mm512_sub_pd(_mm512_cvtps_pd(UpperHalf(of)), _mm512_cvtps_pd(UpperHalf(xf)));
  const __mmask8 fin_lo = static_cast<__mmask8>(finite), fin_hi = static_cast<__mmask8>(finite >> 8);
  // Non-finite lanes add +0.0 (as the reference does), not nothing.
  *acc_lo = _mm512_add_pd(*acc_lo, _mm512_maskz_mov_pd(fin_lo, _mm512_mul_pd(e_lo, e_lo)));
  *acc_hi = _mm512_add_pd(*acc_hi, _mm512_maskz_mov_pd(fin_hi, _mm512_mul_pd(e_hi, e_hi)));
  // max_pd(a, b) is a > b ? a : b: the reference's update with a = |e|.
  *vmax = _mm512_max_pd(_mm512_maskz_mov_pd(fin_lo, _mm512_abs_pd(e_lo)), *vmax);
  *vmax = _mm512_max_pd(_mm512_maskz_mov_pd(fin_hi, _mm512_abs_pd(e_hi)), *vmax);
}

// Stores the four accumulators into lanes[0..32) and returns the largest
// lane of vmax (the scalar rule: a later lane replaces it only if larger).
CKPTFS_Q512 double StoreErrorLanes(const __m512d* acc, __m512d vmax, double* lanes) {
  for (int v = 0; v < 4; ++v) _mm512_storeu_pd(lanes + 8 * v, acc[v]);
  alignas(64) double m[8];
  _mm512_store_pd(m, vmax);
  double mx = m[0];
  for (int l = 1; l < 8; ++l) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

// Sixteen elements at `at`: symbols, reconstruction, and the errors into
// acc_lo (lanes of the first eight) and acc_hi (the next eight).
template <uint32_t kProbes, LevelFind kFind>
CKPTFS_Q512 void Quantize16(const Consts512& c, const LevelLookup& lut, const uint32_t* values, const uint32_t* base,
                            const float* residual, uint64_t at, uint8_t* symbols, uint32_t* recon, __m512d* acc_lo,
                            __m512d* acc_hi, __m512d* vmax, uint64_t* n_pruned, uint64_t* n_exact) {
  const __m512i rb = _mm512_loadu_si512(residual + at);
  const __m512 rv = _mm512_castsi512_ps(rb);
  const __m512i xb = _mm512_loadu_si512(values + at);
  const __m512i bb = base ? _mm512_loadu_si512(base + at) : _mm512_setzero_si512();
  const __m512i mag = _mm512_and_si512(rb, c.abs_mask);
  const __mmask16 is_exact = _mm512_cmpge_epu32_mask(mag, c.exact_from);
  const __mmask16 is_pruned =
      static_cast<__mmask16>(~is_exact & (_mm512_cmplt_epu32_mask(mag, c.prune_below) | c.no_levels));
  __m512i k = _mm512_setzero_si512();
  if constexpr (kFind == LevelFind::kCompare) {
    for (uint32_t j = 0; j < c.bound_count; ++j)
      k = _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(c.bound[j], rv, _CMP_LT_OQ), k, c.one);
  } else {
    const __m512i first = _mm512_i32gather_epi32(_mm512_srli_epi32(rb, kHistogramShift), lut.start, 4);
    k = first;
    for (uint32_t p = 0; p < kProbes; ++p) {
      const __m512 bound =
          kFind == LevelFind::kRegisters
              ? _mm512_permutex2var_ps(c.bounds_lo, _mm512_add_epi32(first, _mm512_set1_epi32(static_cast<int>(p))),
                                       c.bounds_hi)
              : _mm512_i32gather_ps(first, lut.bounds + p, 4);
      k = _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(bound, rv, _CMP_LT_OQ), k, c.one);
    }
  }
  const __m512 level = kFind == LevelFind::kGather ? _mm512_i32gather_ps(k, lut.levels, 4)
                                                   : _mm512_permutex2var_ps(c.levels_lo, k, c.levels_hi);
  const __m512 bf = base ? _mm512_castsi512_ps(bb) : _mm512_setzero_ps();
  const __m512i q = _mm512_castps_si512(_mm512_add_ps(bf, level));
  __m512i out = _mm512_mask_blend_epi32(is_pruned, q, bb);
  out = _mm512_mask_blend_epi32(is_exact, out, xb);
  _mm512_storeu_si512(recon + at, out);
  const __m512i sym = _mm512_maskz_add_epi32(static_cast<__mmask16>(~(is_exact | is_pruned)), k, c.one);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(symbols), _mm512_cvtepi32_epi8(sym));
  *n_pruned += static_cast<uint64_t>(__builtin_popcount(is_pruned));
  *n_exact += static_cast<uint64_t>(__builtin_popcount(is_exact));

  AddErrors16(xb, out, c.abs_mask, c.non_finite, acc_lo, acc_hi, vmax);
}

template <uint32_t kProbes, LevelFind kFind>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void QuantizeF32Avx512(
    const QuantizeTable& t, const LevelLookup& lut, const uint32_t* values, const uint32_t* base, uint64_t start,
    uint64_t end, const float* residual, uint8_t* symbols, uint32_t* recon, double* lanes, double* max_err,
    uint64_t* pruned, uint64_t* exact) {
  Consts512 c;
  c.abs_mask = _mm512_set1_epi32(0x7fffffff);
  c.exact_from = _mm512_set1_epi32(static_cast<int32_t>(t.exact_from));
  c.prune_below = _mm512_set1_epi32(static_cast<int32_t>(t.prune_below));
  c.non_finite = _mm512_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  c.one = _mm512_set1_epi32(1);
  c.no_levels = t.num_levels == 0 ? __mmask16{0xffff} : __mmask16{0};
  c.bounds_lo = _mm512_load_ps(lut.bounds);
  c.bounds_hi = _mm512_load_ps(lut.bounds + 16);
  c.levels_lo = _mm512_load_ps(lut.levels);
  c.levels_hi = _mm512_load_ps(lut.levels + 16);
  if constexpr (kFind == LevelFind::kCompare) {
    c.bound_count = t.num_levels - 1;
    for (uint32_t j = 0; j < c.bound_count; ++j) c.bound[j] = _mm512_set1_ps(t.bounds[j]);
  }
  __m512d acc[4];
  for (int v = 0; v < 4; ++v) acc[v] = _mm512_loadu_pd(lanes + 8 * v);
  __m512d vmax = _mm512_set1_pd(*max_err);
  uint64_t n_pruned = 0, n_exact = 0;
  uint64_t i = start;
  for (; i + kReduceLanes <= end; i += kReduceLanes) {
    Quantize16<kProbes, kFind>(c, lut, values, base, residual, i, symbols + (i - start), recon, &acc[0], &acc[1],
                               &vmax, &n_pruned, &n_exact);
    Quantize16<kProbes, kFind>(c, lut, values, base, residual, i + 16, symbols + (i + 16 - start), recon, &acc[2],
                               &acc[3], &vmax, &n_pruned, &n_exact);
  }
  double mx = StoreErrorLanes(acc, vmax, lanes);
  // The tail (fewer than 32 elements, only in the chunk's last block).
  for (; i < end; ++i) {
    const uint32_t x = values[i], b = base ? base[i] : 0u;
    const float r = residual[i];
    const uint32_t mag = FloatBits(r) & 0x7fffffffu;
    const bool is_exact = mag >= t.exact_from;
    const bool is_pruned = !is_exact && (mag < t.prune_below || t.num_levels == 0);
    const uint32_t k = LookupLevel(lut, r);
    const float bf = base ? F32Elem::ToFloat(b) : 0.0f;
    const uint32_t out = is_exact ? x : (is_pruned ? b : F32Elem::FromFloat(bf + lut.levels[k]));
    symbols[i - start] = static_cast<uint8_t>((is_exact || is_pruned) ? 0u : k + 1);
    recon[i] = out;
    n_pruned += is_pruned;
    n_exact += is_exact;
    double abs_err;
    lanes[i % kReduceLanes] += SquaredError<F32Elem>(x, out, &abs_err);
    mx = abs_err > mx ? abs_err : mx;
  }
  *max_err = mx;
  *pruned += n_pruned;
  *exact += n_exact;
}

}  // namespace

void QuantizeBlockF32Avx512(const QuantizeTable& t, const LevelLookup& lut, const void* values, const void* base,
                            uint64_t start, uint64_t end, const float* residual, uint8_t* symbols, void* recon,
                            double* lanes, double* max_err, uint64_t* pruned, uint64_t* exact) {
  WithLevelFind(t, lut, kAvx512RegisterEntries, [&]<uint32_t kProbes, LevelFind kFind>() {
    QuantizeF32Avx512<kProbes, kFind>(t, lut, static_cast<const uint32_t*>(values), static_cast<const uint32_t*>(base),
                                      start, end, residual, symbols, static_cast<uint32_t*>(recon), lanes, max_err,
                                      pruned, exact);
  });
}

// Eight `bits`-wide symbols of the group at `p` (one little-endian word)
// as the low eight 32-bit lanes.
CKPTFS_Q512 __m256i GroupSymbols(const uint8_t* p, __m512i shifts, __m512i mask) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  const __m512i w = _mm512_set1_epi64(static_cast<int64_t>(word));
  return _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(w, shifts), mask));
}

// Entry (sym mod 64) of the 64 values in t[0..3]; bit5: the lanes whose
// symbol has bit 5 set.
CKPTFS_Q512 __m512 SixtyFour(const __m512* t, __m512i sym, __mmask16 bit5) {
  return _mm512_mask_blend_ps(bit5, _mm512_permutex2var_ps(t[0], sym, t[1]), _mm512_permutex2var_ps(t[2], sym, t[3]));
}

// Packed `bits`-wide symbols (8 per little-endian group) and their values
// (LevelLookup::symbol_values) by register permutes instead of a gather:
// two for up to 64 values, four for 128, eight for 256 (the symbols' bits
// 5, 6 and 7 pick among them). On the AMD EPYC the project is measured
// on, `lossy_bench`'s dequantize of 7-bit symbols ran 8-10 GB/s by gather,
// 23-27 GB/s so.
struct SymbolValues512 {
  __m512i shifts, mask;
  __m512 t[16];
  uint32_t bits, registers;
  CKPTFS_Q512 SymbolValues512(const LevelLookup& lut, uint32_t symbol_bits)
      : bits(symbol_bits), registers(symbol_bits <= 6 ? 4u : symbol_bits == 7 ? 8u : 16u) {
    const int64_t b = bits;
    shifts = _mm512_setr_epi64(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    mask = _mm512_set1_epi64((int64_t{1} << bits) - 1);
    for (uint32_t r = 0; r < registers; ++r) t[r] = _mm512_load_ps(lut.symbol_values + 16 * r);
  }
  // The sixteen symbols of the two groups at `g` (reads 8 bytes at each).
  CKPTFS_Q512 __m512i TwoGroups(const uint8_t* g) const {
    return _mm512_inserti64x4(_mm512_castsi256_si512(GroupSymbols(g, shifts, mask)),
                              GroupSymbols(g + bits, shifts, mask), 1);
  }
  CKPTFS_Q512 __m512 Of(__m512i sym) const {
    const __mmask16 bit5 = _mm512_test_epi32_mask(sym, _mm512_set1_epi32(32));
    __m512 vals = SixtyFour(t, sym, bit5);
    if (registers >= 8) {
      const __mmask16 bit6 = _mm512_test_epi32_mask(sym, _mm512_set1_epi32(64));
      vals = _mm512_mask_blend_ps(bit6, vals, SixtyFour(t + 4, sym, bit5));
      if (registers == 16) {
        const __m512 upper = _mm512_mask_blend_ps(bit6, SixtyFour(t + 8, sym, bit5), SixtyFour(t + 12, sym, bit5));
        vals = _mm512_mask_blend_ps(_mm512_test_epi32_mask(sym, _mm512_set1_epi32(128)), vals, upper);
      }
    }
    return vals;
  }
};

__attribute__((target("avx512f,avx512bw,avx512vl"))) void DequantizeF32Avx512(
    const LevelLookup& lut, uint32_t bits, const uint8_t* packed, const void* base_bits, uint64_t groups,
    void* out_bits, uint32_t* max_symbol) {
  const auto* base = static_cast<const uint32_t*>(base_bits);
  auto* out = static_cast<uint32_t*>(out_bits);
  const SymbolValues512 symbols(lut, bits);
  __m512i vmax = _mm512_setzero_si512();
  uint64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    const __m512i sym = symbols.TwoGroups(packed + g * bits);
    vmax = _mm512_max_epu32(vmax, sym);
    const __m512 vals = symbols.Of(sym);
    const uint64_t at = g * kPackGroup;
    const __m512i bb = base ? _mm512_loadu_si512(base + at) : _mm512_setzero_si512();
    const __m512i q = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(bb), vals));
    _mm512_storeu_si512(out + at, _mm512_mask_blend_epi32(_mm512_testn_epi32_mask(sym, sym), q, bb));
  }
  *max_symbol = std::max(*max_symbol, _mm512_reduce_max_epu32(vmax));
  if (g < groups) {  // the last odd group by the AVX2 path
    DequantizeSimd(ElementType::kF32, lut, bits, packed, base_bits, g, groups - g, out_bits, max_symbol);
  }
}

namespace {

// The symbol of element i of a packed stream of `bits`-bit symbols (8 per
// group, little-endian), reading no byte past `packed_bytes`.
uint32_t SymbolAt(const uint8_t* packed, uint64_t packed_bytes, uint32_t bits, uint64_t i) {
  const uint64_t bit = (i / kPackGroup) * bits * 8 + (i % kPackGroup) * bits;
  const uint64_t byte = bit / 8;
  uint32_t word = packed[byte];
  if (byte + 1 < packed_bytes) word |= uint32_t{packed[byte + 1]} << 8;
  return (word >> (bit % 8)) & ((1u << bits) - 1);
}

// Sixteen elements at `at` whose symbols are `sym`: Quantize16's outputs
// for them, the symbols read instead of found.
CKPTFS_Q512 void Relevel16(const SymbolValues512& symbols, __m512i sym, const uint32_t* values, const uint32_t* base,
                           uint64_t at, uint32_t* recon, __m512i abs_mask, __m512i non_finite, __m512d* acc_lo,
                           __m512d* acc_hi, __m512d* vmax) {
  const __m512 vals = symbols.Of(sym);
  const __m512i xb = _mm512_loadu_si512(values + at);
  const __m512i bb = base ? _mm512_loadu_si512(base + at) : _mm512_setzero_si512();
  const __m512i q = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(bb), vals));
  const __mmask16 quantized = _mm512_test_epi32_mask(sym, sym);
  const __m512i out = _mm512_mask_blend_epi32(quantized, _mm512_loadu_si512(recon + at), q);
  _mm512_storeu_si512(recon + at, out);
  AddErrors16(xb, out, abs_mask, non_finite, acc_lo, acc_hi, vmax);
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl"))) void RelevelBlockF32Avx512(
    const LevelLookup& lut, uint32_t bits, const uint8_t* packed, uint64_t packed_bytes, const void* values_bits,
    const void* base_bits, uint64_t start, uint64_t end, void* recon_bits, double* lanes, double* max_err) {
  const auto* values = static_cast<const uint32_t*>(values_bits);
  const auto* base = static_cast<const uint32_t*>(base_bits);
  auto* recon = static_cast<uint32_t*>(recon_bits);
  const SymbolValues512 symbols(lut, bits);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i non_finite = _mm512_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  __m512d acc[4];
  for (int v = 0; v < 4; ++v) acc[v] = _mm512_loadu_pd(lanes + 8 * v);
  __m512d vmax = _mm512_set1_pd(*max_err);
  uint64_t i = start;
  // Four groups per step; each group's 8-byte load stays inside `packed`.
  for (; i + kReduceLanes <= end && (i / kPackGroup + 3) * bits + 8 <= packed_bytes; i += kReduceLanes) {
    const uint8_t* g = packed + i / kPackGroup * bits;
    Relevel16(symbols, symbols.TwoGroups(g), values, base, i, recon, abs_mask, non_finite, &acc[0], &acc[1], &vmax);
    Relevel16(symbols, symbols.TwoGroups(g + 2 * bits), values, base, i + 16, recon, abs_mask, non_finite, &acc[2],
              &acc[3], &vmax);
  }
  double mx = StoreErrorLanes(acc, vmax, lanes);
  // The rest one by one, into the same lanes in the same order.
  for (; i < end; ++i) {
    const uint32_t sym = SymbolAt(packed, packed_bytes, bits, i);
    if (sym != 0) {
      const float bf = base ? F32Elem::ToFloat(base[i]) : 0.0f;
      recon[i] = F32Elem::FromFloat(bf + lut.symbol_values[sym]);
    }
    double abs_err;
    lanes[i % kReduceLanes] += SquaredError<F32Elem>(values[i], recon[i], &abs_err);
    mx = abs_err > mx ? abs_err : mx;
  }
  *max_err = mx;
}

#else  // not x86-64

bool QuantizeAvx512Available() { return false; }
void DequantizeF32Avx512(const LevelLookup&, uint32_t, const uint8_t*, const void*, uint64_t, void*, uint32_t*) {}
void RelevelBlockF32Avx512(const LevelLookup&, uint32_t, const uint8_t*, uint64_t, const void*, const void*, uint64_t,
                           uint64_t, void*, double*, double*) {}
void QuantizeBlockF32Avx512(const QuantizeTable&, const LevelLookup&, const void*, const void*, uint64_t, uint64_t,
                            const float*, uint8_t*, void*, double*, double*, uint64_t*, uint64_t*) {}

#endif

}  // namespace ckptfs::lossy

#if defined(__x86_64__)
CKPTFS_END_AVX512_CODE
#endif
