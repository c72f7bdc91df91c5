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

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/rans_model.h"

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

// Decodes a context rANS plane one byte at a time, each byte's context
// chosen by the caller when it asks for the byte, so that it may depend on
// the bytes before (a trellis quantizer's state, codec/tensor/lossy/
// trellis.h). RansDecodeInContexts is this reader with a fixed array.
class ContextRansReader {
 public:
  // Reads the tables and the start of the stream: `count` contexts
  // (1..kMaxRansContexts); `tables` holds the decode tables and must
  // outlive the reader. Corruption as RansDecodeInContexts.
  Status Open(ByteSpan stored, uint32_t count, std::string_view what, std::vector<uint32_t>* tables);
  // The next byte, coded in `context` (< count). A stream that runs out of
  // words gives 0 and makes Finish fail.
  uint8_t Next(uint32_t context) {
    const uint32_t* table = table_of_[context];
    uint32_t& x = start_.states[at_++ % rans::kStates];
    const uint32_t e = table[x & (rans::kProbScale - 1)];
    x = (((e >> 8) & (rans::kProbScale - 1)) + 1) * (x >> rans::kProbBits) + (e >> 20);
    if (x < rans::kLower) {
      if (start_.end - start_.words < 2) {
        truncated_ = true;
        x = rans::kLower;
        return 0;
      }
      x = x << 16 | LoadLE16(start_.words);
      start_.words += 2;
    }
    return static_cast<uint8_t>(e);
  }
  // After the last byte: the stream was not cut short, and ends exactly
  // with every state back at its start.
  Status Finish() const;

 private:
  // Each context's decode table (contexts merged into fewer tables share one).
  std::array<const uint32_t*, kMaxRansContexts> table_of_{};
  rans::StreamStart start_{};
  size_t at_ = 0;
  bool truncated_ = false;
  std::string what_;
};

}  // namespace ckptfs
