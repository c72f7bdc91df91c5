// Byte-plane transposition of fixed-width elements (ZipNN's "byte
// grouping"): plane k holds byte k of every element. In a float the sign and
// exponent bytes are highly skewed while the low mantissa bytes are close to
// random, so compressing the planes apart beats compressing the elements.
// Split works in blocks of 16 elements so that GCC vectorizes it at -O2,
// or with AVX-512 byte shuffles where the CPU has them; merge (the decode
// hot path) uses SSE2 unpacks where available. Both run near memcpy speed.
#pragma once

#include <cstddef>

#include "codec/common/simd_level.h"

namespace ckptfs {

// Writes byte k of element i of `in` (count elements of `width` bytes) to
// planes[k][i]. REQUIRES: width in {2, 4}; each plane holds `count` bytes;
// planes do not overlap `in`; CpuHasSimd(level) (the AVX-512 path
// shuffles 64 bytes a step; every level writes the same bytes).
void SplitBytePlanes(const std::byte* in, size_t count, size_t width, std::byte* const* planes,
                     SimdLevel level = BestSimdLevel());

// The inverse of SplitBytePlanes. REQUIRES: as SplitBytePlanes.
void MergeBytePlanes(const std::byte* const* planes, size_t count, size_t width, std::byte* out);

// out[i] = a[i] ^ b[i] for i < n. `out` may alias `a`.
void XorBytes(const std::byte* a, const std::byte* b, size_t n, std::byte* out);

}  // namespace ckptfs
