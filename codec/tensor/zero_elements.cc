#include "codec/tensor/zero_elements.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

// Per element width: W is uint16_t or uint32_t. Branch-free: the store is
// unconditional and only the write position depends on the element.
template <typename W>
size_t CountZeros(const std::byte* in, size_t count) {
  size_t zeros = 0;
  for (size_t i = 0; i < count; ++i) {
    W v;
    std::memcpy(&v, in + i * sizeof(W), sizeof(W));
    zeros += v == 0;
  }
  return zeros;
}

template <typename W>
size_t Pack(const std::byte* in, size_t count, std::byte* packed, std::byte* mask) {
  size_t kept = 0;
  for (size_t i = 0; i < count; i += 8) {
    const size_t end = count - i < 8 ? count - i : 8;
    uint32_t bits = 0;
    for (size_t k = 0; k < end; ++k) {
      W v;
      std::memcpy(&v, in + (i + k) * sizeof(W), sizeof(W));
      std::memcpy(packed + kept * sizeof(W), &v, sizeof(W));
      const uint32_t zero = v == 0;
      bits |= zero << k;
      kept += 1 - zero;
    }
    mask[i / 8] = std::byte(bits);
  }
  return kept;
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

constexpr LaneTable kCompress = MakeCompressTable();
constexpr LaneTable kExpand = MakeExpandTable();

bool HaveAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt"); }

__attribute__((target("avx2,popcnt"))) size_t CountZerosAvx2(const std::byte* in, size_t count, size_t width) {
  const __m256i zero = _mm256_setzero_si256();
  const size_t per = 32 / width;
  size_t zeros = 0, i = 0;
  for (; i + per <= count; i += per) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i * width));
    const __m256i z = width == 4 ? _mm256_cmpeq_epi32(v, zero) : _mm256_cmpeq_epi16(v, zero);
    zeros += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_epi8(z)))) / width;
  }
  return zeros + (width == 4 ? CountZeros<uint32_t>(in + i * 4, count - i) : CountZeros<uint16_t>(in + i * 2, count - i));
}

__attribute__((target("avx2,popcnt"))) size_t Pack4Avx2(const std::byte* in, size_t count, std::byte* packed,
                                                        std::byte* mask) {
  const __m256i zero = _mm256_setzero_si256();
  size_t kept = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i));
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
    const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[m]));
    // A whole vector store: kept + 8 <= i + 8 <= count elements.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(packed + 4 * kept), _mm256_permutevar8x32_epi32(v, lanes));
    kept += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
    mask[i / 8] = std::byte(static_cast<uint8_t>(m));
  }
  return kept + Pack<uint32_t>(in + 4 * i, count - i, packed + 4 * kept, mask + i / 8);
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
  Unpack<uint32_t>(packed + 4 * taken, mask + i / 8, count - i, out + 4 * i);
}

// Two-byte elements: eight per step, widened to 32-bit lanes for the same
// permutations, then narrowed back (values below 2^16 pass packus as they are).
__attribute__((target("avx2,popcnt"))) inline __m128i Narrow16(__m256i v) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
}

__attribute__((target("avx2,popcnt"))) size_t Pack2Avx2(const std::byte* in, size_t count, std::byte* packed,
                                                        std::byte* mask) {
  const __m256i zero = _mm256_setzero_si256();
  size_t kept = 0, i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    const int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
    const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[m]));
    // A whole 16-byte store: kept + 8 <= i + 8 <= count elements.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + 2 * kept), Narrow16(_mm256_permutevar8x32_epi32(v, lanes)));
    kept += 8 - static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(m)));
    mask[i / 8] = std::byte(static_cast<uint8_t>(m));
  }
  return kept + Pack<uint16_t>(in + 2 * i, count - i, packed + 2 * kept, mask + i / 8);
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
  Unpack<uint16_t>(packed + 2 * taken, mask + i / 8, count - i, out + 2 * i);
}

}  // namespace
#endif

size_t CountZeroElements(const std::byte* in, size_t count, size_t width) {
#if defined(__x86_64__)
  if (HaveAvx2()) return CountZerosAvx2(in, count, width);
#endif
  return width == 4 ? CountZeros<uint32_t>(in, count) : CountZeros<uint16_t>(in, count);
}

size_t PackNonZeroElements(const std::byte* in, size_t count, size_t width, std::byte* packed, std::byte* mask) {
#if defined(__x86_64__)
  if (HaveAvx2()) return width == 4 ? Pack4Avx2(in, count, packed, mask) : Pack2Avx2(in, count, packed, mask);
#endif
  return width == 4 ? Pack<uint32_t>(in, count, packed, mask) : Pack<uint16_t>(in, count, packed, mask);
}

void UnpackNonZeroElements(const std::byte* packed, const std::byte* mask, size_t count, size_t width,
                           std::byte* out) {
#if defined(__x86_64__)
  if (HaveAvx2()) return width == 4 ? Unpack4Avx2(packed, mask, count, out) : Unpack2Avx2(packed, mask, count, out);
#endif
  if (width == 4) Unpack<uint32_t>(packed, mask, count, out);
  else Unpack<uint16_t>(packed, mask, count, out);
}

}  // namespace ckptfs
