// Byte-plane transposition of fixed-width elements (ZipNN's "byte
// grouping"): plane k holds byte k of every element. In a float the sign and
// exponent bytes are highly skewed while the low mantissa bytes are close to
// random, so compressing the planes apart beats compressing the elements.
// Split works in blocks of 16 elements so that GCC vectorizes it at -O2;
// merge (the decode hot path) uses SSE2 unpacks where available. Both run
// near memcpy speed (~10 GB/s here).
#pragma once

#include <cstddef>

namespace ckptfs {

// Writes byte k of element i of `in` (count elements of `width` bytes) to
// planes[k][i]. REQUIRES: width in {2, 4}; each plane holds `count` bytes;
// planes do not overlap `in`.
void SplitBytePlanes(const std::byte* in, size_t count, size_t width, std::byte* const* planes);

// The inverse of SplitBytePlanes. REQUIRES: as SplitBytePlanes.
void MergeBytePlanes(const std::byte* const* planes, size_t count, size_t width, std::byte* out);

// The number of elements (of `width` bytes, width in {2, 4}) of in[0,
// count * width) whose bytes are all zero.
size_t CountZeroElements(const std::byte* in, size_t count, size_t width);

// Copies the elements of `in` that are not all zero, in order, to `packed`
// and sets bit i % 8 of mask[i / 8] exactly for the all-zero elements i
// (the bits past `count` stay clear). Returns the number of packed
// elements. REQUIRES: packed holds `count` elements (the loop stores each
// element before deciding to keep it); mask holds (count + 7) / 8 bytes.
size_t PackNonZeroElements(const std::byte* in, size_t count, size_t width, std::byte* packed, std::byte* mask);

// The inverse of PackNonZeroElements: element i of `out` is zero where the
// mask has bit i, else the next packed element. REQUIRES: `packed` holds
// `count` elements' room (it may read one element past the packed ones).
void UnpackNonZeroElements(const std::byte* packed, const std::byte* mask, size_t count, size_t width,
                           std::byte* out);

// out[i] = a[i] ^ b[i] for i < n. `out` may alias `a`.
void XorBytes(const std::byte* a, const std::byte* b, size_t n, std::byte* out);

}  // namespace ckptfs
