// The on-disk structures of a lossy chunk stream (specified in LOSSY.md):
// the fixed header, the varint used by the exact-element list, and the
// byte-plane transform of the lossless mode.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <zstd.h>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

// Version 1 streams hold modes 0 and 1; version 2 adds mode 2; version 3
// is mode 1 or 2 with the symbols coded by rANS instead of zstd (LOSSY.md
// section 5.7). The encoder writes the lowest version that holds a stream, so
// an older decoder reports Unsupported for what it cannot read.
inline constexpr uint8_t kStreamVersion = 1;
inline constexpr uint8_t kStreamVersionLog = 2;
inline constexpr uint8_t kStreamVersionRans = 3;
// Version 4 is mode 1 with the symbols in a context rANS plane (FORMAT.md
// "Context rANS plane"): its decoder needs per-element contexts from the
// caller (a dithered chunk's offsets, dither.h).
inline constexpr uint8_t kStreamVersionRansContexts = 4;
// Version 5 is mode 3, trellis-coded quantization (LOSSY.md section 11).
inline constexpr uint8_t kStreamVersionTrellis = 5;

// How the chunk is stored. Stored: never renumber.
enum class StreamMode : uint8_t {
  kLossless = 0,   // byte planes (of values XOR base in a delta frame), zstd
  kQuantized = 1,  // levels + packed symbols (zstd) + exact list (zstd)
  kLog = 2,        // log-domain indices (delta-coded against the base), zstd + exact list
  kTrellis = 3,    // trellis-coded indices of a step (context rANS) + exact list
};

// Version 3 (rANS symbols): symbol widths 1..kMaxRansBits, one byte each.
inline constexpr uint32_t kMaxRansBits = 8;

// Log mode: symbol widths 1..kMaxLogBits, at most kMaxLogLevels levels per octave.
inline constexpr uint32_t kMaxLogBits = 24;
inline constexpr uint32_t kMaxLogLevels = 1u << 16;

// Every stream ends with XXH3-64 (seed 0) of all bytes before it, LE.
inline constexpr size_t kTrailerSize = 8;

// Flag bits of StreamHeader::flags; all other bits are reserved (must be 0).
inline constexpr uint8_t kFlagDelta = 0x01;
// Log mode, delta frames only (LOSSY.md section 9): over a +0.0 base
// element, symbols 0 and 1 exchange their meanings, so a zero that stays a
// zero costs symbol 0 (the second moment of a parameter that never gets a
// gradient).
inline constexpr uint8_t kFlagZeroCarry = 0x02;
// Compact header (2026-12-02, any mode and version): the six integers after
// the first eight bytes are LEB128 varints instead of fixed-width fields
// (LOSSY.md section 5.1): 9-15 bytes instead of 44. A chunk of a small
// tensor (a bias, a norm's scale) took 60 bytes of header and trailer for
// 20-100 bytes of symbols.
inline constexpr uint8_t kFlagCompactHeader = 0x04;

struct StreamHeader {
  static constexpr size_t kEncodedSize = 52;  // without kFlagCompactHeader
  static constexpr size_t kFixedPrefix = 8;   // version .. reserved, in both layouts

  uint8_t version = kStreamVersion;  // see SymbolsAreRans
  StreamMode mode = StreamMode::kLossless;
  ElementType type = ElementType::kF32;
  uint8_t bits = 0;         // symbol width 1..8 (kQuantized), 1..24 (kLog), 8 (kTrellis), 0 (kLossless)
  uint8_t flags = 0;        // kFlagDelta when a base was used
  uint32_t num_levels = 0;  // <= 2^bits - 1 (kQuantized), levels per octave (kLog), states (kTrellis: 8), 0 (kLossless)
  uint64_t element_count = 0;
  uint64_t exact_count = 0;     // entries in the exact list (kQuantized)
  uint64_t main_size = 0;       // zstd bytes of the symbols / byte planes
  uint64_t exact_raw_size = 0;  // decompressed bytes of the exact list
  uint64_t exact_size = 0;      // zstd bytes of the exact list (0 when empty)
  // The parsed header's own size (set by DecodeFrom): kEncodedSize, or
  // less with kFlagCompactHeader.
  size_t size = kEncodedSize;

  // Version 3: the main stream is rANS-coded symbols, not a zstd frame.
  bool SymbolsAreRans() const { return version == kStreamVersionRans || version == kStreamVersionRansContexts; }
  // Version 4: the rANS plane codes each symbol in its element's context.
  bool SymbolsHaveContexts() const { return version == kStreamVersionRansContexts; }
  // The version for a quantized or log stream whose symbols are coded so.
  static uint8_t VersionFor(StreamMode mode, bool rans, bool contexts = false) {
    if (contexts) return kStreamVersionRansContexts;
    return rans ? kStreamVersionRans : mode == StreamMode::kLog ? kStreamVersionLog : kStreamVersion;
  }

  // Appends the header (compact when flags has kFlagCompactHeader).
  void EncodeTo(std::vector<std::byte>* out) const;
  // Parses and checks every field that can be checked alone.
  static Result<StreamHeader> DecodeFrom(ByteSpan data);
};

// Compresses `src` into one zstd frame held in the reused `staging` buffer.
Result<ByteSpan> CompressZstd(ZSTD_CCtx* cctx, int level, ByteSpan src, std::vector<std::byte>* staging);
// Decompresses exactly `want` bytes of zstd from `src` into `dst`.
Status Unzstd(ZSTD_DCtx* dctx, ByteSpan src, std::byte* dst, size_t want, const char* what);
// Appends the trailer: XXH3-64 of every byte before it.
void AppendChecksum(std::vector<std::byte>* out);
// Writes the exact list (LOSSY.md 5.4): varint position gaps, then the raw bits.
void BuildExactList(std::span<const uint32_t> positions, ByteSpan raw, std::vector<std::byte>* out);

// The exact list of a stream (LOSSY.md 5.4), written into the decoded output
// slice by slice: the decoders write, patch and hash a chunk's output in
// slices, while each is in cache.
class ExactPatcher {
 public:
  ExactPatcher() = default;  // an empty list
  // Decompresses the exact stream `exact_z` of a stream with header `h` into
  // `list` (nothing when h.exact_count is 0). `list` must outlive the patcher.
  static Result<ExactPatcher> Open(ZSTD_DCtx* dctx, ByteSpan exact_z, const StreamHeader& h, size_t width,
                                   std::vector<std::byte>* list);
  // Writes the raw elements at positions below `end` into `out`, the whole
  // chunk's output. Calls come with growing `end`.
  Status PatchBelow(uint64_t end, MutableByteSpan out);
  // After the last slice of n elements: every entry lay within them, and no
  // list bytes were left over.
  Status Finish(uint64_t n) const;

 private:
  ExactPatcher(ByteSpan list, uint64_t count, size_t width)
      : list_(list), count_(count), width_(width), raw_at_(list.size() - count * width) {}
  ByteSpan list_;
  uint64_t count_ = 0;
  size_t width_ = 0;
  size_t raw_at_ = 0;            // the raw elements follow the varint gaps
  size_t pos_ = 0;               // next varint byte
  uint64_t done_ = 0;            // entries written
  uint64_t next_ = 0;            // the position after the last one written
  bool have_position_ = false;   // position_ is read but not written yet
  uint64_t position_ = 0;
};

// The slice, in elements, in which a decoder writes, patches and hashes its
// output: 64 KiB of f32 stays in L2. A multiple of 8, so that every slice's
// packed symbols start on a byte boundary at any symbol width.
inline constexpr uint64_t kDecodeSliceElements = 16384;

// Runs decode_slice(first, count) over the n elements of `out`, writing each
// slice's exact elements after it, then `finish` (base_slices.h) on it;
// then checks the exact list. With `hash` (or `sliced`: the decoder reads a
// base made slice by slice, or has a finish), in slices of
// kDecodeSliceElements, each hashed right after it is patched and
// finished; else in one slice.
template <typename DecodeSlice>
Status DecodeInSlices(uint64_t n, size_t width, ExactPatcher& exact, Checksum64Stream* hash, MutableByteSpan out,
                      DecodeSlice&& decode_slice, bool sliced = false, const SliceFinish* finish = nullptr) {
  const uint64_t slice =
      hash != nullptr || sliced || finish != nullptr ? kDecodeSliceElements : std::max<uint64_t>(n, 1);
  for (uint64_t first = 0; first < n; first += slice) {
    const uint64_t count = std::min(slice, n - first);
    RETURN_IF_ERROR(decode_slice(first, count));
    RETURN_IF_ERROR(exact.PatchBelow(first + count, out));
    if (finish != nullptr) finish->Apply(first, count, out.data() + first * width);
    if (hash != nullptr) hash->Update(ByteSpan(out.data() + first * width, count * width));
  }
  return exact.Finish(n);
}

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
