// A rANS plane whose bytes are coded with one of several frequency tables,
// chosen per byte by a context that encoder and decoder both know without
// the stream (FORMAT.md "Context rANS plane").
//
// Why: a subtractive dither (codec/tensor/lossy/dither.h) makes the symbol
// of an element a coin toss between two neighbouring levels whose odds
// depend on the element's dither offset, which the decoder knows. One table
// for the whole plane codes the symbols at their mixed entropy H(q); a table
// per offset bucket codes them at H(q | bucket), the rate the dither's
// theory promises (Zamir and Feder). On a character LM's first moments
// dithered at 0.9 of their step that is about 0.70 instead of 0.95 bits per
// element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"

namespace ckptfs {

// The caller's contexts of a plane: byte i is in context ids[i], which is
// below `count` (1..kMaxRansContexts). The stream may merge neighbouring
// contexts: byte i goes through table ids[i] * K / count of its K tables.
struct ByteContexts {
  const uint8_t* ids = nullptr;
  uint32_t count = 0;
  bool empty() const { return ids == nullptr || count == 0; }
};

inline constexpr uint32_t kMaxRansContexts = 64;

// Encodes in[0, n) (n >= 1) into out[0, capacity), with as many tables
// (count, count / 2, ..., 1) as its estimate of the stored size finds
// smallest. Unsupported when the stream would not fit in capacity;
// InvalidArgument for contexts out of range. Deterministic.
Result<size_t> RansEncodeInContexts(const uint8_t* in, size_t n, ByteContexts contexts, std::byte* out,
                                    size_t capacity);

// Decodes `stored` into out[0, n) with the same contexts the encoder had.
// Every field is checked: a stream that is not exactly what the encoder
// writes for n bytes is Corruption. `tables`: reusable decode tables.
Status RansDecodeInContexts(ByteSpan stored, ByteContexts contexts, uint8_t* out, size_t n, std::string_view what,
                            std::vector<uint32_t>* tables);

}  // namespace ckptfs
