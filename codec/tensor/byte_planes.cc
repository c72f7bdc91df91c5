#include "codec/tensor/byte_planes.h"

#include <cstdint>

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

template <size_t W>
void MergeFixed(const uint8_t* const* planes, size_t count, uint8_t* __restrict out) {
  const uint8_t* __restrict p[W];
  for (size_t k = 0; k < W; ++k) p[k] = planes[k];
  const size_t blocks = count / kBlock;
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t* __restrict d = out + b * kBlock * W;
    for (size_t k = 0; k < W; ++k) {
      const uint8_t* __restrict s = p[k] + b * kBlock;
      for (size_t i = 0; i < kBlock; ++i) d[W * i + k] = s[i];
    }
  }
  for (size_t i = blocks * kBlock; i < count; ++i)
    for (size_t k = 0; k < W; ++k) out[W * i + k] = p[k][i];
}

}  // namespace

void SplitBytePlanes(const std::byte* in, size_t count, size_t width, std::byte* const* planes) {
  auto* src = reinterpret_cast<const uint8_t*>(in);
  auto* dst = reinterpret_cast<uint8_t* const*>(planes);
  if (width == 4) Split4(src, count, dst[0], dst[1], dst[2], dst[3]);
  else Split2(src, count, dst[0], dst[1]);
}

void MergeBytePlanes(const std::byte* const* planes, size_t count, size_t width, std::byte* out) {
  auto* src = reinterpret_cast<const uint8_t* const*>(planes);
  auto* dst = reinterpret_cast<uint8_t*>(out);
  if (width == 4) MergeFixed<4>(src, count, dst);
  else MergeFixed<2>(src, count, dst);
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
