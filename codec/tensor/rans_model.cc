#include "codec/tensor/rans_model.h"

#include <fmt/format.h>

#include <algorithm>

namespace ckptfs::rans {

Freqs NormalizeFreqs(const std::array<uint32_t, 256>& hist, size_t n) {
  Freqs freqs{};
  int64_t sum = 0;
  for (size_t s = 0; s < 256; ++s) {
    if (hist[s] == 0) continue;
    // Nearest to the exact share, at least 1.
    uint64_t f = (static_cast<uint64_t>(hist[s]) * kProbScale + n / 2) / n;
    freqs[s] = static_cast<uint32_t>(f == 0 ? 1 : f);
    sum += freqs[s];
  }
  // Rounding leaves the sum a little off. Each correction goes where it
  // costs least: the coded size is sum(-count * log2(freq)), whose change
  // for one step of freq is about count / freq.
  while (sum != kProbScale) {
    const bool grow = sum < kProbScale;
    int best = -1;
    double best_rate = 0;
    for (size_t s = 0; s < 256; ++s) {
      if (freqs[s] == 0 || (!grow && freqs[s] == 1)) continue;
      double rate = static_cast<double>(hist[s]) / freqs[s];
      if (best < 0 || (grow ? rate > best_rate : rate < best_rate)) {
        best = static_cast<int>(s);
        best_rate = rate;
      }
    }
    // A shrink always finds a frequency above 1: sum > kProbScale >= 256
    // entries of at least 1.
    freqs[best] += grow ? 1 : -1;
    sum += grow ? 1 : -1;
  }
  return freqs;
}

// Stored form: a 32-byte bitmap of the byte values present (bit s % 8 of
// byte s / 8), then for each present value in increasing order freq - 1 in
// one byte (below 128) or two (0x80 | high 4 bits, then the low 8 bits).
size_t WriteFreqs(const Freqs& freqs, std::byte* out, size_t capacity) {
  if (capacity < kBitmapBytes) return 0;
  size_t at = kBitmapBytes;
  for (size_t i = 0; i < kBitmapBytes; ++i) out[i] = std::byte{0};
  for (size_t s = 0; s < 256; ++s) {
    if (freqs[s] == 0) continue;
    out[s / 8] |= std::byte(1u << (s % 8));
    const uint32_t v = freqs[s] - 1;
    if (v < 0x80) {
      if (at + 1 > capacity) return 0;
      out[at++] = std::byte(v);
    } else {
      if (at + 2 > capacity) return 0;
      out[at++] = std::byte(0x80 | (v >> 8));
      out[at++] = std::byte(v & 0xff);
    }
  }
  return at;
}

Status ReadFreqs(ByteSpan in, Freqs* freqs, size_t* used, std::string_view what) {
  if (in.size() < kBitmapBytes)
    return Status::Corruption(fmt::format("{}: rANS table needs {} bytes, {} stored", what, kBitmapBytes, in.size()));
  size_t at = kBitmapBytes;
  uint32_t sum = 0;
  for (size_t s = 0; s < 256; ++s) {
    (*freqs)[s] = 0;
    if ((static_cast<uint8_t>(in[s / 8]) >> (s % 8) & 1) == 0) continue;
    if (at >= in.size()) return Status::Corruption(fmt::format("{}: rANS table truncated", what));
    uint32_t v = static_cast<uint8_t>(in[at++]);
    if (v >= 0x80) {
      if (v > 0x8f || at >= in.size())
        return Status::Corruption(fmt::format("{}: bad rANS frequency of byte {}", what, s));
      v = (v & 0x0f) << 8 | static_cast<uint8_t>(in[at++]);
      if (v < 0x80) return Status::Corruption(fmt::format("{}: bad rANS frequency of byte {}", what, s));
    }
    (*freqs)[s] = v + 1;
    sum += v + 1;
  }
  if (sum != kProbScale)
    return Status::Corruption(fmt::format("{}: rANS frequencies sum to {}, want {}", what, sum, kProbScale));
  *used = at;
  return Status::Ok();
}

void BuildDecodeTable(const Freqs& freqs, DecodeTable* table) {
  uint32_t start = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t f = freqs[s];
    for (uint32_t k = 0; k < f; ++k) (*table)[start + k] = s | (f - 1) << 8 | k << 20;
    start += f;
  }
}

Status ReadStreamStart(ByteSpan stored, StreamStart* start, std::string_view what) {
  if (stored.size() < kStateBytes)
    return Status::Corruption(fmt::format("{}: rANS states need {} bytes, {} stored", what, kStateBytes, stored.size()));
  for (size_t j = 0; j < kStates; ++j) {
    start->states[j] = LoadLE32(stored.data() + 4 * j);
    if (start->states[j] < kLower)
      return Status::Corruption(fmt::format("{}: rANS state {} out of range", what, j));
  }
  if ((stored.size() - kStateBytes) % 2 != 0)
    return Status::Corruption(fmt::format("{}: rANS words are not whole", what));
  start->words = stored.data() + kStateBytes;
  start->end = stored.data() + stored.size();
  return Status::Ok();
}

Status DecodeChecked(const DecodeTable& table, StreamStart& s, size_t first, size_t from, uint8_t* out, size_t n,
                     std::string_view what) {
  for (size_t i = from; i < n; ++i) {
    uint32_t& x = s.states[(first + i) % kStates];
    out[i] = DecodeStep(table, x);
    if (x < kLower) {
      if (s.end - s.words < 2) return Status::Corruption(fmt::format("{}: rANS stream truncated", what));
      x = x << 16 | LoadLE16(s.words);
      s.words += 2;
    }
  }
  return Status::Ok();
}

Status CheckStreamEnd(const StreamStart& s, std::string_view what) {
  if (s.words != s.end)
    return Status::Corruption(fmt::format("{}: {} rANS bytes left over", what, s.end - s.words));
  for (uint32_t x : s.states)
    if (x != kLower) return Status::Corruption(fmt::format("{}: rANS stream does not end in the start state", what));
  return Status::Ok();
}

Status DecodeTail(const DecodeTable& table, StreamStart& s, size_t from, uint8_t* out, size_t n,
                  std::string_view what) {
  RETURN_IF_ERROR(DecodeChecked(table, s, 0, from, out, n, what));
  return CheckStreamEnd(s, what);
}

size_t DecodeGroupsScalar(const DecodeTable& table, StreamStart& s, uint8_t* out, size_t n) {
  size_t i = 0;
  // Whole groups while a group's worst case (one word per state) is
  // surely there: no per-word checks, branch-free renormalisation.
  for (; i + kStates <= n && s.end - s.words >= static_cast<ptrdiff_t>(2 * kStates); i += kStates) {
    for (size_t j = 0; j < kStates; ++j) {
      uint32_t x = s.states[j];
      out[i + j] = DecodeStep(table, x);
      const bool refill = x < kLower;
      const uint32_t word = LoadLE16(s.words);
      s.states[j] = refill ? x << 16 | word : x;
      s.words += refill ? 2 : 0;
    }
  }
  return i;
}

ByteRanges FindByteRanges(const uint8_t* p, size_t n) {
  if (CpuHasSimd(SimdLevel::kAvx2)) return FindByteRangesAvx2(p, n);
  ByteRanges r{0xff, 0, 0xff, 0};
  bool low = false, high = false;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = p[i];
    if (v < 0x80) {
      r.low_min = std::min(r.low_min, v);
      r.low_max = std::max(r.low_max, v);
      low = true;
    } else {
      r.high_min = std::min(r.high_min, v);
      r.high_max = std::max(r.high_max, v);
      high = true;
    }
  }
  if (!low) r.low_min = r.low_max = 0xff;
  if (!high) r.high_min = r.high_max = 0;
  return r;
}

}  // namespace ckptfs::rans
