// The on-disk structures of a lossy chunk stream (specified in LOSSY.md):
// the fixed header, the varint used by the exact-element list, and the
// byte-plane transform of the lossless mode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

inline constexpr uint8_t kStreamVersion = 1;

// How the chunk is stored. Stored: never renumber.
enum class StreamMode : uint8_t {
  kLossless = 0,   // byte planes (of values XOR base in a delta frame), zstd
  kQuantized = 1,  // levels + packed symbols (zstd) + exact list (zstd)
};

// Every stream ends with XXH3-64 (seed 0) of all bytes before it, LE.
inline constexpr size_t kTrailerSize = 8;

// Flag bits of StreamHeader::flags; all other bits are reserved (must be 0).
inline constexpr uint8_t kFlagDelta = 0x01;

struct StreamHeader {
  static constexpr size_t kEncodedSize = 52;

  uint8_t version = kStreamVersion;
  StreamMode mode = StreamMode::kLossless;
  ElementType type = ElementType::kF32;
  uint8_t bits = 0;         // symbol width 1..8 (kQuantized), 0 (kLossless)
  uint8_t flags = 0;        // kFlagDelta when a base was used
  uint32_t num_levels = 0;  // <= 2^bits - 1 (kQuantized), 0 (kLossless)
  uint64_t element_count = 0;
  uint64_t exact_count = 0;     // entries in the exact list (kQuantized)
  uint64_t main_size = 0;       // zstd bytes of the symbols / byte planes
  uint64_t exact_raw_size = 0;  // decompressed bytes of the exact list
  uint64_t exact_size = 0;      // zstd bytes of the exact list (0 when empty)

  // Appends the kEncodedSize bytes.
  void EncodeTo(std::vector<std::byte>* out) const;
  // Parses and checks every field that can be checked alone.
  static Result<StreamHeader> DecodeFrom(ByteSpan data);
};

// LEB128 unsigned varint (7 bits per byte, low first, at most 5 bytes here).
inline size_t PutVarint32(std::byte* out, uint32_t v) {
  size_t k = 0;
  while (v >= 0x80) {
    out[k++] = std::byte((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out[k++] = std::byte(v);
  return k;
}
// Reads a varint at *pos; false if it runs past the end or is over 5 bytes.
inline bool GetVarint32(ByteSpan in, size_t* pos, uint32_t* value) {
  uint64_t v = 0;
  for (uint32_t shift = 0; shift < 35; shift += 7) {
    if (*pos >= in.size()) return false;
    uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (v > UINT32_MAX) return false;
      *value = static_cast<uint32_t>(v);
      return true;
    }
  }
  return false;
}

// Splits elements of `width` bytes into byte planes (plane k holds byte k of
// every element), XORing each element with `base` first when it is given.
// REQUIRES: values.size() % width == 0, out.size() == values.size(),
//           base empty or values.size().
void SplitPlanes(ByteSpan values, ByteSpan base, size_t width, MutableByteSpan out);
// The inverse of SplitPlanes.
void JoinPlanes(ByteSpan planes, ByteSpan base, size_t width, MutableByteSpan out);

}  // namespace ckptfs::lossy
