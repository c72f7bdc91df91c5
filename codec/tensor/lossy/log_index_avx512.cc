// The AVX-512 index pass of the log mode (see log_index.h): sixteen f32
// elements at a time, the bucket tables read by two-register permutes
// (64 entries) instead of gathers. The same IEEE double operations as the
// scalar reference and the error sums still added one element at a time in
// element order, so every output equals IndexElement's bit for bit.
#include <endian.h>

#include <cstring>

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/log_index.h"

#if defined(__x86_64__)
CKPTFS_BEGIN_AVX512_CODE  // (GCC bug 105593: codec/common/simd_level.h)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

#if defined(__x86_64__)

bool LogAvx512Available() { return CpuHasSimd(SimdLevel::kAvx512); }

namespace {

#define CKPTFS_LOG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline

// The entry of a 64-entry table for each lane's bucket (0..63).
struct Table64 {
  __m512i a, b, c, d;  // entries 0..15, 16..31, 32..47, 48..63
};
CKPTFS_LOG_AVX512 Table64 LoadTable(const uint32_t* t) {
  Table64 r;
  r.a = _mm512_loadu_si512(t);
  r.b = _mm512_loadu_si512(t + 16);
  r.c = _mm512_loadu_si512(t + 32);
  r.d = _mm512_loadu_si512(t + 48);
  return r;
}
CKPTFS_LOG_AVX512 __m512i Lookup(const Table64& t, __m512i bucket, __mmask16 upper_half) {
  const __m512i low = _mm512_permutex2var_epi32(t.a, bucket, t.b);   // index bits 0..4
  const __m512i high = _mm512_permutex2var_epi32(t.c, bucket, t.d);
  return _mm512_mask_blend_epi32(upper_half, low, high);
}

struct Located512 {
  __m512i q, value;
  __m512i e, r;  // q = e K + r
};
struct Tables512 {
  Table64 level, offset, low_bits, high_bits;
};
// Locate for lanes with an exponent field in [1, 252] (others get garbage).
CKPTFS_LOG_AVX512 Located512 LocateLanes512(const Tables512& t, __m512i k, __m512i v, bool want_value) {
  const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(v, 23), _mm512_set1_epi32(127));
  const __m512i f = _mm512_and_si512(v, _mm512_set1_epi32(0x7FFFFF));
  const __m512i bucket = _mm512_srli_epi32(f, 17);
  const __mmask16 upper = _mm512_test_epi32_mask(bucket, _mm512_set1_epi32(32));
  const __m512i in_bucket = _mm512_and_si512(f, _mm512_set1_epi32((1 << 17) - 1));
  const __mmask16 up = _mm512_cmpge_epi32_mask(in_bucket, Lookup(t.offset, bucket, upper));
  const __m512i first_level = Lookup(t.level, bucket, upper);
  const __m512i r = _mm512_mask_add_epi32(first_level, up, first_level, _mm512_set1_epi32(1));
  Located512 out;
  out.e = e;
  out.r = r;
  out.q = _mm512_add_epi32(_mm512_mullo_epi32(e, k), r);
  if (want_value) {
    const __m512i bits =
        _mm512_mask_blend_epi32(up, Lookup(t.low_bits, bucket, upper), Lookup(t.high_bits, bucket, upper));
    out.value = _mm512_add_epi32(bits, _mm512_slli_epi32(e, 23));
  } else {
    out.value = _mm512_setzero_si512();
  }
  return out;
}

// Lanes positive with an exponent field in [1, 252] (the table path), and
// lanes positive and finite (on the grid).
CKPTFS_LOG_AVX512 __mmask16 FastLanes512(__m512i v) {
  return _mm512_cmpgt_epi32_mask(v, _mm512_set1_epi32(0x007FFFFF)) &
         _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(253 << 23), v);
}
CKPTFS_LOG_AVX512 __mmask16 OnGridLanes512(__m512i v) {
  return _mm512_cmpgt_epi32_mask(v, _mm512_setzero_si512()) &
         _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(0x7F800000), v);
}

CKPTFS_LOG_AVX512 Tables512 LoadTables(const LogFractionTable& table) {
  Tables512 t;
  t.level = LoadTable(table.small_level);
  t.offset = LoadTable(table.small_offset);
  t.low_bits = LoadTable(table.small_low_bits);
  t.high_bits = LoadTable(table.small_high_bits);
  return t;
}

template <bool kDelta>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void IndexPass512(
    const IndexGrids& grids, const std::byte* values, const std::byte* base, double max_rel, uint64_t n,
    int32_t* index, int32_t* base_index, std::byte* recon, LogIndexSums* sums) {
  const Tables512 t = LoadTables(*grids.code_table);
  Tables512 tb;
  if constexpr (kDelta) tb = LoadTables(*grids.base_table);
  const __m512i k = _mm512_set1_epi32(static_cast<int>(grids.code.per_octave()));
  const __m512d factor = _mm512_set1_pd(1.0 + max_rel);  // WithinFactor's
  const __m512d below_one = _mm512_set1_pd(1.0 - 0x1p-50);
  __m512i lo = _mm512_set1_epi32(std::numeric_limits<int32_t>::max());
  __m512i hi = _mm512_set1_epi32(std::numeric_limits<int32_t>::min());
  __m512d max_abs = _mm512_setzero_pd(), max_rel_seen = _mm512_setzero_pd();
  double err2 = sums->err2, ref2 = sums->ref2;
  uint64_t votes_same = 0, votes_up = 0, votes_down = 0;  // d = 0, +1, -1
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_loadu_si512(values + 4 * i);
    const __mmask16 on_grid = OnGridLanes512(v);
    __mmask16 slow = on_grid & static_cast<__mmask16>(~FastLanes512(v));
    __m512i b = _mm512_setzero_si512();
    __mmask16 base_on_grid = 0;
    if constexpr (kDelta) {
      b = _mm512_loadu_si512(base + 4 * i);
      base_on_grid = OnGridLanes512(b);
      slow |= base_on_grid & static_cast<__mmask16>(~FastLanes512(b));
    }
    if (slow != 0) {
      sums->err2 = err2, sums->ref2 = ref2;
      for (uint64_t j = i; j < i + 16; ++j)
        IndexElement<F32Elem, kDelta>(grids, values, base, max_rel, j, index, base_index, recon, sums);
      err2 = sums->err2, ref2 = sums->ref2;
      continue;
    }
    const Located512 p = LocateLanes512(t, k, v, true);
    const __m512d x0 = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(v)));
    const __m512d x1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(v, 1)));
    const __m512d r0 = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(p.value)));
    const __m512d r1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(p.value, 1)));
    const __m512d e0 = _mm512_sub_pd(r0, x0), e1 = _mm512_sub_pd(r1, x1);
    const __m512d a0 = _mm512_abs_pd(e0), a1 = _mm512_abs_pd(e1);
    const __mmask8 in0 = _mm512_cmp_pd_mask(r0, _mm512_mul_pd(factor, x0), _CMP_LE_OQ) &
                         _mm512_cmp_pd_mask(x0, _mm512_mul_pd(factor, r0), _CMP_LE_OQ);
    const __mmask8 in1 = _mm512_cmp_pd_mask(r1, _mm512_mul_pd(factor, x1), _CMP_LE_OQ) &
                         _mm512_cmp_pd_mask(x1, _mm512_mul_pd(factor, r1), _CMP_LE_OQ);
    const __mmask16 quant = on_grid & static_cast<__mmask16>(in0 | (in1 << 8));
    const __mmask8 m0 = static_cast<__mmask8>(quant), m1 = static_cast<__mmask8>(quant >> 8);
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512());
    __m512i q = _mm512_mask_blend_epi32(zero, _mm512_set1_epi32(kNoIndex), _mm512_set1_epi32(kZeroIndex));
    q = _mm512_mask_blend_epi32(quant, q, p.q);
    _mm512_storeu_si512(index + i, q);
    _mm512_storeu_si512(recon + 4 * i, _mm512_mask_blend_epi32(quant, v, p.value));
    lo = _mm512_mask_min_epi32(lo, quant, lo, p.q);
    hi = _mm512_mask_max_epi32(hi, quant, hi, p.q);
    max_abs = _mm512_mask_max_pd(max_abs, m0, max_abs, a0);
    max_abs = _mm512_mask_max_pd(max_abs, m1, max_abs, a1);
    // Divide only where a lane's maximum can rise (see log_index.cc).
    const __mmask8 need0 = _mm512_mask_cmp_pd_mask(
        m0, a0, _mm512_mul_pd(_mm512_mul_pd(max_rel_seen, x0), below_one), _CMP_GT_OQ);
    const __mmask8 need1 = _mm512_mask_cmp_pd_mask(
        m1, a1, _mm512_mul_pd(_mm512_mul_pd(max_rel_seen, x1), below_one), _CMP_GT_OQ);
    if ((need0 | need1) != 0) {
      max_rel_seen = _mm512_mask_max_pd(max_rel_seen, m0, max_rel_seen, _mm512_div_pd(a0, x0));
      max_rel_seen = _mm512_mask_max_pd(max_rel_seen, m1, max_rel_seen, _mm512_div_pd(a1, x1));
    }
    // Error terms of the quantized lanes (0 elsewhere: adding +0 leaves a sum unchanged).
    alignas(64) double sq[16], ref[16];
    _mm512_store_pd(sq, _mm512_maskz_mul_pd(m0, e0, e0));
    _mm512_store_pd(sq + 8, _mm512_maskz_mul_pd(m1, e1, e1));
    const __mmask16 finite =
        _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(0x7F800000), _mm512_and_si512(v, _mm512_set1_epi32(0x7FFFFFFF)));
    _mm512_store_pd(ref, _mm512_maskz_mul_pd(static_cast<__mmask8>(finite), x0, x0));
    _mm512_store_pd(ref + 8, _mm512_maskz_mul_pd(static_cast<__mmask8>(finite >> 8), x1, x1));
    for (int l = 0; l < 16; ++l) {
      err2 += sq[l];
      ref2 += ref[l];
    }
    sums->quantized += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(quant)));
    if constexpr (kDelta) {
      const Located512 pb = LocateLanes512(tb, k, b, false);
      const __m512i qb = _mm512_mask_blend_epi32(base_on_grid, _mm512_set1_epi32(kNoIndex), pb.q);
      _mm512_storeu_si512(base_index + i, qb);
      const __m512i d = _mm512_sub_epi32(p.q, pb.q);
      const __mmask16 voting =
          quant & base_on_grid & _mm512_cmple_epi32_mask(_mm512_abs_epi32(d), _mm512_set1_epi32(kMaxShift));
      // Nearly every vote is -1, 0 or +1: counted by mask (the four tables
      // are only ever summed), the rest one by one.
      const __mmask16 same = _mm512_mask_cmpeq_epi32_mask(voting, d, _mm512_setzero_si512());
      const __mmask16 up = _mm512_mask_cmpeq_epi32_mask(voting, d, _mm512_set1_epi32(1));
      const __mmask16 down = _mm512_mask_cmpeq_epi32_mask(voting, d, _mm512_set1_epi32(-1));
      votes_same += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(same)));
      votes_up += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(up)));
      votes_down += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(down)));
      uint32_t mask = static_cast<uint32_t>(voting & static_cast<__mmask16>(~(same | up | down)));
      if (mask != 0) {
        alignas(64) int32_t ds[16];
        _mm512_store_si512(ds, d);
        for (; mask != 0; mask &= mask - 1) {
          const int l = std::countr_zero(mask);
          ++sums->votes[l & 3][ds[l] + kMaxShift];
        }
      }
    }
  }
  sums->err2 = err2, sums->ref2 = ref2;
  sums->votes[0][kMaxShift] += votes_same;
  sums->votes[0][kMaxShift + 1] += votes_up;
  sums->votes[0][kMaxShift - 1] += votes_down;
  for (; i < n; ++i) IndexElement<F32Elem, kDelta>(grids, values, base, max_rel, i, index, base_index, recon, sums);
  sums->lo = std::min(sums->lo, _mm512_reduce_min_epi32(lo));
  sums->hi = std::max(sums->hi, _mm512_reduce_max_epi32(hi));
  alignas(64) double abs_lanes[8], rel_lanes[8];
  _mm512_store_pd(abs_lanes, max_abs);
  _mm512_store_pd(rel_lanes, max_rel_seen);
  for (int l = 0; l < 8; ++l) {
    sums->max_abs = std::max(sums->max_abs, abs_lanes[l]);
    sums->achieved_rel = std::max(sums->achieved_rel, rel_lanes[l]);
  }
}

}  // namespace

void IndexPassF32Avx512(const IndexGrids& grids, const std::byte* values, const std::byte* base, double max_rel,
                        uint64_t n, int32_t* index, int32_t* base_index, std::byte* recon, LogIndexSums* sums) {
  if (base != nullptr) {
    IndexPass512<true>(grids, values, base, max_rel, n, index, base_index, recon, sums);
  } else {
    IndexPass512<false>(grids, values, base, max_rel, n, index, base_index, recon, sums);
  }
}

namespace {

// Where each of 16 consecutive `bits`-wide symbols of a packed group sits:
// the byte its 8-byte window starts at and its shift in that window.
struct SymbolLanes16 {
  __m256i byte_lo, byte_hi;
  __m512i shift_lo, shift_hi, mask;
};

CKPTFS_LOG_AVX512 SymbolLanes16 MakeSymbolLanes16(uint32_t bits) {
  alignas(32) int32_t byte_at[16];
  alignas(64) int64_t shift_at[16];
  for (uint32_t l = 0; l < 16; ++l) byte_at[l] = static_cast<int32_t>(l * bits / 8), shift_at[l] = l * bits % 8;
  return {_mm256_load_si256(reinterpret_cast<const __m256i*>(byte_at)),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(byte_at + 8)), _mm512_load_si512(shift_at),
          _mm512_load_si512(shift_at + 8), _mm512_set1_epi64((int64_t{1} << bits) - 1)};
}

// Symbols i0 .. i0 + 15 (i0 a multiple of 16, so they start on a byte): one
// 8-byte load per lane (bit offset in its byte + bits <= 7 + 24 < 64).
CKPTFS_LOG_AVX512 __m512i Symbols16(const std::byte* group, const SymbolLanes16& l) {
  const __m512i w_lo = _mm512_i32gather_epi64(l.byte_lo, group, 1);
  const __m512i w_hi = _mm512_i32gather_epi64(l.byte_hi, group, 1);
  const __m256i s_lo = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(w_lo, l.shift_lo), l.mask));
  const __m256i s_hi = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(w_hi, l.shift_hi), l.mask));
  return _mm512_inserti64x4(_mm512_castsi256_si512(s_lo), s_hi, 1);
}

// Symbols by byte permutes (AVX-512 VBMI): each lane's four bytes picked
// from one masked load of the group (16 symbols of at most 24 bits end
// within 48 bytes; the mask keeps the load inside the bytes the symbols
// reach, 3 past the group at most), then shifted and masked.
struct SymbolBytes16 {
  __m512i byte_index, shift, mask;
  __mmask64 load;
};

#define CKPTFS_LOG_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"), always_inline)) inline

CKPTFS_LOG_VBMI SymbolBytes16 MakeSymbolBytes16(uint32_t bits) {
  alignas(64) uint8_t byte_at[64];
  alignas(64) uint32_t shift_at[16];
  for (uint32_t l = 0; l < 16; ++l) {
    for (uint32_t j = 0; j < 4; ++j) byte_at[4 * l + j] = static_cast<uint8_t>(l * bits / 8 + j);
    shift_at[l] = l * bits % 8;
  }
  SymbolBytes16 r;
  r.byte_index = _mm512_load_si512(byte_at);
  r.shift = _mm512_load_si512(shift_at);
  r.mask = _mm512_set1_epi32(static_cast<int>((uint32_t{1} << bits) - 1));
  r.load = ~uint64_t{0} >> (64 - (15 * bits / 8 + 4));
  return r;
}

CKPTFS_LOG_VBMI __m512i Symbols16Vbmi(const std::byte* group, const SymbolBytes16& l) {
  const __m512i raw = _mm512_maskz_loadu_epi8(l.load, group);
  return _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi8(l.byte_index, raw), l.shift), l.mask);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) void UnpackVbmi(const std::byte* packed, uint32_t bits,
                                                                             uint64_t groups, uint32_t* out) {
  const SymbolBytes16 lanes = MakeSymbolBytes16(bits);
  for (uint64_t g = 0; g < groups; ++g) _mm512_storeu_si512(out + 16 * g, Symbols16Vbmi(packed + g * 2 * bits, lanes));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void UnpackGathers(const std::byte* packed, uint32_t bits,
                                                                       uint64_t groups, uint32_t* out) {
  const SymbolLanes16 lanes = MakeSymbolLanes16(bits);
  for (uint64_t g = 0; g < groups; ++g) _mm512_storeu_si512(out + 16 * g, Symbols16(packed + g * 2 * bits, lanes));
}

// Unpacks the symbols of a frame a block at a time (by permutes where the
// CPU has VBMI: about an eighth of a delta frame's decode went to the two
// 8-lane gathers per group), for the decode loops to load as plain vectors.
class SymbolBlocks {
 public:
  static constexpr uint64_t kSymbols = 512;  // per block (2 KiB, in L1)
  SymbolBlocks(const std::byte* packed, uint32_t bits, bool vbmi)
      : packed_(packed), bits_(bits), unpack_(vbmi ? UnpackVbmi : UnpackGathers) {}
  // Symbols [i, i + 16) of the frame; i a multiple of 16, the group whole.
  const uint32_t* Group(uint64_t i, uint64_t n) {
    if (i >= block_end_ || i < block_begin_) {
      block_begin_ = i - i % kSymbols;
      block_end_ = std::min(block_begin_ + kSymbols, n - n % 16);
      unpack_(packed_ + block_begin_ / 8 * bits_, bits_, (block_end_ - block_begin_) / 16, block_);
    }
    return block_ + (i - block_begin_);
  }

 private:
  const std::byte* packed_;
  uint32_t bits_;
  void (*unpack_)(const std::byte*, uint32_t, uint64_t, uint32_t*);
  uint64_t block_begin_ = 0, block_end_ = 0;
  alignas(64) uint32_t block_[kSymbols];
};


// floor(q / k) for |q| < 2^30: the double quotient is within 2^-22 of q / k,
// so its floor is at most one too high or too low; the caller corrects.
CKPTFS_LOG_AVX512 __m512i FloorDivEstimate(__m512i q, __m512d inv_k) {
  const __m512d lo = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(q)), inv_k);
  const __m512d hi = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(q, 1)), inv_k);
  const __m256i e_lo = _mm512_cvttpd_epi32(_mm512_roundscale_pd(lo, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  const __m256i e_hi = _mm512_cvttpd_epi32(_mm512_roundscale_pd(hi, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  return _mm512_inserti64x4(_mm512_castsi256_si512(e_lo), e_hi, 1);
}

// e and j of q = e K + j moved by one octave either way so that j lies in
// [0, K) (for j within one octave of that range on entry).
CKPTFS_LOG_AVX512 void StepIntoOctave(__m512i k, __m512i* e, __m512i* j) {
  const __m512i one = _mm512_set1_epi32(1);
  const __mmask16 low = _mm512_cmplt_epi32_mask(*j, _mm512_setzero_si512());
  *e = _mm512_mask_sub_epi32(*e, low, *e, one);
  *j = _mm512_mask_add_epi32(*j, low, *j, k);
  const __mmask16 high = _mm512_cmpge_epi32_mask(*j, k);
  *e = _mm512_mask_add_epi32(*e, high, *e, one);
  *j = _mm512_mask_sub_epi32(*j, high, *j, k);
}

// FloatValue's split of q: e = floor(q / K) and j = q - e K, from the
// double quotient corrected by one step.
CKPTFS_LOG_AVX512 void SplitOctave(__m512i q, __m512i k, __m512d inv_k, __m512i* e, __m512i* j) {
  *e = FloorDivEstimate(q, inv_k);
  *j = _mm512_sub_epi32(q, _mm512_mullo_epi32(*e, k));
  StepIntoOctave(k, e, j);
}

// The bits of the grid's levels 0..K-1 at exponent 0 (K < 64), for Lookup.
CKPTFS_LOG_AVX512 Table64 LevelTable(const LogGrid& grid, const LogFractionTable& table) {
  alignas(64) uint32_t level_bits[64] = {};
  for (uint32_t j = 0; j < grid.per_octave(); ++j) level_bits[j] = table.level_bits[j];
  return LoadTable(level_bits);
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl"))) bool KeepPredictedLevelsF32Avx512(
    const LogGrid& grid, const LogFractionTable& table, const std::byte* values, const int32_t* base_index,
    int64_t origin, int32_t shift, double bound, uint64_t n, int32_t* index, std::byte* recon, const uint8_t* masks) {
  const uint32_t per_octave = grid.per_octave();
  const Table64 levels = LevelTable(grid, table);
  const __m512i k = _mm512_set1_epi32(static_cast<int>(per_octave));
  const __m512d inv_k = _mm512_set1_pd(1.0 / static_cast<double>(per_octave));
  const __m512i shift_v = _mm512_set1_epi32(shift);
  const __m512d factor = _mm512_set1_pd(1.0 + bound);  // WithinFactor's
  bool changed = false;
  auto scalar_group = [&](uint64_t i, uint32_t m) {
    for (; m != 0; m &= m - 1) {
      const uint64_t at = i + static_cast<uint64_t>(std::countr_zero(m));
      if (at < n) changed |= KeepPredictedLevel<F32Elem>(grid, values, base_index, origin, shift, bound, at, index, recon);
    }
  };
  const uint64_t mask_bytes = (n + 7) / 8;
  for (uint64_t g = 0; g < mask_bytes; g += 2) {
    const uint32_t m = masks[g] | (g + 1 < mask_bytes ? uint32_t{masks[g + 1]} << 8 : 0u);
    if (m == 0) continue;
    const uint64_t i = g * 8;
    if (i + 16 > n) {
      scalar_group(i, m);
      continue;
    }
    const __mmask16 marked = static_cast<__mmask16>(m);
    const __m512i b = _mm512_loadu_si512(base_index + i);
    // A marked lane's base has an index (MovedLevelMasksAvx2); beyond 2^30
    // the sum below may wrap (real ones are below 2^24): the scalar element.
    const __mmask16 far = _mm512_cmpgt_epi32_mask(_mm512_abs_epi32(b), _mm512_set1_epi32(1 << 30));
    const __m512i p = _mm512_add_epi32(b, shift_v);
    // FloatValue(p) as in the delta decode: e = floor(p / K) corrected by
    // one either way, j = p - e K, the level's bits plus e in the exponent.
    __m512i e, j;
    SplitOctave(p, k, inv_k, &e, &j);
    const __mmask16 abnormal = _mm512_cmpgt_epi32_mask(_mm512_abs_epi32(e), _mm512_set1_epi32(126));
    if ((marked & (far | abnormal)) != 0) {
      scalar_group(i, m);
      continue;
    }
    // Unmarked lanes (any base index, even kNoIndex) look up garbage that
    // is neither compared nor stored.
    const __m512i y = _mm512_add_epi32(Lookup(levels, j, _mm512_test_epi32_mask(j, _mm512_set1_epi32(32))),
                                       _mm512_slli_epi32(e, 23));
    // WithinFactor(y, x, bound) in doubles, as KeepPredictedLevel (false
    // for NaN).
    const __m512i v = _mm512_loadu_si512(values + 4 * i);
    const __m512d x0 = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(v)));
    const __m512d x1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(v, 1)));
    const __m512d y0 = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(y)));
    const __m512d y1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(y, 1)));
    const __mmask8 in0 = _mm512_cmp_pd_mask(y0, _mm512_mul_pd(factor, x0), _CMP_LE_OQ) &
                         _mm512_cmp_pd_mask(x0, _mm512_mul_pd(factor, y0), _CMP_LE_OQ);
    const __mmask8 in1 = _mm512_cmp_pd_mask(y1, _mm512_mul_pd(factor, x1), _CMP_LE_OQ) &
                         _mm512_cmp_pd_mask(x1, _mm512_mul_pd(factor, y1), _CMP_LE_OQ);
    const __mmask16 take = marked & static_cast<__mmask16>(in0 | (in1 << 8));
    if (take == 0) continue;
    _mm512_mask_storeu_epi32(index + i, take, p);
    _mm512_mask_storeu_epi32(recon + 4 * i, take, y);
    changed = true;
  }
  return changed;
}

bool LogVbmiAvailable() {
  static const bool vbmi = LogAvx512Available() && __builtin_cpu_supports("avx512vbmi");
  return vbmi;
}

void UnpackSymbolGroupsAvx512(const std::byte* packed, uint32_t bits, uint64_t groups, uint32_t* out, bool vbmi) {
  (vbmi ? UnpackVbmi : UnpackGathers)(packed, bits, groups, out);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void DecodeKeyTableF32Avx512(const uint32_t* table,
                                                                                 const std::byte* packed,
                                                                                 uint32_t bits, uint64_t n,
                                                                                 std::byte* out) {
  SymbolBlocks blocks(packed, bits, LogVbmiAvailable());
  uint64_t i = 0;
  if (bits <= 6) {
    // Up to 64 entries: register permutes instead of a gather (the same
    // entries; the padding past 2^bits is never indexed).
    alignas(64) uint32_t padded[64] = {};
    std::memcpy(padded, table, (size_t{1} << bits) * sizeof(uint32_t));
    const Table64 t = LoadTable(padded);
    const __m512i upper = _mm512_set1_epi32(32);
    for (; i + 16 <= n; i += 16) {
      const __m512i sym = _mm512_loadu_si512(blocks.Group(i, n));
      _mm512_storeu_si512(out + 4 * i, Lookup(t, sym, _mm512_test_epi32_mask(sym, upper)));
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512i sym = _mm512_loadu_si512(blocks.Group(i, n));
    _mm512_storeu_si512(out + 4 * i, _mm512_i32gather_epi32(sym, table, 4));
  }
  const uint32_t mask = (1u << bits) - 1;
  for (; i < n; ++i) {
    uint64_t word;
    std::memcpy(&word, packed + i * bits / 8, 8);
    StoreLogBits<F32Elem>(out, i, table[static_cast<uint32_t>(le64toh(word) >> (i * bits % 8)) & mask]);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void DecodeDeltaF32Avx512(
    const LogGrid& grid, const LogFractionTable& table, const std::byte* packed, uint32_t bits, int64_t origin,
    int64_t shift, bool zero_carry, const std::byte* base, uint64_t n, std::byte* out) {
  Tables512 t;
  t.level = LoadTable(table.small_level);
  t.offset = LoadTable(table.small_offset);
  const uint32_t per_octave = grid.per_octave();
  const Table64 levels = LevelTable(grid, table);
  const __m512i k = _mm512_set1_epi32(static_cast<int>(per_octave));
  const __m512d inv_k = _mm512_set1_pd(1.0 / static_cast<double>(per_octave));
  const __m512i origin_v = _mm512_set1_epi32(static_cast<int32_t>(origin));
  const __m512i shift_v = _mm512_set1_epi32(static_cast<int32_t>(shift));
  const __m512i one = _mm512_set1_epi32(1);
  SymbolBlocks blocks(packed, bits, LogVbmiAvailable());
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i stored_sym = _mm512_loadu_si512(blocks.Group(i, n));
    const __m512i b = _mm512_loadu_si512(base + 4 * i);
    __m512i sym = stored_sym;
    if (zero_carry) {  // over a +0.0 base element, symbols 0 and 1 exchange
      const __mmask16 swap = _mm512_testn_epi32_mask(b, b) & _mm512_cmple_epu32_mask(sym, one);
      sym = _mm512_mask_xor_epi32(sym, swap, sym, one);
    }
    const __mmask16 base_on_grid = OnGridLanes512(b);
    bool slow = (base_on_grid & static_cast<__mmask16>(~FastLanes512(b))) != 0;
    // predicted + Unzigzag(sym - 1) (0 for symbol 0; symbol 1 is +0.0).
    const __m512i z = _mm512_sub_epi32(sym, one);
    const __m512i dz = _mm512_xor_si512(_mm512_srli_epi32(z, 1), _mm512_sub_epi32(_mm512_setzero_si512(),
                                                                                  _mm512_and_si512(z, one)));
    const __mmask16 is_zero = _mm512_cmpeq_epi32_mask(sym, one);
    const Located512 lb = LocateLanes512(t, k, b, false);
    const __m512i moved = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(sym, sym), dz);
    // FloatValue(q) of q = predicted + moved: e = floor(q / K), j = q - e K,
    // then the level's bits with e added to the exponent field when e is in
    // [-126, 126]. Over a base on the grid q = e_b K + (r_b + shift + moved),
    // which nearly always stays within an octave of the base's: e and j
    // follow from e_b by one step either way, without dividing.
    __m512i e = lb.e;
    __m512i j = _mm512_add_epi32(lb.r, _mm512_add_epi32(shift_v, moved));
    StepIntoOctave(k, &e, &j);
    const __mmask16 within = _mm512_cmplt_epu32_mask(j, k);  // j in [0, K)
    if (static_cast<__mmask16>(~is_zero & ~(base_on_grid & within)) != 0) {
      // A lane predicted from the origin, or moved further: divide.
      const __m512i predicted = _mm512_mask_add_epi32(origin_v, base_on_grid, lb.q, shift_v);
      SplitOctave(_mm512_add_epi32(predicted, moved), k, inv_k, &e, &j);
    }
    const __mmask16 normal = _mm512_cmple_epi32_mask(_mm512_abs_epi32(e), _mm512_set1_epi32(126));
    slow |= static_cast<__mmask16>(~is_zero & ~normal) != 0;
    if (slow) {
      alignas(64) uint32_t syms[16];
      _mm512_store_si512(syms, stored_sym);
      for (uint32_t l = 0; l < 16; ++l) {
        const uint32_t v = DecodeLogElement<F32Elem>(grid, syms[l], base, i + l, origin, shift, zero_carry);
        StoreLogBits<F32Elem>(out, i + l, v);
      }
      continue;
    }
    const __m512i value = _mm512_add_epi32(Lookup(levels, j, _mm512_test_epi32_mask(j, _mm512_set1_epi32(32))),
                                           _mm512_slli_epi32(e, 23));
    _mm512_storeu_si512(out + 4 * i, _mm512_maskz_mov_epi32(static_cast<__mmask16>(~is_zero), value));
  }
  const uint32_t mask = (1u << bits) - 1;
  for (; i < n; ++i) {
    uint64_t word;
    std::memcpy(&word, packed + i * bits / 8, 8);
    const uint32_t sym = static_cast<uint32_t>(le64toh(word) >> (i * bits % 8)) & mask;
    StoreLogBits<F32Elem>(out, i, DecodeLogElement<F32Elem>(grid, sym, base, i, origin, shift, zero_carry));
  }
}

CKPTFS_END_AVX512_CODE

#else

bool LogAvx512Available() { return false; }
bool LogVbmiAvailable() { return false; }
bool KeepPredictedLevelsF32Avx512(const LogGrid&, const LogFractionTable&, const std::byte*, const int32_t*, int64_t,
                                  int32_t, double, uint64_t, int32_t*, std::byte*, const uint8_t*) {
  return false;
}
void UnpackSymbolGroupsAvx512(const std::byte*, uint32_t, uint64_t, uint32_t*, bool) {}
void IndexPassF32Avx512(const IndexGrids&, const std::byte*, const std::byte*, double, uint64_t, int32_t*, int32_t*,
                        std::byte*, LogIndexSums*) {}
void DecodeDeltaF32Avx512(const LogGrid&, const LogFractionTable&, const std::byte*, uint32_t, int64_t, int64_t, bool,
                          const std::byte*, uint64_t, std::byte*) {}
void DecodeKeyTableF32Avx512(const uint32_t*, const std::byte*, uint32_t, uint64_t, std::byte*) {}

#endif

}  // namespace ckptfs::lossy
