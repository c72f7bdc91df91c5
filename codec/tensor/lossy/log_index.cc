// The log mode's fraction table and the AVX2 paths of its per-element
// passes that compute grid indices and decode (see log_index.h; the
// integer passes over indices and symbols are in log_symbols_avx2.cc). Compiled with -ffp-contract=off like the rest of
// the codec: the bound check and the error terms are the same IEEE double
// subtracts, multiplies and divides as the scalar reference, and the two
// order-dependent sums (err2, ref2) are still added one element at a time in
// element order, so every output equals the scalar one bit for bit.
#include "codec/tensor/lossy/log_index.h"

#include <algorithm>
#include <cstring>

#include "codec/common/simd_level.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::lossy {

namespace {

// Splits the fractions into 2^log2_buckets buckets: per bucket the level of
// its first fraction and the offset in the bucket where the next level
// starts (the bucket's size when none does). False when some bucket holds
// two level boundaries. `level(f)` is the scalar reference's level.
template <typename LevelOf>
bool BucketLevels(const LevelOf& level, uint32_t log2_buckets, std::vector<uint32_t>* first_level,
                  std::vector<uint32_t>* offset) {
  const uint32_t shift = 23 - log2_buckets, size = 1u << shift;
  first_level->assign(size_t{1} << log2_buckets, 0);
  offset->assign(size_t{1} << log2_buckets, size);
  for (uint32_t b = 0; b < first_level->size(); ++b) {
    const uint32_t first = b << shift, last = first + size - 1;
    const uint32_t r0 = level(first), r1 = level(last);
    (*first_level)[b] = r0;
    if (r1 == r0) continue;
    if (r1 != r0 + 1) return false;
    uint32_t lo = first + 1, hi = last;  // the first f with level r1 lies in [lo, hi]
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (level(mid) > r0) hi = mid;
      else lo = mid + 1;
    }
    (*offset)[b] = lo - first;
  }
  return true;
}

}  // namespace

std::optional<LogFractionTable> LogFractionTable::Build(const LogGrid& grid) {
  const uint32_t k = grid.per_octave();
  if (k >= (1u << 15)) return std::nullopt;  // levels and offsets must fit 16 bits
  // The rounded level of fraction f at exponent 0, by the scalar reference.
  auto level = [&](uint32_t f) {
    return static_cast<uint32_t>(grid.Locate(std::bit_cast<float>((127u << 23) | f)).q);
  };
  LogFractionTable t;
  t.ratio = grid.ratio();
  t.rounding = grid.rounding();
  t.level_bits.resize(k + 1);
  for (uint32_t r = 0; r <= k; ++r) t.level_bits[r] = std::bit_cast<uint32_t>(grid.FloatValue(r));
  uint32_t log2_buckets = 8;  // shift <= 15: an offset up to 2^shift fits 16 bits
  while ((1u << log2_buckets) < 2 * k) ++log2_buckets;
  // Thresholds are about (ratio - 1) 2^23 apart, more than a bucket of 2^23 / (2K):
  // the first size always fits; the loop is a guard that makes it a checked fact.
  std::vector<uint32_t> first_level, offset;
  while (log2_buckets <= 20 && !BucketLevels(level, log2_buckets, &first_level, &offset)) ++log2_buckets;
  if (log2_buckets > 20) return std::nullopt;
  t.shift = 23 - log2_buckets;
  t.entry.resize(first_level.size());
  t.low_bits.resize(first_level.size());
  t.high_bits.resize(first_level.size());
  for (size_t b = 0; b < first_level.size(); ++b) {
    t.entry[b] = (first_level[b] << 16) | offset[b];
    t.low_bits[b] = t.level_bits[first_level[b]];
    t.high_bits[b] = t.level_bits[std::min(first_level[b] + 1, k)];  // level K: the offset is never reached
  }
  // The 64-bucket tables of the AVX-512 path, when 64 buckets suffice.
  if (k < 64 && BucketLevels(level, 6, &first_level, &offset)) {
    t.has_small = true;
    for (uint32_t b = 0; b < 64; ++b) {
      t.small_level[b] = first_level[b];
      t.small_offset[b] = offset[b];
      t.small_low_bits[b] = t.level_bits[first_level[b]];
      t.small_high_bits[b] = t.level_bits[std::min(first_level[b] + 1, k)];
    }
  }
  return t;
}

#if defined(__x86_64__)

bool LogSimdAvailable() { return CpuHasSimd(SimdLevel::kAvx2); }

namespace {

#define CKPTFS_LOG_AVX2 __attribute__((target("avx2"), always_inline)) inline

// Lanes of a float vector (as int32 bits) that take the table path: x
// positive with an exponent field in [1, 252], so the result is a normal
// float (level exponent <= 126). Other positive finite lanes (subnormal,
// or >= 2^126) need the general path.
CKPTFS_LOG_AVX2 __m256i FastLanes(__m256i v) {
  return _mm256_and_si256(_mm256_cmpgt_epi32(v, _mm256_set1_epi32(0x007FFFFF)),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(253 << 23), v));
}
// Lanes with x > 0 and finite (OnGrid).
CKPTFS_LOG_AVX2 __m256i OnGridLanes(__m256i v) {
  return _mm256_and_si256(_mm256_cmpgt_epi32(v, _mm256_setzero_si256()),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), v));
}

// The eight `bits`-bit symbols of a group that starts on a byte, for bits
// <= 15: lanes 0-3 from the 8 bytes at the group, lanes 4-7 from the 8
// bytes at its byte (4 bits) / 8, each shifted by its own count (no 64-bit
// window is overrun: r + 4 bits <= 64). It reads exactly what SymbolAt
// reads for lanes 0 and 4.
struct GroupUnpacker {
  __m256i shift_lo, shift_hi, mask;
  uint32_t hi_byte;
};
CKPTFS_LOG_AVX2 GroupUnpacker MakeGroupUnpacker(uint32_t bits) {
  const int64_t b = bits, r = (4 * b) % 8;
  return {_mm256_setr_epi64x(0, b, 2 * b, 3 * b), _mm256_setr_epi64x(r, r + b, r + 2 * b, r + 3 * b),
          _mm256_set1_epi32(static_cast<int>((1u << bits) - 1)), static_cast<uint32_t>(4 * bits / 8)};
}
CKPTFS_LOG_AVX2 __m256i UnpackGroup(const GroupUnpacker& u, const std::byte* group) {
  uint64_t w0, w1;
  std::memcpy(&w0, group, 8);  // little-endian host, as SymbolAt's le64toh
  std::memcpy(&w1, group + u.hi_byte, 8);
  const __m256i lo = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(w0)), u.shift_lo);
  const __m256i hi = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(w1)), u.shift_hi);
  const __m256i low_dwords = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i v = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(lo, low_dwords),
                                       _mm256_permutevar8x32_epi32(hi, low_dwords), 0xF0);
  return _mm256_and_si256(v, u.mask);
}
static_assert(kMaxAvx2UnpackBits <= 15, "r + 4 bits must fit a 64-bit window");

struct Located {
  __m256i q, value;
};
// Locate for fast lanes (others get garbage).
CKPTFS_LOG_AVX2 Located LocateLanes(const LogFractionTable& t, __m256i k, __m256i v, bool want_value) {
  const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(v, 23), _mm256_set1_epi32(127));
  const __m256i f = _mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFF));
  const __m256i bucket = _mm256_srli_epi32(f, static_cast<int>(t.shift));
  const __m256i entry =
      _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.entry.data()), bucket, 4);
  const __m256i in_bucket = _mm256_and_si256(f, _mm256_set1_epi32(static_cast<int>((1u << t.shift) - 1)));
  const __m256i offset = _mm256_and_si256(entry, _mm256_set1_epi32(0xFFFF));
  // in_bucket >= offset is in_bucket > offset - 1; the mask is -1: subtract it.
  const __m256i up = _mm256_cmpgt_epi32(in_bucket, _mm256_sub_epi32(offset, _mm256_set1_epi32(1)));
  const __m256i r = _mm256_sub_epi32(_mm256_srli_epi32(entry, 16), up);
  Located out;
  out.q = _mm256_add_epi32(_mm256_mullo_epi32(e, k), r);
  if (want_value) {
    const __m256i low = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.low_bits.data()), bucket, 4);
    const __m256i high = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.high_bits.data()), bucket, 4);
    const __m256i bits = _mm256_blendv_epi8(low, high, up);
    out.value = _mm256_add_epi32(bits, _mm256_slli_epi32(e, 23));
  } else {
    out.value = _mm256_setzero_si256();
  }
  return out;
}

// Sign-extends the low or high four int32 mask lanes to a double mask.
CKPTFS_LOG_AVX2 __m256d MaskLow(__m256i m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(m))); }
CKPTFS_LOG_AVX2 __m256d MaskHigh(__m256i m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1))); }

// The running per-lane maximum of |e| / x over the lanes set in m0 / m1
// (|e| in a0 / a1, x in x0 / x1). A quotient can only raise a lane's maximum
// where |e| > max * x; the test is that with the product's two roundings
// allowed for (fl(fl(max x) (1 - 2^-50)) < max x in reals, below_one =
// 1 - 2^-50), so a skipped quotient is <= max. After the first elements the
// divisions are rare.
CKPTFS_LOG_AVX2 __m256d RaiseMaxRel(__m256d max_rel_seen, __m256d m0, __m256d m1, __m256d a0, __m256d a1,
                                    __m256d x0, __m256d x1, __m256d below_one) {
  const __m256d need0 = _mm256_and_pd(
      m0, _mm256_cmp_pd(a0, _mm256_mul_pd(_mm256_mul_pd(max_rel_seen, x0), below_one), _CMP_GT_OQ));
  const __m256d need1 = _mm256_and_pd(
      m1, _mm256_cmp_pd(a1, _mm256_mul_pd(_mm256_mul_pd(max_rel_seen, x1), below_one), _CMP_GT_OQ));
  if (_mm256_movemask_pd(_mm256_or_pd(need0, need1)) != 0) {
    max_rel_seen = _mm256_max_pd(max_rel_seen, _mm256_and_pd(m0, _mm256_div_pd(a0, x0)));
    max_rel_seen = _mm256_max_pd(max_rel_seen, _mm256_and_pd(m1, _mm256_div_pd(a1, x1)));
  }
  return max_rel_seen;
}

// The lanes of `vote` whose difference `d` is `delta`, as a bit mask.
__attribute__((target("avx2"), always_inline)) inline uint32_t VoteLanes(__m256i vote, __m256i d, int32_t delta) {
  const __m256i hit = _mm256_and_si256(vote, _mm256_cmpeq_epi32(d, _mm256_set1_epi32(delta)));
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
}

template <bool kDelta>
__attribute__((target("avx2"))) void IndexPassAvx2(const IndexGrids& grids, const std::byte* values,
                                                   const std::byte* base, double max_rel, uint64_t n, int32_t* index,
                                                   int32_t* base_index, std::byte* recon, LogIndexSums* sums) {
  const LogFractionTable& t = *grids.code_table;
  const __m256i k = _mm256_set1_epi32(static_cast<int>(grids.code.per_octave()));
  const __m256d factor = _mm256_set1_pd(1.0 + max_rel);  // WithinFactor's
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256d below_one = _mm256_set1_pd(1.0 - 0x1p-50);
  __m256i lo = _mm256_set1_epi32(std::numeric_limits<int32_t>::max());
  __m256i hi = _mm256_set1_epi32(std::numeric_limits<int32_t>::min());
  __m256d max_abs = _mm256_setzero_pd(), max_rel_seen = _mm256_setzero_pd();
  double err2 = sums->err2, ref2 = sums->ref2;
  uint64_t votes_same = 0, votes_up = 0, votes_down = 0;  // d = 0, +1, -1
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 4 * i));
    const __m256i on_grid = OnGridLanes(v);
    const __m256i fast = FastLanes(v);
    __m256i b, base_on_grid, base_fast;
    if constexpr (kDelta) {
      b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 4 * i));
      base_on_grid = OnGridLanes(b);
      base_fast = FastLanes(b);
    }
    // A lane on the grid but off the table path sends the group to the reference.
    __m256i slow = _mm256_andnot_si256(fast, on_grid);
    if constexpr (kDelta) slow = _mm256_or_si256(slow, _mm256_andnot_si256(base_fast, base_on_grid));
    if (!_mm256_testz_si256(slow, slow)) {
      sums->err2 = err2, sums->ref2 = ref2;
      for (uint64_t j = i; j < i + 8; ++j)
        IndexElement<F32Elem, kDelta>(grids, values, base, max_rel, j, index, base_index, recon, sums);
      err2 = sums->err2, ref2 = sums->ref2;
      continue;
    }
    const Located p = LocateLanes(t, k, v, true);
    // The bound check in double, four lanes at a time (WithinFactor).
    const __m128i v_lo = _mm256_castsi256_si128(v), v_hi = _mm256_extracti128_si256(v, 1);
    const __m256d x0 = _mm256_cvtps_pd(_mm_castsi128_ps(v_lo)), x1 = _mm256_cvtps_pd(_mm_castsi128_ps(v_hi));
    const __m256d r0 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_castsi256_si128(p.value)));
    const __m256d r1 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_extracti128_si256(p.value, 1)));
    const __m256d e0 = _mm256_sub_pd(r0, x0), e1 = _mm256_sub_pd(r1, x1);
    const __m256d a0 = _mm256_and_pd(e0, abs_mask), a1 = _mm256_and_pd(e1, abs_mask);
    const __m256d in0 = _mm256_and_pd(_mm256_cmp_pd(r0, _mm256_mul_pd(factor, x0), _CMP_LE_OQ),
                                      _mm256_cmp_pd(x0, _mm256_mul_pd(factor, r0), _CMP_LE_OQ));
    const __m256d in1 = _mm256_and_pd(_mm256_cmp_pd(r1, _mm256_mul_pd(factor, x1), _CMP_LE_OQ),
                                      _mm256_cmp_pd(x1, _mm256_mul_pd(factor, r1), _CMP_LE_OQ));
    const uint32_t in_bits = static_cast<uint32_t>(_mm256_movemask_pd(in0) | (_mm256_movemask_pd(in1) << 4));
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i in_bound =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(in_bits)), lane_bit), lane_bit);
    const __m256i quant = _mm256_and_si256(on_grid, in_bound);
    const __m256i zero = _mm256_cmpeq_epi32(v, _mm256_setzero_si256());
    __m256i q = _mm256_blendv_epi8(_mm256_set1_epi32(kNoIndex), _mm256_set1_epi32(kZeroIndex), zero);
    q = _mm256_blendv_epi8(q, p.q, quant);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(index + i), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(recon + 4 * i), _mm256_blendv_epi8(v, p.value, quant));
    lo = _mm256_min_epi32(lo, _mm256_blendv_epi8(_mm256_set1_epi32(std::numeric_limits<int32_t>::max()), p.q, quant));
    hi = _mm256_max_epi32(hi, _mm256_blendv_epi8(_mm256_set1_epi32(std::numeric_limits<int32_t>::min()), p.q, quant));
    // Error terms of the quantized lanes (0 elsewhere: adding +0 leaves a sum unchanged).
    const __m256d m0 = MaskLow(quant), m1 = MaskHigh(quant);
    const __m256d q0 = _mm256_and_pd(m0, a0), q1 = _mm256_and_pd(m1, a1);
    max_abs = _mm256_max_pd(max_abs, _mm256_max_pd(q0, q1));
    max_rel_seen = RaiseMaxRel(max_rel_seen, m0, m1, a0, a1, x0, x1, below_one);
    alignas(32) double sq[8], ref[8];
    _mm256_store_pd(sq, _mm256_and_pd(m0, _mm256_mul_pd(e0, e0)));
    _mm256_store_pd(sq + 4, _mm256_and_pd(m1, _mm256_mul_pd(e1, e1)));
    const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), _mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF)));
    _mm256_store_pd(ref, _mm256_and_pd(MaskLow(finite), _mm256_mul_pd(x0, x0)));
    _mm256_store_pd(ref + 4, _mm256_and_pd(MaskHigh(finite), _mm256_mul_pd(x1, x1)));
    for (int l = 0; l < 8; ++l) {
      err2 += sq[l];
      ref2 += ref[l];
    }
    sums->quantized += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(quant)))));
    if constexpr (kDelta) {
      const Located pb = LocateLanes(*grids.base_table, k, b, false);
      const __m256i qb = _mm256_blendv_epi8(_mm256_set1_epi32(kNoIndex), pb.q, base_on_grid);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(base_index + i), qb);
      // Votes: quantized lanes over a base on the grid with |q - qb| <= kMaxShift.
      const __m256i d = _mm256_sub_epi32(p.q, pb.q);
      const __m256i near = _mm256_cmpgt_epi32(_mm256_set1_epi32(kMaxShift + 1), _mm256_abs_epi32(d));
      const __m256i vote = _mm256_and_si256(_mm256_and_si256(quant, base_on_grid), near);
      // Nearly every vote is -1, 0 or +1: counted by mask (the four tables
      // are only ever summed), the rest one by one.
      const uint32_t same = VoteLanes(vote, d, 0), up = VoteLanes(vote, d, 1), down = VoteLanes(vote, d, -1);
      votes_same += static_cast<uint64_t>(std::popcount(same));
      votes_up += static_cast<uint64_t>(std::popcount(up));
      votes_down += static_cast<uint64_t>(std::popcount(down));
      uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(vote))) & ~(same | up | down);
      if (mask != 0) {
        alignas(32) int32_t ds[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(ds), d);
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
  alignas(32) int32_t lanes_lo[8], lanes_hi[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_lo), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_hi), hi);
  alignas(32) double abs_lanes[4], rel_lanes[4];
  _mm256_store_pd(abs_lanes, max_abs);
  _mm256_store_pd(rel_lanes, max_rel_seen);
  for (int l = 0; l < 8; ++l) sums->lo = std::min(sums->lo, lanes_lo[l]), sums->hi = std::max(sums->hi, lanes_hi[l]);
  for (int l = 0; l < 4; ++l) {
    sums->max_abs = std::max(sums->max_abs, abs_lanes[l]);
    sums->achieved_rel = std::max(sums->achieved_rel, rel_lanes[l]);
  }
}

}  // namespace

void IndexPassF32Avx2(const IndexGrids& grids, const std::byte* values, const std::byte* base, double max_rel,
                      uint64_t n, int32_t* index, int32_t* base_index, std::byte* recon, LogIndexSums* sums) {
  if (base != nullptr) {
    IndexPassAvx2<true>(grids, values, base, max_rel, n, index, base_index, recon, sums);
  } else {
    IndexPassAvx2<false>(grids, values, base, max_rel, n, index, base_index, recon, sums);
  }
}

__attribute__((target("avx2"))) void EscapedErrorSumsF32Avx2(const std::byte* values, const std::byte* recon,
                                                             const int32_t* index, const uint32_t* symbols,
                                                             uint32_t limit, uint64_t n, LogIndexSums* sums) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256d below_one = _mm256_set1_pd(1.0 - 0x1p-50);
  const __m256i above = _mm256_set1_epi32(static_cast<int>(~limit));
  __m256d max_abs = _mm256_setzero_pd(), max_rel_seen = _mm256_setzero_pd();
  double err2 = sums->err2;
  uint64_t quantized = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + i));
    const __m256i sym = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + i));
    // Quantized (an index that is neither kNoIndex nor kZeroIndex) and not escaped.
    const __m256i has_index = _mm256_cmpgt_epi32(q, _mm256_set1_epi32(kZeroIndex));
    const __m256i kept = _mm256_and_si256(has_index, _mm256_cmpeq_epi32(_mm256_and_si256(sym, above), _mm256_setzero_si256()));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 4 * i));
    const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(recon + 4 * i));
    const __m256d x0 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_castsi256_si128(v)));
    const __m256d x1 = _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_extracti128_si256(v, 1)));
    const __m256d e0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_castsi128_ps(_mm256_castsi256_si128(r))), x0);
    const __m256d e1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_castsi128_ps(_mm256_extracti128_si256(r, 1))), x1);
    const __m256d m0 = MaskLow(kept), m1 = MaskHigh(kept);
    const __m256d a0 = _mm256_and_pd(m0, _mm256_and_pd(e0, abs_mask)), a1 = _mm256_and_pd(m1, _mm256_and_pd(e1, abs_mask));
    max_abs = _mm256_max_pd(max_abs, _mm256_max_pd(a0, a1));
    max_rel_seen = RaiseMaxRel(max_rel_seen, m0, m1, a0, a1, x0, x1, below_one);
    alignas(32) double sq[8];
    _mm256_store_pd(sq, _mm256_and_pd(m0, _mm256_mul_pd(e0, e0)));
    _mm256_store_pd(sq + 4, _mm256_and_pd(m1, _mm256_mul_pd(e1, e1)));
    for (int l = 0; l < 8; ++l) err2 += sq[l];
    quantized += static_cast<uint64_t>(std::popcount(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(kept)))));
  }
  alignas(32) double abs_lanes[4], rel_lanes[4];
  _mm256_store_pd(abs_lanes, max_abs);
  _mm256_store_pd(rel_lanes, max_rel_seen);
  sums->err2 = err2;
  sums->quantized += quantized;
  for (int l = 0; l < 4; ++l) {
    sums->max_abs = std::max(sums->max_abs, abs_lanes[l]);
    sums->achieved_rel = std::max(sums->achieved_rel, rel_lanes[l]);
  }
  for (; i < n; ++i) AddEscapedErrors<F32Elem>(values, recon, index, symbols, limit, i, sums);
}

__attribute__((target("avx2"))) void DecodeKeyTableF32Avx2(const uint32_t* table, const std::byte* packed,
                                                           uint32_t bits, uint64_t n, std::byte* out) {
  const GroupUnpacker unpacker = MakeGroupUnpacker(bits);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i sym = UnpackGroup(unpacker, packed + i / 8 * bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * i),
                        _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), sym, 4));
  }
  const uint32_t mask = (1u << bits) - 1;
  for (; i < n; ++i) StoreLogBits<F32Elem>(out, i, table[SymbolAt(packed, i, bits, mask)]);
}

__attribute__((target("avx2"))) void DecodeDeltaF32Avx2(const LogGrid& grid, const LogFractionTable& table,
                                                        const std::byte* packed, uint32_t bits, int64_t origin,
                                                        int64_t shift, bool zero_carry, const std::byte* base,
                                                        uint64_t n, std::byte* out) {
  const uint32_t per_octave = grid.per_octave();
  const __m256i k = _mm256_set1_epi32(static_cast<int>(per_octave));
  const __m256d inv_k = _mm256_set1_pd(1.0 / static_cast<double>(per_octave));
  const __m256i origin_v = _mm256_set1_epi32(static_cast<int32_t>(origin));
  const __m256i shift_v = _mm256_set1_epi32(static_cast<int32_t>(shift));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  const uint32_t mask = (1u << bits) - 1;
  const int* level_bits = reinterpret_cast<const int*>(table.level_bits.data());
  alignas(32) uint32_t syms[8];
  const bool vector_unpack = bits <= kMaxAvx2UnpackBits;
  const GroupUnpacker unpacker = MakeGroupUnpacker(std::min(bits, kMaxAvx2UnpackBits));
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // The group's symbols start on a byte (i is a multiple of 8).
    const std::byte* group = packed + i / 8 * bits;
    __m256i stored_sym;
    if (vector_unpack) {
      stored_sym = UnpackGroup(unpacker, group);
    } else {
      for (uint32_t l = 0; l < 8; ++l) syms[l] = SymbolAt(group, l, bits, mask);
      stored_sym = _mm256_load_si256(reinterpret_cast<const __m256i*>(syms));
    }
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 4 * i));
    __m256i sym = stored_sym;
    if (zero_carry) {  // over a +0.0 base element, symbols 0 and 1 exchange
      const __m256i low_sym = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), sym);  // sym <= 1 (symbols < 2^24)
      const __m256i swap = _mm256_and_si256(_mm256_cmpeq_epi32(b, zero), low_sym);
      sym = _mm256_xor_si256(sym, _mm256_and_si256(swap, one));
    }
    const __m256i base_on_grid = OnGridLanes(b);
    int slow = _mm256_movemask_epi8(_mm256_andnot_si256(FastLanes(b), base_on_grid));
    // predicted + Unzigzag(sym - 1) (0 for symbol 0; symbol 1 is +0.0).
    const __m256i z = _mm256_sub_epi32(sym, one);
    const __m256i dz = _mm256_xor_si256(_mm256_srli_epi32(z, 1), _mm256_sub_epi32(zero, _mm256_and_si256(z, one)));
    const __m256i is_zero = _mm256_cmpeq_epi32(sym, one);
    const __m256i qb = LocateLanes(table, k, b, false).q;
    const __m256i predicted = _mm256_blendv_epi8(origin_v, _mm256_add_epi32(qb, shift_v), base_on_grid);
    const __m256i q = _mm256_add_epi32(predicted, _mm256_andnot_si256(_mm256_cmpeq_epi32(sym, zero), dz));
    // FloatValue(q): e = floor(q / K) estimated in doubles (at most one off,
    // corrected), j = q - e K, then the level's bits with e added to the
    // exponent field when e is in [-126, 126].
    const __m128i e_lo = _mm256_cvttpd_epi32(
        _mm256_floor_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), inv_k)));
    const __m128i e_hi = _mm256_cvttpd_epi32(
        _mm256_floor_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), inv_k)));
    __m256i e = _mm256_set_m128i(e_hi, e_lo);
    __m256i j = _mm256_sub_epi32(q, _mm256_mullo_epi32(e, k));
    const __m256i low = _mm256_cmpgt_epi32(zero, j);
    e = _mm256_add_epi32(e, low);  // the mask is -1
    j = _mm256_add_epi32(j, _mm256_and_si256(low, k));
    const __m256i high = _mm256_cmpgt_epi32(j, _mm256_sub_epi32(k, one));
    e = _mm256_sub_epi32(e, high);
    j = _mm256_sub_epi32(j, _mm256_and_si256(high, k));
    const __m256i abnormal = _mm256_cmpgt_epi32(_mm256_abs_epi32(e), _mm256_set1_epi32(126));
    slow |= _mm256_movemask_epi8(_mm256_andnot_si256(is_zero, abnormal));
    if (slow != 0) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(syms), stored_sym);
      for (uint32_t l = 0; l < 8; ++l)
        StoreLogBits<F32Elem>(out, i + l,
                              DecodeLogElement<F32Elem>(grid, syms[l], base, i + l, origin, shift, zero_carry));
      continue;
    }
    const __m256i value = _mm256_add_epi32(_mm256_i32gather_epi32(level_bits, j, 4), _mm256_slli_epi32(e, 23));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * i), _mm256_andnot_si256(is_zero, value));
  }
  for (; i < n; ++i)
    StoreLogBits<F32Elem>(out, i,
                          DecodeLogElement<F32Elem>(grid, SymbolAt(packed, i, bits, mask), base, i, origin, shift,
                                                    zero_carry));
}

#else

bool LogSimdAvailable() { return false; }
void EscapedErrorSumsF32Avx2(const std::byte*, const std::byte*, const int32_t*, const uint32_t*, uint32_t, uint64_t,
                             LogIndexSums*) {}
void IndexPassF32Avx2(const IndexGrids&, const std::byte*, const std::byte*, double, uint64_t, int32_t*, int32_t*,
                      std::byte*, LogIndexSums*) {}
void DecodeDeltaF32Avx2(const LogGrid&, const LogFractionTable&, const std::byte*, uint32_t, int64_t, int64_t, bool,
                        const std::byte*, uint64_t, std::byte*) {}
void DecodeKeyTableF32Avx2(const uint32_t*, const std::byte*, uint32_t, uint64_t, std::byte*) {}

#endif

}  // namespace ckptfs::lossy
