// All-zero elements of a float chunk, for sparse byte-plane payloads
// (FORMAT.md, "Sparse payload"): their bit mask, splitting the others into
// byte planes, and putting them back together. AVX2 or AVX-512 where the
// CPU has it (lane permutations), else scalar; all give the same bytes.
#pragma once

#include <cstddef>

#include "codec/common/simd_level.h"

namespace ckptfs {

// Sets bit i % 8 of mask[i / 8] exactly for the elements i (of `width`
// bytes, width in {2, 4}) of in[0, count * width) whose bytes are all zero
// (the bits past `count` stay clear); returns how many there are.
// REQUIRES: mask holds (count + 7) / 8 bytes.
size_t ZeroElementMask(const std::byte* in, size_t count, size_t width, std::byte* mask);

// Writes byte k of the elements of `in` whose mask bit (as ZeroElementMask
// sets it) is clear, in order, to planes[k][0, kept): the byte planes of the
// packed non-zero elements, in one pass. Writes nothing past planes[k] +
// kept, so the planes may lie back to back. REQUIRES: `mask` is
// ZeroElementMask's for `in`; kept = count - its number of zero elements;
// CpuHasSimd(level) (every level writes the same bytes).
void SplitNonZeroElements(const std::byte* in, size_t count, size_t width, const std::byte* mask, size_t kept,
                          std::byte* const* planes, SimdLevel level = BestSimdLevel());

// Element i of `out` is zero where the mask has bit i, else the next
// element of `packed` (the non-zero elements back to back). REQUIRES: `packed` has
// room for `count` elements (reads run past the packed ones, within it);
// CpuHasSimd(level) (every level writes the same bytes).
void UnpackNonZeroElements(const std::byte* packed, const std::byte* mask, size_t count, size_t width,
                           std::byte* out, SimdLevel level = BestSimdLevel());

}  // namespace ckptfs
