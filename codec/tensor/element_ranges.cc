#include "codec/tensor/element_ranges.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckptfs {
namespace {

enum Running { kUnsignedMin = 0, kUnsignedMax = 1, kSignedMin = 2, kSignedMax = 3 };
using Lanes = std::array<std::array<uint8_t, 64>, 4>;

// Each path keeps byte k of the elements in lanes k, k + width, ... of its
// vector width (scalar: lane k alone); Plane() folds all 64.

// The portable path: element by element, byte k into lane k.
template <typename Element>
void AddScalar(const std::byte* in, size_t count, Lanes& lanes) {
  constexpr size_t kWidth = sizeof(Element);
  for (size_t i = 0; i < count; ++i) {
    Element e;
    std::memcpy(&e, in + i * kWidth, kWidth);
    if (e == 0) continue;
    for (size_t k = 0; k < kWidth; ++k) {
      const uint8_t b = static_cast<uint8_t>(in[i * kWidth + k]);
      lanes[kUnsignedMin][k] = std::min(lanes[kUnsignedMin][k], b);
      lanes[kUnsignedMax][k] = std::max(lanes[kUnsignedMax][k], b);
      lanes[kSignedMin][k] = static_cast<uint8_t>(
          std::min(static_cast<int8_t>(lanes[kSignedMin][k]), static_cast<int8_t>(b)));
      lanes[kSignedMax][k] = static_cast<uint8_t>(
          std::max(static_cast<int8_t>(lanes[kSignedMax][k]), static_cast<int8_t>(b)));
    }
  }
}

#if defined(__x86_64__)
// 32 bytes a step. A zero element's bytes are 0, which can only be wrong
// for the unsigned minimum: the signed maximum is only read when a byte
// below 0x80 exists (0 cannot exceed it), the signed minimum only when one
// from 0x80 on does (0 cannot be below it). So the minimum takes the
// bytes with zero elements set to 0xff.
template <size_t kWidth>
__attribute__((target("avx2"))) void AddAvx2(const std::byte* in, size_t count,
                                             Lanes& lanes) {
  // The first 32 lanes of each row.
  auto row = [&](Running r) { return reinterpret_cast<__m256i*>(lanes[r].data()); };
  __m256i umin = _mm256_load_si256(row(kUnsignedMin)), umax = _mm256_load_si256(row(kUnsignedMax));
  __m256i smin = _mm256_load_si256(row(kSignedMin)), smax = _mm256_load_si256(row(kSignedMax));
  const __m256i zero = _mm256_setzero_si256();
  constexpr size_t kStep = 32 / kWidth;
  size_t i = 0;
  for (; i + kStep <= count; i += kStep) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i * kWidth));
    const __m256i z = kWidth == 2 ? _mm256_cmpeq_epi16(v, zero) : _mm256_cmpeq_epi32(v, zero);
    umin = _mm256_min_epu8(umin, _mm256_or_si256(v, z));
    umax = _mm256_max_epu8(umax, v);
    smin = _mm256_min_epi8(smin, v);
    smax = _mm256_max_epi8(smax, v);
  }
  _mm256_store_si256(row(kUnsignedMin), umin);
  _mm256_store_si256(row(kUnsignedMax), umax);
  _mm256_store_si256(row(kSignedMin), smin);
  _mm256_store_si256(row(kSignedMax), smax);
  // GCC leaves this out before the tail call, and the dirty upper halves
  // would slow the caller's SSE code (the entropy estimate's log2).
  _mm256_zeroupper();
  using Element = std::conditional_t<kWidth == 2, uint16_t, uint32_t>;
  AddScalar<Element>(in + i * kWidth, count - i, lanes);
}

// AddAvx2 64 bytes a step, in all 64 lanes.
template <size_t kWidth>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2"))) void AddAvx512(
    const std::byte* in, size_t count, Lanes& lanes) {
  auto row = [&](Running r) { return lanes[r].data(); };
  __m512i umin = _mm512_load_si512(row(kUnsignedMin)), umax = _mm512_load_si512(row(kUnsignedMax));
  __m512i smin = _mm512_load_si512(row(kSignedMin)), smax = _mm512_load_si512(row(kSignedMax));
  const __m512i ones = _mm512_set1_epi32(-1);
  constexpr size_t kStep = 64 / kWidth;
  size_t i = 0;
  for (; i + kStep <= count; i += kStep) {
    const __m512i v = _mm512_loadu_si512(in + i * kWidth);
    // Zero elements as all-ones bytes, for the unsigned minimum.
    const __m512i vz = kWidth == 2 ? _mm512_mask_mov_epi16(v, _mm512_testn_epi16_mask(v, v), ones)
                                   : _mm512_mask_mov_epi32(v, _mm512_testn_epi32_mask(v, v), ones);
    umin = _mm512_min_epu8(umin, vz);
    umax = _mm512_max_epu8(umax, v);
    smin = _mm512_min_epi8(smin, v);
    smax = _mm512_max_epi8(smax, v);
  }
  _mm512_store_si512(row(kUnsignedMin), umin);
  _mm512_store_si512(row(kUnsignedMax), umax);
  _mm512_store_si512(row(kSignedMin), smin);
  _mm512_store_si512(row(kSignedMax), smax);
  AddAvx2<kWidth>(in + i * kWidth, count - i, lanes);
}
#endif

}  // namespace

ElementByteRanges::ElementByteRanges(size_t width) : width_(width) {
  lanes_[kUnsignedMin].fill(0xff);
  lanes_[kUnsignedMax].fill(0);
  lanes_[kSignedMin].fill(0x7f);
  lanes_[kSignedMax].fill(0x80);
}

void ElementByteRanges::Add(const std::byte* in, size_t count, SimdLevel level) {
#if defined(__x86_64__)
  if (level == SimdLevel::kAvx512) {
    if (width_ == 4) AddAvx512<4>(in, count, lanes_);
    else AddAvx512<2>(in, count, lanes_);
    return;
  }
  if (level == SimdLevel::kAvx2) {
    if (width_ == 4) AddAvx2<4>(in, count, lanes_);
    else AddAvx2<2>(in, count, lanes_);
    return;
  }
#else
  (void)level;
#endif
  if (width_ == 4) AddScalar<uint32_t>(in, count, lanes_);
  else AddScalar<uint16_t>(in, count, lanes_);
}

rans::ByteRanges ElementByteRanges::Plane(size_t k, bool with_zero) const {
  uint32_t u_min = with_zero ? 0 : 0xff, u_max = 0;
  int s_min = with_zero ? 0 : 127, s_max = with_zero ? 0 : -128;
  for (size_t j = k; j < kLanes; j += width_) {
    u_min = std::min<uint32_t>(u_min, lanes_[kUnsignedMin][j]);
    u_max = std::max<uint32_t>(u_max, lanes_[kUnsignedMax][j]);
    s_min = std::min<int>(s_min, static_cast<int8_t>(lanes_[kSignedMin][j]));
    s_max = std::max<int>(s_max, static_cast<int8_t>(lanes_[kSignedMax][j]));
  }
  // The signed extremes may hold a zero element's byte where the cluster
  // they bound is empty (see AddAvx2): the same fixed values on every path.
  const uint32_t low_max = u_min < 0x80 ? static_cast<uint32_t>(s_max) & 0xff : 0;
  const uint32_t high_min = u_max >= 0x80 ? static_cast<uint32_t>(s_min) & 0xff : 0xff;
  return rans::ByteRanges{u_min, low_max, high_min, u_max};
}

}  // namespace ckptfs
