// Static order-0 rANS (Duda's range asymmetric numeral systems) for one byte
// plane. Faster than zstd's Huffman literals on both sides and closer to the
// entropy (fractional bits per symbol). Eight 32-bit states are interleaved
// (byte i goes through state i % 8) so that the steps of different states
// overlap in the CPU, and the decoder can run them as one AVX2 vector;
// frequencies have 12 bits, renormalisation moves 16-bit words.
// Stream layout: FORMAT.md, "rANS plane".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "codec/common/bytes.h"
#include "codec/common/status.h"

namespace ckptfs {

using ByteHistogram = std::array<uint32_t, 256>;

// The byte histogram of p[0, n).
ByteHistogram CountBytes(const uint8_t* p, size_t n);

// Encodes in[0, n) with `hist`, which must be exactly CountBytes(in, n) and
// have n >= 1, into out[0, capacity). Returns the stored size, or
// Unsupported when the stream would not fit (the caller then stores the
// plane another way). Deterministic: the same input gives the same bytes.
Result<size_t> RansEncode(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                          size_t capacity);

// The portable encoder, which RansEncode uses where AVX2 is missing; the
// two write identical bytes.
Result<size_t> RansEncodeScalar(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                                size_t capacity);

// Decodes `stored` into out[0, n). Every field is checked: a stream that is
// not exactly what RansEncode writes for n bytes is Corruption.
Status RansDecode(ByteSpan stored, uint8_t* out, size_t n, std::string_view what);

// The portable decoder, which RansDecode uses where AVX2 is missing; exposed
// so that tests check both give the same result.
Status RansDecodeScalar(ByteSpan stored, uint8_t* out, size_t n, std::string_view what);

}  // namespace ckptfs
