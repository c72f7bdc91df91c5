// Static order-0 rANS (Duda's range asymmetric numeral systems) for one byte
// plane. Faster than zstd's Huffman literals on both sides and closer to the
// entropy (fractional bits per symbol). 32 32-bit states are interleaved
// (byte i goes through state i % 32) so that the steps of different states
// overlap in the CPU and run as vector lanes (AVX2 or AVX-512);
// frequencies have 12 bits, renormalisation moves 16-bit words.
// Stream layout: FORMAT.md, "rANS plane".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/common/simd_level.h"

namespace ckptfs {

using ByteHistogram = std::array<uint32_t, 256>;

namespace rans {
// The smallest and largest byte of a plane below 0x80 (low_min >= 0x80 if
// there is none) and from 0x80 on (high_max < 0x80 if there is none).
struct ByteRanges {
  uint32_t low_min, low_max, high_min, high_max;
};
}  // namespace rans

// The byte histogram of p[0, n).
ByteHistogram CountBytes(const uint8_t* p, size_t n);

// A model of p[0, n) for RansEncode at a fraction of CountBytes' cost: the
// counts of a sample of the bytes, plus one for each value that the sample
// missed within the ranges the bytes span. The ranges are exact, and taken
// apart below and from 0x80 (a float's sign splits the values of its top
// byte in two clusters). Where they hold many values that the sample
// missed, or n is small, it is CountBytes(p, n). The coded size is within
// about 0.1% of what exact counts give on trained float planes.
ByteHistogram ModelBytes(const uint8_t* p, size_t n);

// ModelBytes from the caller's sample of p[0, n) (counts of bytes of p,
// such as every k-th element's byte of this plane) and the exact ranges of
// p, instead of reading the plane for them. With fewer samples than
// ModelBytes takes of its smallest plane, or n small, it is ModelBytes(p, n).
ByteHistogram ModelBytesFromSample(const uint8_t* p, size_t n, const ByteHistogram& sample,
                                   const rans::ByteRanges& ranges);

// Encodes in[0, n) (n >= 1) into out[0, capacity) with frequencies in the
// proportions of `hist`, which must count every byte value that occurs in
// in[0, n) at least once: CountBytes(in, n) or ModelBytes(in, n). Returns
// the stored size, or Unsupported when the stream would not fit (the
// caller then stores the plane another way). Deterministic: the same input
// and histogram give the same bytes.
Result<size_t> RansEncode(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                          size_t capacity);

// RansEncode with the given instruction set (RansEncode takes the widest
// the CPU has; all write the same bytes), for tests. REQUIRES:
// CpuHasSimd(level).
Result<size_t> RansEncodeWith(SimdLevel level, const uint8_t* in, size_t n, const ByteHistogram& hist,
                              std::byte* out, size_t capacity);
// At kAvx512 it takes a path built on AVX-512 IFMA and VBMI where the CPU
// has them; this is the AVX-512 path without them, for tests. REQUIRES:
// CpuHasSimd(SimdLevel::kAvx512).
Result<size_t> RansEncodeAvx512WithoutIfma(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                                           size_t capacity);

// Decodes `stored` into out[0, n). Every field is checked: a stream that is
// not exactly what RansEncode writes for n bytes is Corruption.
Status RansDecode(ByteSpan stored, uint8_t* out, size_t n, std::string_view what);

// RansDecode with the given instruction set (RansDecode takes the widest
// the CPU has; all give the same result), for tests. REQUIRES:
// CpuHasSimd(level).
Status RansDecodeWith(SimdLevel level, ByteSpan stored, uint8_t* out, size_t n, std::string_view what);

}  // namespace ckptfs
