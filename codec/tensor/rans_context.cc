// Stream (FORMAT.md "Context rANS plane"): the table count K (one byte), a
// 32-byte bitmap of the byte values present in any table, for each table
// the frequency of each present value in increasing order (0..kProbScale:
// below 0x80 one byte, else 0x80 | f >> 8 then f & 0xff), then, as in a
// rANS plane, kStates little-endian u32 start states and the u16
// renormalisation words. Byte i goes through state i % kStates.
#include "codec/tensor/rans_context.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>

#include "codec/tensor/rans_model.h"

namespace ckptfs {

using rans::kLower;
using rans::kProbBits;
using rans::kProbScale;
using rans::kStateBytes;
using rans::kStates;

namespace {

using Histograms = std::vector<std::array<uint32_t, 256>>;

inline uint32_t TableOf(uint8_t id, uint32_t tables, uint32_t count) { return id * tables / count; }

// Bytes a frequency takes in the stored tables.
inline size_t FreqBytes(uint32_t f) { return f < 0x80 ? 1 : 2; }

// The histograms of `tables` tables, merged from those of every context.
Histograms Merge(const Histograms& by_context, uint32_t tables) {
  const uint32_t count = static_cast<uint32_t>(by_context.size());
  Histograms out(tables, std::array<uint32_t, 256>{});
  for (uint32_t c = 0; c < count; ++c)
    for (size_t s = 0; s < 256; ++s) out[TableOf(static_cast<uint8_t>(c), tables, count)][s] += by_context[c][s];
  return out;
}

// Coded bits of the bytes at their tables' empirical entropy, plus the
// tables (a byte per frequency is the common case).
double EstimateBits(const Histograms& hists, const std::array<bool, 256>& present) {
  size_t symbols = 0;
  for (bool p : present) symbols += p;
  double bits = 8.0 * (1 + rans::kBitmapBytes + static_cast<double>(hists.size() * symbols));
  for (const auto& h : hists) {
    uint64_t total = 0;
    for (uint32_t c : h) total += c;
    for (uint32_t c : h)
      if (c != 0) bits -= c * std::log2(static_cast<double>(c) / static_cast<double>(total));
  }
  return bits;
}

// Frequencies of one table: proportional to its counts, or, for a table no
// byte uses, everything on the smallest present value.
rans::Freqs TableFreqs(const std::array<uint32_t, 256>& hist, const std::array<bool, 256>& present) {
  size_t total = 0;
  for (uint32_t c : hist) total += c;
  if (total != 0) return rans::NormalizeFreqs(hist, total);
  rans::Freqs f{};
  for (size_t s = 0; s < 256; ++s)
    if (present[s]) {
      f[s] = kProbScale;
      break;
    }
  return f;
}

}  // namespace

Result<size_t> RansEncodeInContexts(const uint8_t* in, size_t n, ByteContexts contexts, std::byte* out,
                                    size_t capacity) {
  if (n == 0 || contexts.empty() || contexts.count > kMaxRansContexts)
    return Status::InvalidArgument(fmt::format("context rANS: {} bytes in {} contexts", n, contexts.count));
  Histograms by_context(contexts.count, std::array<uint32_t, 256>{});
  for (size_t i = 0; i < n; ++i) {
    if (contexts.ids[i] >= contexts.count)
      return Status::InvalidArgument(fmt::format("context rANS: context {} of byte {} not below {}", contexts.ids[i],
                                                 i, contexts.count));
    ++by_context[contexts.ids[i]][in[i]];
  }
  std::array<bool, 256> present{};
  for (const auto& h : by_context)
    for (size_t s = 0; s < 256; ++s) present[s] = present[s] || h[s] != 0;

  // Fewer tables cost less to store and estimate worse: take the smallest.
  uint32_t tables = contexts.count;
  Histograms hists = by_context;
  double best = EstimateBits(hists, present);
  for (uint32_t k = contexts.count / 2; k >= 1; k /= 2) {
    Histograms merged = Merge(by_context, k);
    const double bits = EstimateBits(merged, present);
    if (bits < best) {
      best = bits;
      tables = k;
      hists = std::move(merged);
    }
  }

  // Tables.
  std::vector<rans::Freqs> freqs(tables);
  size_t at = 1 + rans::kBitmapBytes;
  for (uint32_t k = 0; k < tables; ++k) {
    freqs[k] = TableFreqs(hists[k], present);
    for (size_t s = 0; s < 256; ++s) at += present[s] ? FreqBytes(freqs[k][s]) : 0;
  }
  if (at + kStateBytes > capacity) return Status::Unsupported("context rANS: no room");
  out[0] = std::byte(tables);
  for (size_t i = 0; i < rans::kBitmapBytes; ++i) out[1 + i] = std::byte{0};
  for (size_t s = 0; s < 256; ++s)
    if (present[s]) out[1 + s / 8] |= std::byte(1u << (s % 8));
  at = 1 + rans::kBitmapBytes;
  for (uint32_t k = 0; k < tables; ++k)
    for (size_t s = 0; s < 256; ++s) {
      if (!present[s]) continue;
      const uint32_t f = freqs[k][s];
      if (f < 0x80) {
        out[at++] = std::byte(f);
      } else {
        out[at++] = std::byte(0x80 | f >> 8);
        out[at++] = std::byte(f & 0xff);
      }
    }
  const size_t table_size = at;

  std::vector<rans::EncodeSymbol> symbols(size_t{tables} * 256);
  for (uint32_t k = 0; k < tables; ++k)
    for (uint32_t s = 0, start = 0; s < 256; start += freqs[k][s], ++s)
      if (freqs[k][s] != 0) symbols[k * 256 + s] = rans::MakeEncodeSymbol(freqs[k][s], start);

  // Backwards from the last byte; the words are written from the end of
  // the buffer down and moved into place after the states.
  std::byte* const lowest = out + table_size + kStateBytes;
  std::byte* const top = out + capacity;
  std::byte* w = top;
  std::array<uint32_t, kStates> x;
  x.fill(kLower);
  for (size_t i = n; i-- > 0;) {
    const rans::EncodeSymbol& e = symbols[TableOf(contexts.ids[i], tables, contexts.count) * 256 + in[i]];
    if (!rans::EncodeChecked(x[i % kStates], e, w, lowest)) return Status::Unsupported("context rANS: no room");
  }
  std::byte* states = out + table_size;
  for (size_t j = 0; j < kStates; ++j) StoreLE32(states + 4 * j, x[j]);
  const size_t words = static_cast<size_t>(top - w);
  std::memmove(lowest, w, words);
  return table_size + kStateBytes + words;
}

Status ContextRansReader::Open(ByteSpan stored, uint32_t count, std::string_view what,
                               std::vector<uint32_t>* tables_out) {
  what_ = std::string(what);
  auto corrupt = [&](const std::string& why) { return Status::Corruption(fmt::format("{}: {}", what, why)); };
  if (count < 1 || count > kMaxRansContexts)
    return Status::InvalidArgument(fmt::format("{}: context rANS plane needs its contexts", what));
  if (stored.size() < 1 + rans::kBitmapBytes) return corrupt("context rANS tables truncated");
  const uint32_t tables = static_cast<uint8_t>(stored[0]);
  if (tables < 1 || tables > count)
    return corrupt(fmt::format("context rANS: {} tables for {} contexts", tables, count));
  std::array<bool, 256> present{};
  for (size_t s = 0; s < 256; ++s) present[s] = (static_cast<uint8_t>(stored[1 + s / 8]) >> (s % 8) & 1) != 0;
  size_t at = 1 + rans::kBitmapBytes;
  std::vector<uint32_t>& dec = *tables_out;
  dec.resize(size_t{tables} * kProbScale);
  for (uint32_t k = 0; k < tables; ++k) {
    uint32_t start = 0;
    for (uint32_t s = 0; s < 256; ++s) {
      if (!present[s]) continue;
      if (at >= stored.size()) return corrupt("context rANS tables truncated");
      uint32_t f = static_cast<uint8_t>(stored[at++]);
      if (f >= 0x80) {
        if (f > 0x80 + (kProbScale >> 8) || at >= stored.size())
          return corrupt(fmt::format("context rANS: bad frequency of byte {} in table {}", s, k));
        f = (f & 0x7f) << 8 | static_cast<uint8_t>(stored[at++]);
        if (f < 0x80) return corrupt(fmt::format("context rANS: bad frequency of byte {} in table {}", s, k));
      }
      if (f > kProbScale - start)
        return corrupt(fmt::format("context rANS: table {} frequencies sum past {}", k, kProbScale));
      for (uint32_t j = 0; j < f; ++j) dec[k * kProbScale + start + j] = s | (f - 1) << 8 | j << 20;
      start += f;
    }
    if (start != kProbScale)
      return corrupt(fmt::format("context rANS: table {} frequencies sum to {}, want {}", k, start, kProbScale));
  }
  RETURN_IF_ERROR(rans::ReadStreamStart(stored.subspan(at), &start_, what));
  for (uint32_t c = 0; c < count; ++c)
    table_of_[c] = dec.data() + size_t{TableOf(static_cast<uint8_t>(c), tables, count)} * kProbScale;
  at_ = 0;
  truncated_ = false;
  return Status::Ok();
}

Status ContextRansReader::Finish() const {
  if (truncated_) return Status::Corruption(what_ + ": context rANS stream truncated");
  return rans::CheckStreamEnd(start_, what_);
}

Status RansDecodeInContexts(ByteSpan stored, ByteContexts contexts, uint8_t* out, size_t n, std::string_view what,
                            std::vector<uint32_t>* tables_out) {
  if (contexts.empty() || contexts.count > kMaxRansContexts)
    return Status::InvalidArgument(fmt::format("{}: context rANS plane needs its contexts", what));
  ContextRansReader reader;
  RETURN_IF_ERROR(reader.Open(stored, contexts.count, what, tables_out));
  for (size_t i = 0; i < n; ++i) {
    if (contexts.ids[i] >= contexts.count)
      return Status::InvalidArgument(
          fmt::format("{}: context {} of byte {} not below {}", what, contexts.ids[i], i, contexts.count));
    out[i] = reader.Next(contexts.ids[i]);
  }
  return reader.Finish();
}

}  // namespace ckptfs
