// AVX2 paths of the CPU kernels for f32 (see kernels_cpu_simd.h). Compiled
// with -ffp-contract=off like the rest of the codec; the intrinsics used are
// plain IEEE adds, subtracts, multiplies, compares and conversions, so the
// results equal the scalar reference bit for bit.
#include "codec/tensor/lossy/kernels_cpu_simd.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#if defined(__x86_64__)
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
    }
  }
}

#if defined(__x86_64__)

bool SimdAvailable() { return __builtin_cpu_supports("avx2"); }

__attribute__((target("avx2"))) void ResidualBlockF32Simd(const uint32_t* values, const uint32_t* base, uint64_t start,
                                                          uint64_t end, float* residual, double* lanes) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i non_finite = _mm256_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  __m256d acc[8];
  for (int v = 0; v < 8; ++v) acc[v] = _mm256_loadu_pd(lanes + 4 * v);
  uint64_t i = start;
  for (; i + kReduceLanes <= end; i += kReduceLanes) {
    for (uint32_t o = 0; o < kReduceLanes; o += 8) {
      const uint64_t at = i + o;
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + at));
      const __m256 x = _mm256_castsi256_ps(xb);
      const __m256 r = base ? _mm256_sub_ps(x, _mm256_loadu_ps(reinterpret_cast<const float*>(base + at))) : x;
      _mm256_storeu_ps(residual + at, r);
      const __m256i finite = _mm256_cmpgt_epi32(non_finite, _mm256_and_si256(xb, abs_mask));
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
    const float x = BitsFloat(values[i]);
    residual[i] = base ? x - BitsFloat(base[i]) : x;
    lanes[i % kReduceLanes] += FiniteSquare(x);
  }
}

__attribute__((target("bmi2"))) static void PackWithPext(const uint8_t* symbols, uint64_t count, uint32_t bits,
                                                         std::byte* out) {
  const uint64_t mask = ((uint64_t{1} << bits) - 1) * 0x0101010101010101ull;
  for (uint64_t g = 0; g < count; g += kPackGroup) {
    uint64_t word;
    std::memcpy(&word, symbols + g, 8);
    const uint64_t packed = _pext_u64(word, mask);  // symbol j lands at bit j * bits
    std::memcpy(out, &packed, bits);
    out += bits;
  }
}

bool PackGroupsBmi2(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out) {
  if (!__builtin_cpu_supports("bmi2")) return false;
  PackWithPext(symbols, count, bits, out);
  return true;
}

namespace {

// kProbes: how many bounds past the bin's start are compared; enough when
// it is at least the table's max_span (bounds beyond never compare below r).
template <uint32_t kProbes>
__attribute__((target("avx2"))) void QuantizeBlockF32Avx2(const QuantizeTable& t, const LevelLookup& lut,
                                                          const uint32_t* values, const uint32_t* base, uint64_t start,
                                                          uint64_t end, const float* residual, uint8_t* symbols,
                                                          uint32_t* recon, double* lanes, double* max_err,
                                                          uint64_t* pruned, uint64_t* exact) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i exact_lim = _mm256_set1_epi32(static_cast<int32_t>(t.exact_from) - 1);
  const __m256i prune_lim = _mm256_set1_epi32(static_cast<int32_t>(t.prune_below));
  const __m256i no_levels = _mm256_set1_epi32(t.num_levels == 0 ? -1 : 0);
  const __m256i non_finite = _mm256_set1_epi32(static_cast<int32_t>(kNonFiniteBits));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i byte_pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                             -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256d sign_pd = _mm256_set1_pd(-0.0);
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
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + at));
      const __m256i bb =
          base ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + at)) : _mm256_setzero_si256();
      const __m256i mag = _mm256_and_si256(rb, abs_mask);
      const __m256i is_exact = _mm256_cmpgt_epi32(mag, exact_lim);
      const __m256i is_pruned =
          _mm256_andnot_si256(is_exact, _mm256_or_si256(_mm256_cmpgt_epi32(prune_lim, mag), no_levels));
      const __m256i first = _mm256_i32gather_epi32(lut.start, _mm256_srli_epi32(rb, kHistogramShift), 4);
      __m256i k = first;
      for (uint32_t p = 0; p < kProbes; ++p) {
        const __m256 bound = _mm256_i32gather_ps(lut.bounds + p, first, 4);
        k = _mm256_sub_epi32(k, _mm256_castps_si256(_mm256_cmp_ps(bound, rv, _CMP_LT_OQ)));
      }
      const __m256 level = _mm256_i32gather_ps(lut.levels, k, 4);
      const __m256 q = _mm256_add_ps(_mm256_castsi256_ps(bb), level);
      __m256i out = _mm256_blendv_epi8(_mm256_castps_si256(q), bb, is_pruned);
      out = _mm256_blendv_epi8(out, xb, is_exact);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(recon + at), out);
      const __m256i sym = _mm256_andnot_si256(_mm256_or_si256(is_exact, is_pruned), _mm256_add_epi32(k, one));
      const __m256i picked = _mm256_shuffle_epi8(sym, byte_pick);
      const uint32_t sym_lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(picked)));
      const uint32_t sym_hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(picked, 1)));
      std::memcpy(symbols + (at - start), &sym_lo, 4);
      std::memcpy(symbols + (at - start) + 4, &sym_hi, 4);
      n_pruned += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(is_pruned))));
      n_exact += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(is_exact))));

      const __m256i finite = _mm256_cmpgt_epi32(non_finite, _mm256_and_si256(xb, abs_mask));
      const __m256 xf = _mm256_castsi256_ps(xb), of = _mm256_castsi256_ps(out);
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
    const uint32_t x = values[i], b = base ? base[i] : 0u;
    const float r = residual[i];
    const uint32_t mag = FloatBits(r) & 0x7fffffffu;
    const bool is_exact = mag >= t.exact_from;
    const bool is_pruned = !is_exact && (mag < t.prune_below || t.num_levels == 0);
    const uint32_t k = LookupLevel(lut, r);
    const uint32_t q = FloatBits(BitsFloat(b) + lut.levels[k]);
    const uint32_t out = is_exact ? x : (is_pruned ? b : q);
    symbols[i - start] = static_cast<uint8_t>((is_exact || is_pruned) ? 0u : k + 1);
    recon[i] = out;
    n_pruned += is_pruned;
    n_exact += is_exact;
    if ((x & 0x7fffffffu) < kNonFiniteBits) {
      const double e = static_cast<double>(BitsFloat(out)) - static_cast<double>(BitsFloat(x));
      lanes[i % kReduceLanes] += e * e;
      mx = std::max(mx, e < 0 ? -e : e);
    }
  }
  *max_err = mx;
  *pruned += n_pruned;
  *exact += n_exact;
}

}  // namespace

void QuantizeBlockF32Simd(const QuantizeTable& t, const LevelLookup& lut, const uint32_t* values, const uint32_t* base,
                          uint64_t start, uint64_t end, const float* residual, uint8_t* symbols, uint32_t* recon,
                          double* lanes, double* max_err, uint64_t* pruned, uint64_t* exact) {
  auto run = [&](auto kernel) {
    kernel(t, lut, values, base, start, end, residual, symbols, recon, lanes, max_err, pruned, exact);
  };
  if (lut.max_span == 0) return run(QuantizeBlockF32Avx2<0>);
  if (lut.max_span == 1) return run(QuantizeBlockF32Avx2<1>);
  if (lut.max_span == 2) return run(QuantizeBlockF32Avx2<2>);
  return run(QuantizeBlockF32Avx2<kProbe>);
}

__attribute__((target("avx2"))) uint64_t CompactExactF32Simd(uint32_t exact_from, const uint32_t* values,
                                                             const float* residual, uint64_t n, uint32_t* positions,
                                                             uint32_t* raw) {
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

__attribute__((target("avx2"))) void DequantizeF32Simd(const LevelLookup& lut, uint32_t bits, const uint8_t* packed,
                                                       const uint32_t* base, uint64_t g0, uint64_t groups,
                                                       uint32_t* out, uint32_t* max_symbol) {
  const int64_t b = bits;
  const __m256i shift_lo = _mm256_setr_epi64x(0, b, 2 * b, 3 * b);
  const __m256i shift_hi = _mm256_setr_epi64x(4 * b, 5 * b, 6 * b, 7 * b);
  const __m256i mask = _mm256_set1_epi64x((int64_t{1} << bits) - 1);
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  __m256i vmax = _mm256_setzero_si256();
  for (uint64_t g = g0; g < g0 + groups; ++g) {
    uint64_t word;
    std::memcpy(&word, packed + g * bits, 8);
    const __m256i w = _mm256_set1_epi64x(static_cast<int64_t>(word));
    const __m256i s_lo = _mm256_and_si256(_mm256_srlv_epi64(w, shift_lo), mask);
    const __m256i s_hi = _mm256_and_si256(_mm256_srlv_epi64(w, shift_hi), mask);
    const __m128 v_lo = _mm256_i64gather_ps(lut.symbol_values, s_lo, 4);
    const __m128 v_hi = _mm256_i64gather_ps(lut.symbol_values, s_hi, 4);
    const __m256 vals = _mm256_set_m128(v_hi, v_lo);
    const __m256i sym = _mm256_set_m128i(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(s_hi, even)),
                                         _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(s_lo, even)));
    vmax = _mm256_max_epu32(vmax, sym);
    const __m256i bb =
        base ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + g * kPackGroup)) : _mm256_setzero_si256();
    const __m256 q = _mm256_add_ps(_mm256_castsi256_ps(bb), vals);
    const __m256i zero = _mm256_cmpeq_epi32(sym, _mm256_setzero_si256());
    const __m256i o = _mm256_blendv_epi8(_mm256_castps_si256(q), bb, zero);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g * kPackGroup), o);
  }
  uint32_t m[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(m), vmax);
  uint32_t mx = *max_symbol;
  for (uint32_t v : m) mx = std::max(mx, v);
  *max_symbol = mx;
}

#else  // not x86-64: the scalar paths are used

bool SimdAvailable() { return false; }
bool PackGroupsBmi2(const uint8_t*, uint64_t, uint32_t, std::byte*) { return false; }
void ResidualBlockF32Simd(const uint32_t*, const uint32_t*, uint64_t, uint64_t, float*, double*) {}
uint64_t CompactExactF32Simd(uint32_t, const uint32_t*, const float*, uint64_t, uint32_t*, uint32_t*) { return 0; }
void QuantizeBlockF32Simd(const QuantizeTable&, const LevelLookup&, const uint32_t*, const uint32_t*, uint64_t,
                          uint64_t, const float*, uint8_t*, uint32_t*, double*, double*, uint64_t*, uint64_t*) {}
void DequantizeF32Simd(const LevelLookup&, uint32_t, const uint8_t*, const uint32_t*, uint64_t, uint64_t, uint32_t*,
                       uint32_t*) {}

#endif

}  // namespace ckptfs::lossy
