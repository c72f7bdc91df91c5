// Stream (FORMAT.md, "rANS plane"): frequency table, kStates little-endian
// u32 decoder start states, then little-endian u16 renormalisation words in
// the order the decoder reads them. The encoder runs backwards from the last
// byte, so it writes the words from the end of its buffer down and moves
// them into place at the end.
#include "codec/tensor/rans.h"

#include <fmt/format.h>

#include <cstring>

#include "codec/tensor/rans_model.h"

namespace ckptfs {

using rans::kLower;
using rans::kProbBits;
using rans::kProbScale;
using rans::kStateBytes;
using rans::kStates;

using rans::EncodeStep;
using rans::EncodeSymbol;
using rans::MakeEncodeSymbol;

ByteHistogram CountBytes(const uint8_t* p, size_t n) {
  // Four tables: consecutive equal bytes would otherwise serialise on one
  // counter (store-to-load forwarding), which planes of skewed bytes hit.
  std::array<std::array<uint32_t, 256>, 4> h{};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h[0][p[i]];
    ++h[1][p[i + 1]];
    ++h[2][p[i + 2]];
    ++h[3][p[i + 3]];
  }
  for (; i < n; ++i) ++h[0][p[i]];
  ByteHistogram out;
  for (size_t s = 0; s < 256; ++s) out[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  return out;
}

namespace {

// Below this many bytes the model is the exact histogram: a sample would
// be small and counting cheap.
constexpr size_t kModelMinBytes = size_t{1} << 16;
// The sample: every kModelSampleStride-th byte (5041 samples at the
// least). A prime that is no common tensor dimension: a stride that
// divides the rows of a matrix sees only some of its columns (powers of
// two), or only some positions of its convolution kernels (3, 5, 7, 11).
constexpr size_t kModelSampleStride = 13;
// Each value that the sample missed costs every coded byte about
// log2(1 + 1 / kProbScale) bits (0.00035) if it does not occur; with more
// than this many the exact histogram is cheaper than the coding loss.
constexpr size_t kModelMaxMissed = 32;

}  // namespace

namespace {

// `h` (sampled counts of p[0, n)) plus one for each value that the sample
// missed within the ranges of p; CountBytes(p, n) when that adds too many.
ByteHistogram CompleteModel(const uint8_t* p, size_t n, ByteHistogram h, const rans::ByteRanges& ranges) {
  size_t missed = 0;
  auto cover = [&](uint32_t lo, uint32_t hi) {
    for (uint32_t v = lo; v <= hi; ++v) {
      missed += h[v] == 0;
      h[v] = h[v] == 0 ? 1 : h[v];
    }
  };
  if (ranges.low_min < 0x80) cover(ranges.low_min, ranges.low_max);
  if (ranges.high_max >= 0x80) cover(ranges.high_min, ranges.high_max);
  return missed > kModelMaxMissed ? CountBytes(p, n) : h;
}

}  // namespace

ByteHistogram ModelBytes(const uint8_t* p, size_t n) {
  if (n < kModelMinBytes) return CountBytes(p, n);
  // Four tables, as in CountBytes: the common values would otherwise
  // serialise on their counters.
  std::array<ByteHistogram, 4> t{};
  size_t i = 0;
  for (; i + 3 * kModelSampleStride < n; i += 4 * kModelSampleStride) {
    ++t[0][p[i]];
    ++t[1][p[i + kModelSampleStride]];
    ++t[2][p[i + 2 * kModelSampleStride]];
    ++t[3][p[i + 3 * kModelSampleStride]];
  }
  for (; i < n; i += kModelSampleStride) ++t[0][p[i]];
  ByteHistogram h;
  for (size_t v = 0; v < 256; ++v) h[v] = t[0][v] + t[1][v] + t[2][v] + t[3][v];
  return CompleteModel(p, n, h, rans::FindByteRanges(p, n));
}

ByteHistogram ModelBytesFromSample(const uint8_t* p, size_t n, const ByteHistogram& sample,
                                   const rans::ByteRanges& ranges) {
  size_t samples = 0;
  for (uint32_t c : sample) samples += c;
  if (n < kModelMinBytes || samples < kModelMinBytes / kModelSampleStride) return ModelBytes(p, n);
  return CompleteModel(p, n, sample, ranges);
}

namespace {

// `ifma`: at kAvx512, take the IFMA path where the CPU has it.
Result<size_t> Encode(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out, size_t capacity,
                      SimdLevel level, bool ifma = true) {
  size_t total = 0;
  for (uint32_t c : hist) total += c;
  const rans::Freqs freqs = rans::NormalizeFreqs(hist, total);
  const size_t table_size = rans::WriteFreqs(freqs, out, capacity);
  if (table_size == 0 || capacity - table_size < kStateBytes) return Status::Unsupported("rANS: no room");
  std::array<EncodeSymbol, 256> symbols{};
  for (uint32_t s = 0, start = 0; s < 256; start += freqs[s], ++s)
    if (freqs[s] != 0) symbols[s] = MakeEncodeSymbol(freqs[s], start);

  std::byte* const lowest = out + table_size + kStateBytes;
  std::byte* const top = out + capacity;
  std::byte* w = top;
  std::array<uint32_t, kStates> x;
  x.fill(kLower);
  // The last n % kStates bytes first, each word write checked.
  const size_t whole = n / kStates * kStates;
  for (size_t i = n; i-- > whole;) {
    if (!rans::EncodeChecked(x[i % kStates], symbols[in[i]], w, lowest)) return Status::Unsupported("rANS: no room");
  }
  if (level == SimdLevel::kAvx512 && ifma && rans::CpuHasAvx512Ifma()) {
    rans::IfmaEncodeTables tables{};
    for (size_t s = 0; s < 256; ++s) {
      if (freqs[s] == 0) continue;
      const uint64_t m = ((uint64_t{1} << 51) + freqs[s] - 1) / freqs[s];
      tables.divide[s] = m | uint64_t{kProbScale - freqs[s]} << 52;
      tables.start[s] = symbols[s].start;
    }
    w = rans::EncodeGroupsAvx512Ifma(in, whole, tables, x.data(), w, lowest);
    if (w == nullptr) return Status::Unsupported("rANS: no room");
  } else if (level == SimdLevel::kAvx512) {
    std::array<uint64_t, 256> table;
    for (size_t s = 0; s < 256; ++s)
      table[s] = symbols[s].rcp | uint64_t{freqs[s]} << 32 | uint64_t{symbols[s].start} << 45 |
                 uint64_t{symbols[s].shift} << 57;
    w = rans::EncodeGroupsAvx512(in, whole, table.data(), x.data(), w, lowest);
    if (w == nullptr) return Status::Unsupported("rANS: no room");
  } else if (level == SimdLevel::kAvx2) {
    rans::EncodeTables tables;
    for (size_t s = 0; s < 256; ++s) {
      tables.rcp[s] = symbols[s].rcp;
      tables.info[s] = freqs[s] | uint32_t{symbols[s].start} << 13 | symbols[s].shift << 25;
    }
    w = rans::EncodeGroupsAvx2(in, whole, tables, x.data(), w, lowest);
    if (w == nullptr) return Status::Unsupported("rANS: no room");
  }
  // Whole groups, last first. A group writes at most kStates words, so one
  // room check covers it and the word store can be unconditional (only the
  // pointer move depends on the branch-free renormalisation test).
  for (size_t g = level == SimdLevel::kScalar ? whole : 0; g > 0; g -= kStates) {
    if (w - lowest < static_cast<ptrdiff_t>(2 * kStates)) return Status::Unsupported("rANS: no room");
    const uint8_t* sym = in + g - kStates;
    for (size_t j = kStates; j-- > 0;) {
      const EncodeSymbol& e = symbols[sym[j]];
      uint32_t s = x[j];
      // Shift arithmetic rather than a condition: GCC turns a condition
      // into a branch, which mispredicts on near-random planes.
      const uint32_t shift = static_cast<uint32_t>(s > e.limit) << 4;
      StoreLE16(w - 2, static_cast<uint16_t>(s));
      w -= shift >> 3;
      x[j] = EncodeStep(s >> shift, e);
    }
  }
  std::byte* states = out + table_size;
  for (size_t j = 0; j < kStates; ++j) StoreLE32(states + 4 * j, x[j]);
  const size_t words = static_cast<size_t>(top - w);
  std::memmove(lowest, w, words);
  return table_size + kStateBytes + words;
}

}  // namespace

Result<size_t> RansEncode(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                          size_t capacity) {
  return Encode(in, n, hist, out, capacity, BestSimdLevel());
}

Result<size_t> RansEncodeWith(SimdLevel level, const uint8_t* in, size_t n, const ByteHistogram& hist,
                              std::byte* out, size_t capacity) {
  return Encode(in, n, hist, out, capacity, level);
}

Result<size_t> RansEncodeAvx512WithoutIfma(const uint8_t* in, size_t n, const ByteHistogram& hist, std::byte* out,
                                           size_t capacity) {
  return Encode(in, n, hist, out, capacity, SimdLevel::kAvx512, /*ifma=*/false);
}

namespace {

Status Decode(ByteSpan stored, uint8_t* out, size_t n, SimdLevel level, std::string_view what) {
  rans::Freqs freqs;
  size_t used = 0;
  RETURN_IF_ERROR(rans::ReadFreqs(stored, &freqs, &used, what));
  rans::DecodeTable table;
  rans::BuildDecodeTable(freqs, &table);
  rans::StreamStart s;
  RETURN_IF_ERROR(rans::ReadStreamStart(stored.subspan(used), &s, what));
  if (level == SimdLevel::kAvx512)
    return rans::DecodeTail(table, s, rans::DecodeGroupsAvx512(table, s, out, n), out, n, what);
  if (level == SimdLevel::kAvx2) return rans::DecodeTail(table, s, rans::DecodeGroupsAvx2(table, s, out, n), out, n, what);
  const size_t i = rans::DecodeGroupsScalar(table, s, out, n);
  return rans::DecodeTail(table, s, i, out, n, what);
}

}  // namespace

Status RansDecodeWith(SimdLevel level, ByteSpan stored, uint8_t* out, size_t n, std::string_view what) {
  return Decode(stored, out, n, level, what);
}

Status RansDecode(ByteSpan stored, uint8_t* out, size_t n, std::string_view what) {
  return Decode(stored, out, n, BestSimdLevel(), what);
}

}  // namespace ckptfs
