// The parts of the rANS plane coder (rans.h) that the scalar and the AVX2
// paths share: constants, the frequency table and its stored form, and the
// decode step. Internal to codec/tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/common/simd_level.h"
#include "codec/tensor/rans.h"

namespace ckptfs::rans {

// Frequencies sum to 2^kProbBits. 12 bits keep the decode table (4096
// entries of 4 bytes) in L1 and cost under 0.01 bits/byte against exact
// probabilities on trained float planes.
constexpr uint32_t kProbBits = 12;
constexpr uint32_t kProbScale = 1u << kProbBits;
// States live in [kLower, 2^32); renormalisation moves 16-bit words.
constexpr uint32_t kLower = 1u << 16;
// Byte i of a plane goes through state i % kStates. 32 states give the
// AVX2 decoder four independent 8-lane vectors (the AVX-512 one two of 16
// lanes) to hide gather latency.
constexpr size_t kStates = 32;
constexpr size_t kStateBytes = 4 * kStates;
constexpr size_t kBitmapBytes = 32;

using Freqs = std::array<uint32_t, 256>;

// Slot -> packed decode entry: symbol in bits 0-7, frequency - 1 in bits
// 8-19, slot - symbol start in bits 20-31.
using DecodeTable = std::array<uint32_t, kProbScale>;

// Frequencies summing to kProbScale, at least 1 for each byte value that
// occurs, close to the counts' proportions. REQUIRES: n = sum of hist > 0.
Freqs NormalizeFreqs(const std::array<uint32_t, 256>& hist, size_t n);

// Writes the stored form of `freqs` to out[0, capacity); returns its size,
// or 0 if it does not fit.
size_t WriteFreqs(const Freqs& freqs, std::byte* out, size_t capacity);

// Parses a stored frequency table from the front of `in`: every present
// frequency in [1, kProbScale], their sum exactly kProbScale. Sets *used to
// the bytes it took.
Status ReadFreqs(ByteSpan in, Freqs* freqs, size_t* used, std::string_view what);

void BuildDecodeTable(const Freqs& freqs, DecodeTable* table);

// One decode step of state x (in [kLower, 2^32)): returns the symbol and
// leaves x before renormalisation.
inline uint8_t DecodeStep(const DecodeTable& table, uint32_t& x) {
  const uint32_t e = table[x & (kProbScale - 1)];
  x = (((e >> 8) & (kProbScale - 1)) + 1) * (x >> kProbBits) + (e >> 20);
  return static_cast<uint8_t>(e);
}

// The stream after the frequency table: the kStates initial decoder states
// and the renormalisation words. Checks that the states are in range and
// the words a whole number.
struct StreamStart {
  std::array<uint32_t, kStates> states;
  const std::byte* words;
  const std::byte* end;
};
Status ReadStreamStart(ByteSpan stored, StreamStart* start, std::string_view what);

// Decodes symbols [from, n) one by one with every word read checked, then
// checks the stream ends exactly with every state back at kLower.
Status DecodeTail(const DecodeTable& table, StreamStart& s, size_t from, uint8_t* out, size_t n,
                  std::string_view what);

// DecodeTail's two halves, for decoding a stream piece by piece: symbols
// [from, n) one by one with every word read checked, out[i] going through
// state (first + i) % kStates; and the end check.
Status DecodeChecked(const DecodeTable& table, StreamStart& s, size_t first, size_t from, uint8_t* out, size_t n,
                     std::string_view what);
Status CheckStreamEnd(const StreamStart& s, std::string_view what);

// The portable whole-group decoder: as DecodeGroupsAvx2, without vectors.
size_t DecodeGroupsScalar(const DecodeTable& table, StreamStart& s, uint8_t* out, size_t n);

}  // namespace ckptfs::rans

namespace ckptfs::rans {

// Decodes whole groups of kStates symbols with AVX2 from s, starting at
// symbol 0, while a group's worst case of words is surely there; returns
// the symbols done (a multiple of kStates; the caller finishes with
// DecodeTail). Returns 0 where AVX2 is not available.
size_t DecodeGroupsAvx2(const DecodeTable& table, StreamStart& s, uint8_t* out, size_t n);
// The same with AVX-512 (two vectors of sixteen states). Returns 0 where
// AVX-512 is not available.
size_t DecodeGroupsAvx512(const DecodeTable& table, StreamStart& s, uint8_t* out, size_t n);

// The encoder's per-symbol values for the AVX2 path: the division
// multiplier (see rans.cc) and freq | start << 13 | shift << 25.
struct EncodeTables {
  std::array<uint32_t, 256> rcp;
  std::array<uint32_t, 256> info;
};

// Encodes the whole groups in[0, whole) (whole a multiple of kStates) last
// first, as the scalar encoder does, updating `states` and writing words
// down from w. Returns the new w, or nullptr when a group might not fit
// above `lowest`. REQUIRES: CpuHasSimd(SimdLevel::kAvx2).
std::byte* EncodeGroupsAvx2(const uint8_t* in, size_t whole, const EncodeTables& tables, uint32_t* states,
                            std::byte* w, const std::byte* lowest);

// The encoder's AVX-512 path: as EncodeGroupsAvx2, with one 64-bit table
// entry per byte value: rcp | freq << 32 | start << 45 | shift << 57.
// REQUIRES: CpuHasSimd(SimdLevel::kAvx512).
std::byte* EncodeGroupsAvx512(const uint8_t* in, size_t whole, const uint64_t* table, uint32_t* states,
                              std::byte* w, const std::byte* lowest);

// Whether the CPU runs EncodeGroupsAvx512Ifma: AVX-512 with IFMA and VBMI.
bool CpuHasAvx512Ifma();

// The tables of EncodeGroupsAvx512Ifma, by byte value: divide = m |
// (kProbScale - freq) << 52 with m = ceil(2^51 / freq), so that the
// 52-bit multiply-add's high half of 2x * m is floor(x / freq) for every
// 32-bit x (the rounding error stays under 2^-19); and the symbol's start.
struct IfmaEncodeTables {
  std::array<uint64_t, 256> divide;
  std::array<uint64_t, 256> start;
};

// As EncodeGroupsAvx512, dividing by 52-bit multiply-adds instead of the
// reciprocal multiplier and shift, and moving the emitted words with one
// byte permute: fewer instructions on the ports that the other path fills.
// REQUIRES: CpuHasAvx512Ifma().
std::byte* EncodeGroupsAvx512Ifma(const uint8_t* in, size_t whole, const IfmaEncodeTables& tables, uint32_t* states,
                                  std::byte* w, const std::byte* lowest);

// What the encoder needs per symbol to avoid a division: with
// q = floor(x / freq) computed as ((x * rcp >> 32) + x) >> shift, the step
// x -> (q << kProbBits) + x % freq + start is x + start + q * (kProbScale -
// freq). rcp and shift are the Granlund-Montgomery multiplier for 32-bit
// dividends: m = ceil(2^(32 + shift) / freq), shift = ceil(log2(freq)),
// rcp = m - 2^32 (which fits 32 bits because freq > 2^(shift - 1)).
struct EncodeSymbol {
  uint32_t rcp;
  uint32_t shift;
  uint32_t limit;  // renormalise while x > limit (freq << 20, minus 1)
  uint16_t start;
  uint16_t complement;
};

inline EncodeSymbol MakeEncodeSymbol(uint32_t freq, uint32_t start) {
  EncodeSymbol e{};
  uint32_t shift = 0;
  while ((1u << shift) < freq) ++shift;
  const uint64_t m = ((uint64_t{1} << (32 + shift)) + freq - 1) / freq;
  e.rcp = static_cast<uint32_t>(m - (uint64_t{1} << 32));
  e.shift = shift;
  e.limit = static_cast<uint32_t>((uint64_t{freq} << (32 - kProbBits)) - 1);
  e.start = static_cast<uint16_t>(start);
  e.complement = static_cast<uint16_t>(kProbScale - freq);
  return e;
}

inline uint32_t EncodeStep(uint32_t x, const EncodeSymbol& e) {
  const uint32_t q = static_cast<uint32_t>(((static_cast<uint64_t>(x) * e.rcp >> 32) + x) >> e.shift);
  return x + e.start + q * e.complement;
}

// One encoder step of state s with every word write checked: renormalises
// into the words written downwards from w (false when that would pass
// `lowest`), then encodes.
inline bool EncodeChecked(uint32_t& s, const EncodeSymbol& e, std::byte*& w, const std::byte* lowest) {
  if (s > e.limit) {
    if (w - lowest < 2) return false;
    w -= 2;
    StoreLE16(w, static_cast<uint16_t>(s));
    s >>= 16;
  }
  s = EncodeStep(s, e);
  return true;
}

// The ByteRanges (rans.h) of p[0, n).
ByteRanges FindByteRanges(const uint8_t* p, size_t n);
// Its AVX2 path. REQUIRES: CpuHasSimd(SimdLevel::kAvx2).
ByteRanges FindByteRangesAvx2(const uint8_t* p, size_t n);

}  // namespace ckptfs::rans
