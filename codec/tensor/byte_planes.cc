#include "codec/tensor/byte_planes.h"

#include <cstdint>

#include "codec/common/simd_level.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

constexpr size_t kBlock = 16;  // elements per vectorizable block

// Split is written out per width: with a loop over planes inside the block
// GCC does not vectorize the strided loads.
void Split4(const uint8_t* __restrict in, size_t count, uint8_t* __restrict p0, uint8_t* __restrict p1,
            uint8_t* __restrict p2, uint8_t* __restrict p3) {
  const size_t blocks = count / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* s = in + b * kBlock * 4;
    uint8_t* d0 = p0 + b * kBlock;
    uint8_t* d1 = p1 + b * kBlock;
    uint8_t* d2 = p2 + b * kBlock;
    uint8_t* d3 = p3 + b * kBlock;
    for (size_t i = 0; i < kBlock; ++i) {
      d0[i] = s[4 * i];
      d1[i] = s[4 * i + 1];
      d2[i] = s[4 * i + 2];
      d3[i] = s[4 * i + 3];
    }
  }
  for (size_t i = blocks * kBlock; i < count; ++i) {
    p0[i] = in[4 * i];
    p1[i] = in[4 * i + 1];
    p2[i] = in[4 * i + 2];
    p3[i] = in[4 * i + 3];
  }
}

void Split2(const uint8_t* __restrict in, size_t count, uint8_t* __restrict p0, uint8_t* __restrict p1) {
  const size_t blocks = count / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* s = in + b * kBlock * 2;
    uint8_t* d0 = p0 + b * kBlock;
    uint8_t* d1 = p1 + b * kBlock;
    for (size_t i = 0; i < kBlock; ++i) {
      d0[i] = s[2 * i];
      d1[i] = s[2 * i + 1];
    }
  }
  for (size_t i = blocks * kBlock; i < count; ++i) {
    p0[i] = in[2 * i];
    p1[i] = in[2 * i + 1];
  }
}

// Merging is the decode hot path. GCC vectorizes the scalar form below
// poorly (byte inserts, ~1.7 GB/s), so on x86-64 it uses SSE2 unpacks,
// which interleave 16 elements per step (~3x faster); other targets use
// the scalar form.
#if defined(__SSE2__)
void Merge4(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3, size_t count,
            uint8_t* out) {
  const size_t blocks = count / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t i = b * kBlock;
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
    __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
    __m128i c2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + i));
    __m128i c3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3 + i));
    __m128i lo01 = _mm_unpacklo_epi8(a, c1), hi01 = _mm_unpackhi_epi8(a, c1);
    __m128i lo23 = _mm_unpacklo_epi8(c2, c3), hi23 = _mm_unpackhi_epi8(c2, c3);
    auto* d = reinterpret_cast<__m128i*>(out + 4 * i);
    _mm_storeu_si128(d + 0, _mm_unpacklo_epi16(lo01, lo23));
    _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(lo01, lo23));
    _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(hi01, hi23));
    _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(hi01, hi23));
  }
  for (size_t i = blocks * kBlock; i < count; ++i) {
    out[4 * i] = p0[i];
    out[4 * i + 1] = p1[i];
    out[4 * i + 2] = p2[i];
    out[4 * i + 3] = p3[i];
  }
}

void Merge2(const uint8_t* p0, const uint8_t* p1, size_t count, uint8_t* out) {
  const size_t blocks = count / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t i = b * kBlock;
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
    auto* d = reinterpret_cast<__m128i*>(out + 2 * i);
    _mm_storeu_si128(d + 0, _mm_unpacklo_epi8(a, c));
    _mm_storeu_si128(d + 1, _mm_unpackhi_epi8(a, c));
  }
  for (size_t i = blocks * kBlock; i < count; ++i) {
    out[2 * i] = p0[i];
    out[2 * i + 1] = p1[i];
  }
}
#else
void Merge4(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3, size_t count,
            uint8_t* out) {
  for (size_t i = 0; i < count; ++i) {
    out[4 * i] = p0[i];
    out[4 * i + 1] = p1[i];
    out[4 * i + 2] = p2[i];
    out[4 * i + 3] = p3[i];
  }
}

void Merge2(const uint8_t* p0, const uint8_t* p1, size_t count, uint8_t* out) {
  for (size_t i = 0; i < count; ++i) {
    out[2 * i] = p0[i];
    out[2 * i + 1] = p1[i];
  }
}
#endif

#if defined(__x86_64__)
CKPTFS_BEGIN_AVX512_CODE  // (GCC bug 105593: codec/common/simd_level.h)

// The split reads the chunk after the zero-mask pass has moved on; the
// hardware prefetcher alone leaves its loads waiting on memory.
constexpr size_t kSplitAhead = 4096;
// The kernels end in a call to the scalar finisher, before which GCC does
// not clear the vectors' upper halves (vzeroupper): left dirty, they slow
// every SSE instruction that runs after the kernel returns (the rANS
// model's floating point, libm).

// AVX-512: 64 input bytes per step, each plane's bytes gathered within the
// 16-byte lanes, then the lanes' pieces put together across them; one
// store per plane.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void Split4Avx512(const uint8_t* in, size_t count,
                                                                       uint8_t* p0, uint8_t* p1, uint8_t* p2,
                                                                       uint8_t* p3) {
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __builtin_prefetch(in + 4 * i + kSplitAhead);
    const __m512i v = _mm512_permutexvar_epi32(dwords, _mm512_shuffle_epi8(_mm512_loadu_si512(in + 4 * i), bytes));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + i), _mm512_castsi512_si128(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + i), _mm512_extracti32x4_epi32(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + i), _mm512_extracti32x4_epi32(v, 2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p3 + i), _mm512_extracti32x4_epi32(v, 3));
  }
  _mm256_zeroupper();  // see the note at kSplitAhead
  Split4(in + 4 * i, count - i, p0 + i, p1 + i, p2 + i, p3 + i);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void Split2Avx512(const uint8_t* in, size_t count,
                                                                       uint8_t* p0, uint8_t* p1) {
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m512i qwords = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    __builtin_prefetch(in + 2 * i + kSplitAhead);
    const __m512i v = _mm512_permutexvar_epi64(qwords, _mm512_shuffle_epi8(_mm512_loadu_si512(in + 2 * i), bytes));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p0 + i), _mm512_castsi512_si256(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p1 + i), _mm512_extracti64x4_epi64(v, 1));
  }
  _mm256_zeroupper();  // see the note at kSplitAhead
  Split2(in + 2 * i, count - i, p0 + i, p1 + i);
}

CKPTFS_END_AVX512_CODE
#endif

}  // namespace

void SplitBytePlanes(const std::byte* in, size_t count, size_t width, std::byte* const* planes, SimdLevel level) {
  auto* src = reinterpret_cast<const uint8_t*>(in);
  auto* dst = reinterpret_cast<uint8_t* const*>(planes);
#if defined(__x86_64__)
  if (level == SimdLevel::kAvx512) {
    if (width == 4) Split4Avx512(src, count, dst[0], dst[1], dst[2], dst[3]);
    else Split2Avx512(src, count, dst[0], dst[1]);
    return;
  }
#endif
  (void)level;
  if (width == 4) Split4(src, count, dst[0], dst[1], dst[2], dst[3]);
  else Split2(src, count, dst[0], dst[1]);
}

void MergeBytePlanes(const std::byte* const* planes, size_t count, size_t width, std::byte* out) {
  auto* src = reinterpret_cast<const uint8_t* const*>(planes);
  auto* dst = reinterpret_cast<uint8_t*>(out);
  if (width == 4) Merge4(src[0], src[1], src[2], src[3], count, dst);
  else Merge2(src[0], src[1], count, dst);
}

void XorBytes(const std::byte* a, const std::byte* b, size_t n, std::byte* out) {
  // Word-wide XOR; memcpy keeps it free of alignment and aliasing UB.
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    __builtin_memcpy(&x, a + i, 8);
    __builtin_memcpy(&y, b + i, 8);
    x ^= y;
    __builtin_memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

}  // namespace ckptfs
