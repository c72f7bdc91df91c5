// All-zero elements of a float chunk, for sparse byte-plane payloads
// (FORMAT.md, "Sparse payload"): counting them, and packing the others
// together with a bit mask of the zero ones, and back. AVX2 where the CPU
// has it (lane permutations from tables), else scalar; both give the same
// bytes.
#pragma once

#include <cstddef>

namespace ckptfs {

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
// mask has bit i, else the next packed element. REQUIRES: `packed` has
// room for `count` elements (reads run past the packed ones, within it).
void UnpackNonZeroElements(const std::byte* packed, const std::byte* mask, size_t count, size_t width,
                           std::byte* out);

}  // namespace ckptfs
