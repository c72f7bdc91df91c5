#include "codec/tensor/zero_elements.h"

#include <cstdint>
#include <cstring>

#include "codec/common/simd_level.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

// Per element width: W is uint16_t or uint32_t.
template <typename W>
W LoadElement(const std::byte* in, size_t i) {
  W v;
  std::memcpy(&v, in + i * sizeof(W), sizeof(W));
  return v;
}

template <typename W>
size_t Mask(const std::byte* in, size_t count, std::byte* mask) {
  size_t zeros = 0;
  for (size_t i = 0; i < count; i += 8) {
    const size_t end = count - i < 8 ? count - i : 8;
    uint32_t bits = 0;
    for (size_t k = 0; k < end; ++k) {
      const uint32_t zero = LoadElement<W>(in, i + k) == 0;
      bits |= zero << k;
      zeros += zero;
    }
    mask[i / 8] = std::byte(bits);
  }
  return zeros;
}

// Elements [from, count), of which the non-zero ones go to the planes from
// position `kept` on. Branches on every element: it writes nothing past
// the last kept byte (the vector loops leave it the end of the chunk).
template <typename W>
void SplitNonZero(const std::byte* in, size_t from, size_t count, const std::byte* mask, size_t kept,
                  std::byte* const* planes) {
  for (size_t i = from; i < count; ++i) {
    const uint32_t bits = static_cast<uint8_t>(mask[i / 8]);
    if (i % 8 == 0 && bits == 0xff && count - i >= 8) {
      i += 7;  // eight zero elements
      continue;
    }
    if ((bits >> (i % 8)) & 1) continue;
    for (size_t k = 0; k < sizeof(W); ++k) planes[k][kept] = in[i * sizeof(W) + k];
    ++kept;
  }
}

template <typename W>
void Unpack(const std::byte* packed, const std::byte* mask, size_t count, std::byte* out) {
  size_t taken = 0;
  for (size_t i = 0; i < count; i += 8) {
    const size_t end = count - i < 8 ? count - i : 8;
    const uint32_t bits = static_cast<uint8_t>(mask[i / 8]);
    for (size_t k = 0; k < end; ++k) {
      const uint32_t zero = (bits >> k) & 1;
      W v;
      std::memcpy(&v, packed + taken * sizeof(W), sizeof(W));
      v = zero ? W{0} : v;
      std::memcpy(out + (i + k) * sizeof(W), &v, sizeof(W));
      taken += 1 - zero;
    }
  }
}

}  // namespace

#if defined(__x86_64__)
namespace {

// Lane permutations for 8 four-byte elements, by the mask m of the zero
// ones (bit j: element j is zero).
struct LaneTable {
  alignas(32) uint32_t lanes[256][8];
};

// The non-zero elements' lanes first, in order.
constexpr LaneTable MakeCompressTable() {
  LaneTable t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t at = 0;
    for (uint32_t j = 0; j < 8; ++j)
      if (((m >> j) & 1) == 0) t.lanes[m][at++] = j;
  }
  return t;
}

// Lane j takes packed element number (non-zero lanes below j).
constexpr LaneTable MakeExpandTable() {
  LaneTable t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t below = 0;
    for (uint32_t j = 0; j < 8; ++j) {
      t.lanes[m][j] = below;
      below += 1 - ((m >> j) & 1);
    }
  }
  return t;
}

// The split reads the chunk a second time, after the mask pass has moved
// on: the hardware prefetcher alone leaves its loads waiting on memory.
constexpr size_t kSplitAhead = 4096;

constexpr LaneTable kCompress = MakeCompressTable();
constexpr LaneTable kExpand = MakeExpandTable();

// Stores the high 8 bytes of v at p (unaligned; _mm_storeh_pd would be a
// misaligned double store).
__attribute__((target("avx2"))) inline void StoreHigh64(std::byte* p, __m128i v) {
  const uint64_t high = static_cast<uint64_t>(_mm_extract_epi64(v, 1));
  std::memcpy(p, &high, 8);
}

__attribute__((target("avx2,popcnt"))) size_t Mask4Avx2(const std::byte* in, size_t count, std::byte* mask) {
  const __m256i zero = _mm256_setzero_si256();
  size_t zeros = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i));
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
    mask[i / 8] = std::byte(static_cast<uint8_t>(m));
    zeros += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
  }
  return zeros + Mask<uint32_t>(in + 4 * i, count - i, mask + i / 8);
}

__attribute__((target("avx2,popcnt"))) size_t Mask2Avx2(const std::byte* in, size_t count, std::byte* mask) {
  const __m256i zero = _mm256_setzero_si256();
  size_t zeros = 0, i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i z = _mm256_cmpeq_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i)), zero);
    // Saturating packs leave elements 0-7 in bytes 0-7 and 8-15 in bytes 16-23.
    const unsigned m = static_cast<unsigned>(_mm256_movemask_epi8(_mm256_packs_epi16(z, z)));
    mask[i / 8] = std::byte(static_cast<uint8_t>(m));
    mask[i / 8 + 1] = std::byte(static_cast<uint8_t>(m >> 16));
    zeros += static_cast<size_t>(__builtin_popcount(m & 0x00ff00ffu));
  }
  return zeros + Mask<uint16_t>(in + 2 * i, count - i, mask + i / 8);
}

// Eight elements per step: the non-zero ones to the low lanes (kCompress),
// then their bytes transposed so that each 8-byte quarter holds one
// plane's bytes, stored at the planes' write positions. A store writes 8
// bytes, so the vector loop stops 8 bytes before the planes' end and the
// scalar loop finishes.
__attribute__((target("avx2,popcnt"))) void SplitNonZero4Avx2(const std::byte* in, size_t count,
                                                              const std::byte* mask, size_t kept_total,
                                                              std::byte* const* planes) {
  const __m256i transpose = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i quarters = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  // The plane pointers in registers: the stores could alias the array, so
  // GCC would load them again for every store.
  std::byte* const p0 = planes[0], *const p1 = planes[1], *const p2 = planes[2], *const p3 = planes[3];
  size_t kept = 0, i = 0;
  for (; i + 8 <= count && kept + 8 <= kept_total; i += 8) {
    __builtin_prefetch(in + 4 * i + kSplitAhead);
    const int m = static_cast<uint8_t>(mask[i / 8]);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i));
    const __m256i packed =
        _mm256_permutevar8x32_epi32(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[m])));
    const __m256i p = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(packed, transpose), quarters);
    const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p0 + kept), lo);
    StoreHigh64(p1 + kept, lo);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p2 + kept), hi);
    StoreHigh64(p3 + kept, hi);
    kept += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  SplitNonZero<uint32_t>(in, i, count, mask, kept, planes);
}

// Two-byte elements: eight per step, widened to 32-bit lanes for the same
// permutations.
__attribute__((target("avx2,popcnt"))) void SplitNonZero2Avx2(const std::byte* in, size_t count,
                                                              const std::byte* mask, size_t kept_total,
                                                              std::byte* const* planes) {
  const __m256i transpose = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                             0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i quarters = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::byte* const p0 = planes[0], *const p1 = planes[1];
  size_t kept = 0, i = 0;
  for (; i + 8 <= count && kept + 8 <= kept_total; i += 8) {
    __builtin_prefetch(in + 2 * i + kSplitAhead);
    const int m = static_cast<uint8_t>(mask[i / 8]);
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    const __m256i packed =
        _mm256_permutevar8x32_epi32(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[m])));
    const __m128i p = _mm256_castsi256_si128(
        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(packed, transpose), quarters));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p0 + kept), p);
    StoreHigh64(p1 + kept, p);
    kept += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  SplitNonZero<uint16_t>(in, i, count, mask, kept, planes);
}

__attribute__((target("avx2,popcnt"))) void Unpack4Avx2(const std::byte* packed, const std::byte* mask,
                                                        size_t count, std::byte* out) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  size_t taken = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const int m = static_cast<uint8_t>(mask[i / 8]);
    // A whole vector load: taken + 8 <= i + 8 <= count elements of room.
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + 4 * taken));
    const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kExpand.lanes[m]));
    const __m256i is_zero = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), lane_bits), lane_bits);
    const __m256i e = _mm256_andnot_si256(is_zero, _mm256_permutevar8x32_epi32(p, lanes));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * i), e);
    taken += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  Unpack<uint32_t>(packed + 4 * taken, mask + i / 8, count - i, out + 4 * i);
}

// Two-byte elements: eight per step, widened to 32-bit lanes for the same
// permutations, then narrowed back (values below 2^16 pass packus as they are).
__attribute__((target("avx2,popcnt"))) inline __m128i Narrow16(__m256i v) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
}

__attribute__((target("avx2,popcnt"))) void Unpack2Avx2(const std::byte* packed, const std::byte* mask,
                                                        size_t count, std::byte* out) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  size_t taken = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const int m = static_cast<uint8_t>(mask[i / 8]);
    // A whole 16-byte load: taken + 8 <= i + 8 <= count elements of room.
    const __m256i p = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + 2 * taken)));
    const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kExpand.lanes[m]));
    const __m256i is_zero = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), lane_bits), lane_bits);
    const __m256i e = _mm256_andnot_si256(is_zero, _mm256_permutevar8x32_epi32(p, lanes));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), Narrow16(e));
    taken += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  Unpack<uint16_t>(packed + 2 * taken, mask + i / 8, count - i, out + 2 * i);
}

// AVX-512: sixteen elements per step, the non-zero ones to the low lanes
// by VPCOMPRESSD, then each plane's bytes to one 16-byte lane (bytes within
// the lanes, then dwords across them).
CKPTFS_BEGIN_AVX512_CODE  // (GCC bug 105593: codec/common/simd_level.h)

__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) void SplitNonZero4Avx512(const std::byte* in, size_t count,
                                                                                  const std::byte* mask,
                                                                                  size_t kept_total,
                                                                                  std::byte* const* planes) {
  const __m512i transpose =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i quarters = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  std::byte* const p0 = planes[0], *const p1 = planes[1], *const p2 = planes[2], *const p3 = planes[3];
  size_t kept = 0, i = 0;
  for (; i + 16 <= count && kept + 16 <= kept_total; i += 16) {
    __builtin_prefetch(in + 4 * i + kSplitAhead);
    uint16_t zeros;
    std::memcpy(&zeros, mask + i / 8, 2);
    const __m512i v = _mm512_loadu_si512(in + 4 * i);
    const __m512i packed = _mm512_maskz_compress_epi32(static_cast<__mmask16>(~zeros), v);
    const __m512i p = _mm512_permutexvar_epi32(quarters, _mm512_shuffle_epi8(packed, transpose));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + kept), _mm512_castsi512_si128(p));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + kept), _mm512_extracti32x4_epi32(p, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + kept), _mm512_extracti32x4_epi32(p, 2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p3 + kept), _mm512_extracti32x4_epi32(p, 3));
    kept += 16 - static_cast<size_t>(__builtin_popcount(zeros));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  SplitNonZero<uint32_t>(in, i, count, mask, kept, planes);
}

// Two-byte elements widened to 32-bit lanes for the same steps.
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) void SplitNonZero2Avx512(const std::byte* in, size_t count,
                                                                                  const std::byte* mask,
                                                                                  size_t kept_total,
                                                                                  std::byte* const* planes) {
  const __m512i transpose =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m512i quarters = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  std::byte* const p0 = planes[0], *const p1 = planes[1];
  size_t kept = 0, i = 0;
  for (; i + 16 <= count && kept + 16 <= kept_total; i += 16) {
    __builtin_prefetch(in + 2 * i + kSplitAhead);
    uint16_t zeros;
    std::memcpy(&zeros, mask + i / 8, 2);
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i)));
    const __m512i packed = _mm512_maskz_compress_epi32(static_cast<__mmask16>(~zeros), v);
    const __m512i p = _mm512_permutexvar_epi32(quarters, _mm512_shuffle_epi8(packed, transpose));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + kept), _mm512_castsi512_si128(p));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + kept), _mm512_extracti32x4_epi32(p, 1));
    kept += 16 - static_cast<size_t>(__builtin_popcount(zeros));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  SplitNonZero<uint16_t>(in, i, count, mask, kept, planes);
}

// Putting the zeros back: VPEXPANDD moves the next non-zero elements, in
// order, to the lanes whose mask bit is clear and zeroes the others, in
// one step (the AVX2 path needs a table lookup, a permutation and a blend).
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) void Unpack4Avx512(const std::byte* packed,
                                                                            const std::byte* mask, size_t count,
                                                                            std::byte* out) {
  size_t taken = 0, i = 0;
  for (; i + 16 <= count; i += 16) {
    uint16_t zeros;
    std::memcpy(&zeros, mask + i / 8, 2);
    // A whole vector load: taken + 16 <= i + 16 <= count elements of room.
    const __m512i p = _mm512_loadu_si512(packed + 4 * taken);
    _mm512_storeu_si512(out + 4 * i, _mm512_maskz_expand_epi32(static_cast<__mmask16>(~zeros), p));
    taken += 16 - static_cast<size_t>(__builtin_popcount(zeros));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  Unpack<uint32_t>(packed + 4 * taken, mask + i / 8, count - i, out + 4 * i);
}

// Two-byte elements widened to 32-bit lanes for the same step.
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt"))) void Unpack2Avx512(const std::byte* packed,
                                                                            const std::byte* mask, size_t count,
                                                                            std::byte* out) {
  size_t taken = 0, i = 0;
  for (; i + 16 <= count; i += 16) {
    uint16_t zeros;
    std::memcpy(&zeros, mask + i / 8, 2);
    // A whole 32-byte load: taken + 16 <= i + 16 <= count elements of room.
    const __m512i p = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + 2 * taken)));
    const __m512i e = _mm512_maskz_expand_epi32(static_cast<__mmask16>(~zeros), p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), _mm512_cvtepi32_epi16(e));
    taken += 16 - static_cast<size_t>(__builtin_popcount(zeros));
  }
  _mm256_zeroupper();  // GCC leaves it out before the scalar finisher
  Unpack<uint16_t>(packed + 2 * taken, mask + i / 8, count - i, out + 2 * i);
}

CKPTFS_END_AVX512_CODE

}  // namespace
#endif

size_t ZeroElementMask(const std::byte* in, size_t count, size_t width, std::byte* mask) {
#if defined(__x86_64__)
  if (CpuHasSimd(SimdLevel::kAvx2)) return width == 4 ? Mask4Avx2(in, count, mask) : Mask2Avx2(in, count, mask);
#endif
  return width == 4 ? Mask<uint32_t>(in, count, mask) : Mask<uint16_t>(in, count, mask);
}

void SplitNonZeroElements(const std::byte* in, size_t count, size_t width, const std::byte* mask, size_t kept,
                          std::byte* const* planes, SimdLevel level) {
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx512:
      if (width == 4) SplitNonZero4Avx512(in, count, mask, kept, planes);
      else SplitNonZero2Avx512(in, count, mask, kept, planes);
      return;
    case SimdLevel::kAvx2:
      if (width == 4) SplitNonZero4Avx2(in, count, mask, kept, planes);
      else SplitNonZero2Avx2(in, count, mask, kept, planes);
      return;
#endif
    default:
      if (width == 4) SplitNonZero<uint32_t>(in, 0, count, mask, 0, planes);
      else SplitNonZero<uint16_t>(in, 0, count, mask, 0, planes);
  }
}

void UnpackNonZeroElements(const std::byte* packed, const std::byte* mask, size_t count, size_t width,
                           std::byte* out, SimdLevel level) {
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx512:
      if (width == 4) Unpack4Avx512(packed, mask, count, out);
      else Unpack2Avx512(packed, mask, count, out);
      return;
    case SimdLevel::kAvx2:
      if (width == 4) Unpack4Avx2(packed, mask, count, out);
      else Unpack2Avx2(packed, mask, count, out);
      return;
#endif
    default:
      if (width == 4) Unpack<uint32_t>(packed, mask, count, out);
      else Unpack<uint16_t>(packed, mask, count, out);
  }
}

}  // namespace ckptfs
