// The rANS plane decoder's AVX2 path: the 32 states as four vectors of 8
// lanes, one gather of decode entries per vector. It reads words in the
// same order as the scalar decoder (state 0 to 31), so any stream decodes
// the same either way (tests/unit/codec/tensor_rans_test.cc checks).
#include "codec/tensor/rans_model.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs::rans {

#if defined(__x86_64__)
namespace {

// For a refill mask m (bit j set: lane j takes a word), the index of lane
// j's word among the next 8: the number of set bits of m below bit j.
struct RefillPermutes {
  alignas(32) uint32_t lanes[256][8];
};

constexpr RefillPermutes MakeRefillPermutes() {
  RefillPermutes p{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t below = 0;
    for (uint32_t j = 0; j < 8; ++j) {
      p.lanes[m][j] = below;
      below += (m >> j) & 1;
    }
  }
  return p;
}

constexpr RefillPermutes kRefillPermutes = MakeRefillPermutes();

// For an emit mask m with c bits set, the lanes whose words the encoder
// writes, in lane order, in positions 8 - c to 7 (so that the words end at
// the top of a 16-byte store).
constexpr RefillPermutes MakeEmitPermutes() {
  RefillPermutes p{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t c = 0;
    for (uint32_t j = 0; j < 8; ++j) c += (m >> j) & 1;
    uint32_t at = 8 - c;
    for (uint32_t j = 0; j < 8; ++j)
      if ((m >> j) & 1) p.lanes[m][at++] = j;
  }
  return p;
}

constexpr RefillPermutes kEmitPermutes = MakeEmitPermutes();

}  // namespace

__attribute__((target("avx2,popcnt"))) size_t DecodeGroupsAvx2(const DecodeTable& table, StreamStart& s, uint8_t* out,
                                                        size_t n) {
  static_assert(kStates == 32, "four vectors of eight states");
  __m256i x[4];
  for (int v = 0; v < 4; ++v) x[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.states.data() + 8 * v));
  const __m256i slot_mask = _mm256_set1_epi32(kProbScale - 1);
  const __m256i byte_mask = _mm256_set1_epi32(0xff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  // packus leaves 4-byte runs in the order v0 lo, v1 lo, v2 lo, v3 lo, v0 hi, ...
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const auto* base = reinterpret_cast<const int*>(table.data());
  size_t i = 0;
  for (; i + kStates <= n && s.end - s.words >= static_cast<ptrdiff_t>(2 * kStates); i += kStates) {
    __m256i sym[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i e = _mm256_i32gather_epi32(base, _mm256_and_si256(x[v], slot_mask), 4);
      const __m256i freq = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), slot_mask), one);
      x[v] = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x[v], kProbBits)),
                              _mm256_srli_epi32(e, 20));
      sym[v] = _mm256_and_si256(e, byte_mask);
    }
    const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(sym[0], sym[1]), _mm256_packus_epi32(sym[2], sym[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permutevar8x32_epi32(packed, unshuffle));
    // Refill in state order; after v vectors at most 16 * v bytes are
    // used, so the 16-byte load stays inside the checked 64.
    for (int v = 0; v < 4; ++v) {
      const __m256i refill = _mm256_cmpeq_epi32(_mm256_srli_epi32(x[v], 16), zero);
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(refill));
      __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.words)));
      words = _mm256_permutevar8x32_epi32(
          words, _mm256_load_si256(reinterpret_cast<const __m256i*>(kRefillPermutes.lanes[m])));
      x[v] = _mm256_blendv_epi8(x[v], _mm256_or_si256(_mm256_slli_epi32(x[v], 16), words), refill);
      s.words += 2 * __builtin_popcount(static_cast<unsigned>(m));
    }
  }
  for (int v = 0; v < 4; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.states.data() + 8 * v), x[v]);
  return i;
}

__attribute__((target("avx2,popcnt"))) std::byte* EncodeGroupsAvx2(const uint8_t* in, size_t whole,
                                                           const EncodeTables& tables, uint32_t* states,
                                                           std::byte* w, const std::byte* lowest) {
  static_assert(kStates == 32, "four vectors of eight states");
  __m256i x[4];
  for (int v = 0; v < 4; ++v) x[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(states + 8 * v));
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i low13 = _mm256_set1_epi32(0x1fff);
  const __m256i low12 = _mm256_set1_epi32(0xfff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i scale = _mm256_set1_epi32(kProbScale);
  const __m256i low32 = _mm256_set1_epi64x(0xffffffffll);
  // Bytes 0-1 of each 32-bit lane to the low 8 bytes of each 128-bit half.
  const __m256i words16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                           0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const auto* rcp_base = reinterpret_cast<const int*>(tables.rcp.data());
  const auto* info_base = reinterpret_cast<const int*>(tables.info.data());
  for (size_t g = whole; g > 0; g -= kStates) {
    // One group writes at most 64 bytes; the 16-byte stores reach 16 below
    // the lowest word, which the next vector or group overwrites.
    if (w - lowest < static_cast<ptrdiff_t>(2 * kStates)) return nullptr;
    for (int v = 3; v >= 0; --v) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + g - kStates + 8 * v));
      const __m256i sym = _mm256_cvtepu8_epi32(bytes);
      const __m256i info = _mm256_i32gather_epi32(info_base, sym, 4);
      const __m256i rcp = _mm256_i32gather_epi32(rcp_base, sym, 4);
      const __m256i freq = _mm256_and_si256(info, low13);
      // freq << 20 wraps to 0 for freq 4096, and the limit to 2^32 - 1.
      const __m256i limit = _mm256_sub_epi32(_mm256_slli_epi32(freq, 32 - kProbBits), one);
      const __m256i emit = _mm256_cmpgt_epi32(_mm256_xor_si256(x[v], sign), _mm256_xor_si256(limit, sign));
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(emit));
      const __m256i picked = _mm256_permutevar8x32_epi32(
          x[v], _mm256_load_si256(reinterpret_cast<const __m256i*>(kEmitPermutes.lanes[m])));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(picked, words16), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 16), _mm256_castsi256_si128(packed));
      w -= 2 * __builtin_popcount(static_cast<unsigned>(m));
      const __m256i s = _mm256_blendv_epi8(x[v], _mm256_srli_epi32(x[v], 16), emit);
      // q = ((s * rcp >> 32) + s) >> shift in 64-bit halves (even, odd lanes).
      const __m256i shift = _mm256_srli_epi32(info, 25);
      const __m256i s_odd = _mm256_srli_epi64(s, 32);
      __m256i q_even = _mm256_srli_epi64(_mm256_mul_epu32(s, rcp), 32);
      q_even = _mm256_srlv_epi64(_mm256_add_epi64(q_even, _mm256_and_si256(s, low32)), _mm256_and_si256(shift, low32));
      __m256i q_odd = _mm256_srli_epi64(_mm256_mul_epu32(s_odd, _mm256_srli_epi64(rcp, 32)), 32);
      q_odd = _mm256_srlv_epi64(_mm256_add_epi64(q_odd, s_odd), _mm256_srli_epi64(shift, 32));
      const __m256i q = _mm256_or_si256(q_even, _mm256_slli_epi64(q_odd, 32));
      const __m256i start = _mm256_and_si256(_mm256_srli_epi32(info, 13), low12);
      x[v] = _mm256_add_epi32(_mm256_add_epi32(s, start), _mm256_mullo_epi32(q, _mm256_sub_epi32(scale, freq)));
    }
  }
  for (int v = 0; v < 4; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(states + 8 * v), x[v]);
  return w;
}

// Unsigned minimum and maximum, and signed ones: as signed bytes the values
// from 0x80 on are negative, so the signed maximum is the largest below
// 0x80 and the signed minimum the smallest from 0x80 on (where they exist).
__attribute__((target("avx2"))) ByteRanges FindByteRangesAvx2(const uint8_t* p, size_t n) {
  __m256i umin = _mm256_set1_epi8(-1), umax = _mm256_setzero_si256();
  __m256i smin = _mm256_set1_epi8(127), smax = _mm256_set1_epi8(-128);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    umin = _mm256_min_epu8(umin, v);
    umax = _mm256_max_epu8(umax, v);
    smin = _mm256_min_epi8(smin, v);
    smax = _mm256_max_epi8(smax, v);
  }
  alignas(32) uint8_t lanes[4][32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), umin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), umax);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), smin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[3]), smax);
  uint32_t u_min = 255, u_max = 0;
  int s_min = 127, s_max = -128;
  for (int j = 0; j < 32; ++j) {
    u_min = std::min<uint32_t>(u_min, lanes[0][j]);
    u_max = std::max<uint32_t>(u_max, lanes[1][j]);
    s_min = std::min<int>(s_min, static_cast<int8_t>(lanes[2][j]));
    s_max = std::max<int>(s_max, static_cast<int8_t>(lanes[3][j]));
  }
  for (; i < n; ++i) {
    u_min = std::min<uint32_t>(u_min, p[i]);
    u_max = std::max<uint32_t>(u_max, p[i]);
    s_min = std::min<int>(s_min, static_cast<int8_t>(p[i]));
    s_max = std::max<int>(s_max, static_cast<int8_t>(p[i]));
  }
  return ByteRanges{u_min, static_cast<uint32_t>(s_max) & 0xff, static_cast<uint32_t>(s_min) & 0xff, u_max};
}

#else

ByteRanges FindByteRangesAvx2(const uint8_t*, size_t) { return ByteRanges{0xff, 0, 0xff, 0}; }
std::byte* EncodeGroupsAvx2(const uint8_t*, size_t, const EncodeTables&, uint32_t*, std::byte*, const std::byte*) {
  return nullptr;
}
size_t DecodeGroupsAvx2(const DecodeTable&, StreamStart&, uint8_t*, size_t) { return 0; }

#endif

}  // namespace ckptfs::rans
