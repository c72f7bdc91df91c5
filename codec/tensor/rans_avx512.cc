// The rANS plane encoder's and decoder's AVX-512 paths. The encoder: the 32 states as four vectors of
// eight 64-bit lanes, so that one 64-bit gather fetches all of a symbol's
// coding values and the division by the frequency (a multiply by its
// reciprocal, see rans.cc) runs in the lanes as they are. Writes the same
// words in the same order as the scalar and AVX2 encoders
// (tests/unit/codec/tensor_rans_test.cc checks). Where the CPU has IFMA and
// VBMI, a second encoder divides with 52-bit multiply-adds and moves the
// emitted words with one byte permute (~14% faster bf16 chunks).
#include "codec/common/simd_level.h"
#include "codec/tensor/rans_model.h"

#if defined(__x86_64__)
CKPTFS_BEGIN_AVX512_CODE  // (GCC bug 105593: codec/common/simd_level.h)
#include <immintrin.h>
#endif

namespace ckptfs::rans {

#if defined(__x86_64__)

namespace {

// For an emit mask m with c bits set, the lanes whose words the encoder
// writes, in lane order, in positions 8 - c to 7: the words then end at the
// top of a 16-byte store, and what it writes below them is overwritten by
// later words (a masked store to the exact place costs more).
struct EmitLanes {
  alignas(8) uint8_t lanes[256][8];
};

constexpr EmitLanes MakeEmitLanes() {
  EmitLanes t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t c = 0;
    for (uint32_t j = 0; j < 8; ++j) c += (m >> j) & 1;
    uint32_t at = 8 - c;
    for (uint32_t j = 0; j < 8; ++j)
      if ((m >> j) & 1) t.lanes[m][at++] = static_cast<uint8_t>(j);
  }
  return t;
}

constexpr EmitLanes kEmitLanes = MakeEmitLanes();

#define CKPTFS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,popcnt"), always_inline)) inline

// Encodes the eight bytes at `sym` into the eight states of x, writing
// their renormalisation words (in lane order) below w.
CKPTFS_AVX512 __m512i EncodeVector(__m512i x, const uint8_t* sym, const long long* table, std::byte*& w) {
  const __m512i e = _mm512_i64gather_epi64(_mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym))),
                                           table, 8);
  const __m512i freq = _mm512_and_si512(_mm512_srli_epi64(e, 32), _mm512_set1_epi64(0x1fff));
  // Renormalise while x > (freq << 20) - 1, that is x >> 20 >= freq.
  const __mmask8 emit = _mm512_cmpge_epu64_mask(_mm512_srli_epi64(x, 32 - kProbBits), freq);
  const __m512i lanes = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kEmitLanes.lanes[emit])));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 16), _mm512_cvtepi64_epi16(_mm512_permutexvar_epi64(lanes, x)));
  w -= 2 * __builtin_popcount(emit);
  const __m512i s = _mm512_mask_srli_epi64(x, emit, x, 16);
  // q = ((s * rcp >> 32) + s) >> shift; rcp is e's low half.
  const __m512i q =
      _mm512_srlv_epi64(_mm512_add_epi64(_mm512_srli_epi64(_mm512_mul_epu32(s, e), 32), s), _mm512_srli_epi64(e, 57));
  const __m512i start = _mm512_and_si512(_mm512_srli_epi64(e, 45), _mm512_set1_epi64(0xfff));
  return _mm512_add_epi64(_mm512_add_epi64(s, start),
                          _mm512_mul_epu32(q, _mm512_sub_epi64(_mm512_set1_epi64(kProbScale), freq)));
}

}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) std::byte* EncodeGroupsAvx512(
    const uint8_t* in, size_t whole, const uint64_t* table, uint32_t* states, std::byte* w, const std::byte* lowest) {
  static_assert(kStates == 32, "four vectors of eight states");
  // Four named vectors rather than an array, which GCC keeps in memory.
  const auto* st = reinterpret_cast<const __m256i*>(states);
  __m512i x0 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st)), x1 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 1));
  __m512i x2 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 2)), x3 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 3));
  const auto* base = reinterpret_cast<const long long*>(table);
  for (size_t g = whole; g > 0; g -= kStates) {
    // One group writes at most 64 bytes; each vector's 16-byte store ends
    // at w, and w moves down by at most 16 per vector: the stores stay
    // above `lowest`.
    if (w - lowest < static_cast<ptrdiff_t>(2 * kStates)) return nullptr;
    const uint8_t* sym = in + g - kStates;
    x3 = EncodeVector(x3, sym + 24, base, w);
    x2 = EncodeVector(x2, sym + 16, base, w);
    x1 = EncodeVector(x1, sym + 8, base, w);
    x0 = EncodeVector(x0, sym, base, w);
  }
  auto* out = reinterpret_cast<__m256i*>(states);
  _mm256_storeu_si256(out, _mm512_cvtepi64_epi32(x0));
  _mm256_storeu_si256(out + 1, _mm512_cvtepi64_epi32(x1));
  _mm256_storeu_si256(out + 2, _mm512_cvtepi64_epi32(x2));
  _mm256_storeu_si256(out + 3, _mm512_cvtepi64_epi32(x3));
  return w;
}

namespace {

// For an emit mask m with c bits set, a VPERMB index whose first 16 bytes
// move the low words of the lanes set in m, in lane order, to words 8 - c
// to 7 (as EmitLanes does, in one byte permute of the states).
struct EmitBytes {
  alignas(16) uint8_t bytes[256][16];
};

constexpr EmitBytes MakeEmitBytes() {
  EmitBytes t{};
  for (uint32_t m = 0; m < 256; ++m) {
    for (uint32_t j = 0; j < 8; ++j) {
      const uint8_t lane = kEmitLanes.lanes[m][j];
      t.bytes[m][2 * j] = static_cast<uint8_t>(8 * lane);
      t.bytes[m][2 * j + 1] = static_cast<uint8_t>(8 * lane + 1);
    }
  }
  return t;
}

constexpr EmitBytes kEmitBytes = MakeEmitBytes();

#define CKPTFS_AVX512_IFMA \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512ifma,avx512vbmi,popcnt"), always_inline)) inline

// EncodeVector with 52-bit multiply-adds (see EncodeGroupsAvx512Ifma).
CKPTFS_AVX512_IFMA __m512i EncodeVectorIfma(__m512i x, const uint8_t* sym, const long long* divide,
                                            const long long* start, std::byte*& w) {
  const __m512i index = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym)));
  const __m512i d = _mm512_i64gather_epi64(index, divide, 8);
  // floor(x / freq) = (2x * m) >> 52: the high half of the 52-bit product.
  const __m512i qx = _mm512_madd52hi_epu64(_mm512_setzero_si512(), _mm512_add_epi64(x, x), d);
  // Renormalise while x >= freq << 20, that is floor(x / freq) >= 2^20.
  const __mmask8 emit = _mm512_cmpge_epu64_mask(qx, _mm512_set1_epi64(int64_t{1} << 20));
  const __m512i order = _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(kEmitBytes.bytes[emit])));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 16), _mm512_castsi512_si128(_mm512_permutexvar_epi8(order, x)));
  w -= 2 * __builtin_popcount(emit);
  // After the shift, floor((x >> 16) / freq) = floor(x / freq) >> 16.
  const __m512i s = _mm512_mask_srli_epi64(x, emit, x, 16);
  const __m512i q = _mm512_mask_srli_epi64(qx, emit, qx, 16);
  const __m512i base = _mm512_add_epi64(s, _mm512_i64gather_epi64(index, start, 8));
  return _mm512_madd52lo_epu64(base, q, _mm512_srli_epi64(d, 52));
}

}  // namespace

bool CpuHasAvx512Ifma() {
  return CpuHasSimd(SimdLevel::kAvx512) && __builtin_cpu_supports("avx512ifma") &&
         __builtin_cpu_supports("avx512vbmi");
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512ifma,avx512vbmi,popcnt"))) std::byte* EncodeGroupsAvx512Ifma(
    const uint8_t* in, size_t whole, const IfmaEncodeTables& tables, uint32_t* states, std::byte* w,
    const std::byte* lowest) {
  static_assert(kStates == 32, "four vectors of eight states");
  const auto* st = reinterpret_cast<const __m256i*>(states);
  __m512i x0 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st)), x1 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 1));
  __m512i x2 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 2)), x3 = _mm512_cvtepu32_epi64(_mm256_loadu_si256(st + 3));
  const auto* divide = reinterpret_cast<const long long*>(tables.divide.data());
  const auto* start = reinterpret_cast<const long long*>(tables.start.data());
  for (size_t g = whole; g > 0; g -= kStates) {
    // As in EncodeGroupsAvx512: at most 64 bytes a group, stores above `lowest`.
    if (w - lowest < static_cast<ptrdiff_t>(2 * kStates)) return nullptr;
    const uint8_t* sym = in + g - kStates;
    x3 = EncodeVectorIfma(x3, sym + 24, divide, start, w);
    x2 = EncodeVectorIfma(x2, sym + 16, divide, start, w);
    x1 = EncodeVectorIfma(x1, sym + 8, divide, start, w);
    x0 = EncodeVectorIfma(x0, sym, divide, start, w);
  }
  auto* out = reinterpret_cast<__m256i*>(states);
  _mm256_storeu_si256(out, _mm512_cvtepi64_epi32(x0));
  _mm256_storeu_si256(out + 1, _mm512_cvtepi64_epi32(x1));
  _mm256_storeu_si256(out + 2, _mm512_cvtepi64_epi32(x2));
  _mm256_storeu_si256(out + 3, _mm512_cvtepi64_epi32(x3));
  return w;
}



// One decode step of sixteen states: their symbols to dst[0, 16).
CKPTFS_AVX512 __m512i DecodeVector(__m512i x, const int* table, uint8_t* dst) {
  const __m512i slot_mask = _mm512_set1_epi32(kProbScale - 1);
  const __m512i e = _mm512_i32gather_epi32(_mm512_and_si512(x, slot_mask), table, 4);
  const __m512i freq = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 8), slot_mask), _mm512_set1_epi32(1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(_mm512_and_si512(e, _mm512_set1_epi32(0xff))));
  return _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32(x, kProbBits)), _mm512_srli_epi32(e, 20));
}

// Renormalises the sixteen states of x in lane order: an expand puts the
// next words, in order, into the lanes below kLower.
CKPTFS_AVX512 __m512i RefillVector(__m512i x, const std::byte*& words) {
  const __mmask16 m = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(static_cast<int>(kLower)));
  const __m512i next = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words)));
  words += 2 * __builtin_popcount(static_cast<unsigned>(m));
  return _mm512_mask_or_epi32(x, m, _mm512_slli_epi32(x, 16), _mm512_maskz_expand_epi32(m, next));
}

// Two vectors of sixteen states, refilled in state order as the scalar
// decoder does.
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) size_t DecodeGroupsAvx512(const DecodeTable& table,
                                                                                     StreamStart& s, uint8_t* out,
                                                                                     size_t n) {
  static_assert(kStates == 32, "two vectors of sixteen states");
  __m512i x0 = _mm512_loadu_si512(s.states.data()), x1 = _mm512_loadu_si512(s.states.data() + 16);
  const auto* base = reinterpret_cast<const int*>(table.data());
  size_t i = 0;
  // A group reads at most 64 bytes of words: the first refill's 32-byte
  // load uses at most 32 of them, so the second's stays inside the checked 64.
  for (; i + kStates <= n && s.end - s.words >= static_cast<ptrdiff_t>(2 * kStates); i += kStates) {
    x0 = DecodeVector(x0, base, out + i);
    x1 = DecodeVector(x1, base, out + i + 16);
    x0 = RefillVector(x0, s.words);
    x1 = RefillVector(x1, s.words);
  }
  _mm512_storeu_si512(s.states.data(), x0);
  _mm512_storeu_si512(s.states.data() + 16, x1);
  return i;
}

CKPTFS_END_AVX512_CODE

#else

std::byte* EncodeGroupsAvx512(const uint8_t*, size_t, const uint64_t*, uint32_t*, std::byte*, const std::byte*) {
  return nullptr;
}
bool CpuHasAvx512Ifma() { return false; }
std::byte* EncodeGroupsAvx512Ifma(const uint8_t*, size_t, const IfmaEncodeTables&, uint32_t*, std::byte*,
                                  const std::byte*) {
  return nullptr;
}
size_t DecodeGroupsAvx512(const DecodeTable&, StreamStart&, uint8_t*, size_t) { return 0; }

#endif

}  // namespace ckptfs::rans
