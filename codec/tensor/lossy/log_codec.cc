// Log mode: classify -> grid index -> symbol against the predictor -> pick
// the symbol width -> pack -> exact list -> zstd. See LOSSY.md section 9.
#include "codec/tensor/lossy/log_codec.h"

#include <endian.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "codec/tensor/lossy/element_ops.h"

namespace ckptfs::lossy {
namespace {

// Bytes after the header: the grid ratio (f64), the origin (i32), the delta shift (i32).
constexpr size_t kLogParamsSize = 16;
// The delta shift is the most frequent index difference within this range.
constexpr int64_t kMaxShift = 64;
// Symbols: 0 = the predicted index, 1 = +0.0, s >= 2 = predicted + Unzigzag(s - 1).
constexpr uint32_t kSymbolZero = 1;
// Key frames of up to this symbol width decode through a table (at most
// 2^16 entries, and never more entries than elements).
constexpr uint32_t kMaxTableBits = 16;
// Per escaped element the exact list costs its bits plus about 2 bytes of position.
constexpr uint64_t kEscapeBits = 16;

uint32_t Zigzag(int64_t d) { return static_cast<uint32_t>(d > 0 ? 2 * d : -2 * d - 1); }
int64_t Unzigzag(uint32_t z) { return (z & 1) ? -static_cast<int64_t>((z + 1) / 2) : static_cast<int64_t>(z / 2); }

uint64_t PackedLogBytes(uint64_t n, uint32_t bits) { return (n * bits + 7) / 8; }

// Symbol i occupies bits [i*b, (i+1)*b) of the little-endian bit string.
void PackSymbols(std::span<const uint32_t> symbols, uint32_t bits, std::byte* out) {
  uint64_t acc = 0;
  uint32_t filled = 0;
  size_t at = 0;
  for (uint32_t s : symbols) {
    acc |= static_cast<uint64_t>(s) << filled;
    filled += bits;
    while (filled >= 8) {
      out[at++] = std::byte(acc & 0xff);
      acc >>= 8;
      filled -= 8;
    }
  }
  if (filled > 0) out[at++] = std::byte(acc & 0xff);
}

// Reads symbols in order from a packed bit string.
class SymbolReader {
 public:
  SymbolReader(ByteSpan packed, uint32_t bits) : packed_(packed), bits_(bits), mask_((1u << bits) - 1) {}
  uint32_t Next() {
    if (filled_ < bits_ && at_ + 8 <= packed_.size()) {
      // Refill whole bytes from one 8-byte load: bits_ <= 24, so at least
      // 32 new bits fit above the (< bits_) bits held.
      uint64_t word;
      std::memcpy(&word, packed_.data() + at_, 8);
      word = le64toh(word);
      const uint32_t take = (63 - filled_) / 8;  // 5..7 bytes
      acc_ |= (word & ((uint64_t{1} << (8 * take)) - 1)) << filled_;
      at_ += take;
      filled_ += 8 * take;
    }
    while (filled_ < bits_) {
      acc_ |= static_cast<uint64_t>(at_ < packed_.size() ? static_cast<uint8_t>(packed_[at_]) : 0) << filled_;
      ++at_;
      filled_ += 8;
    }
    uint32_t s = static_cast<uint32_t>(acc_) & mask_;
    acc_ >>= bits_;
    filled_ -= bits_;
    return s;
  }

 private:
  ByteSpan packed_;
  uint32_t bits_;
  uint32_t mask_;
  uint64_t acc_ = 0;
  uint32_t filled_ = 0;
  size_t at_ = 0;
};

template <typename E>
typename E::Bits LoadBits(const std::byte* p, size_t i) {
  typename E::Bits b;
  std::memcpy(&b, p + i * sizeof b, sizeof b);
  return b;
}
template <typename E>
void StoreBits(std::byte* p, size_t i, typename E::Bits b) {
  std::memcpy(p + i * sizeof b, &b, sizeof b);
}

// True when the element's value has a grid index (finite and > 0).
bool OnGrid(float x) { return x > 0 && std::isfinite(x); }

template <typename E>
typename E::Bits GridElement(const LogGrid& grid, int64_t q) {
  return E::FromFloat(grid.FloatValue(q));
}

// The predicted index of element i: in a delta frame, the base element's
// index plus the chunk's shift when the base element is on the grid (a
// second moment that decays between versions moves most indices alike);
// else the stream's origin.
template <typename E>
int64_t Predict(const LogGrid& grid, ByteSpan base, size_t i, int64_t origin, int64_t shift) {
  if (base.empty()) return origin;
  const float b = E::ToFloat(LoadBits<E>(base.data(), i));
  return OnGrid(b) ? grid.Index(b) + shift : origin;
}

constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::min();

template <typename E>
Result<std::optional<EncodedChunk>> EncodeTyped(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out) {
  using Bits = typename E::Bits;
  const size_t width = sizeof(Bits);
  const uint64_t n = values.size() / width;
  Result<LogGrid> grid_or = LogGrid::FromRatio(LogGrid::RatioFor(max_rel));
  if (!grid_or.ok()) return std::optional<EncodedChunk>();  // finer than the grid allows: lossless
  const LogGrid& grid = *grid_or;

  EncodedChunk chunk;
  MutableByteSpan recon = recon_out;
  if (recon.empty()) {
    chunk.reconstruction.resize(values.size());
    recon = chunk.reconstruction;
  }

  // 1. Each element's grid index (or why it has none); the key frame's
  //    origin is the middle of the index range, so symbols stay small.
  EnsureSize(&s.log_index, n);
  std::span<int64_t> index(s.log_index.data(), n);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (uint64_t i = 0; i < n; ++i) {
    const Bits bits = LoadBits<E>(values.data(), i);
    const float x = E::ToFloat(bits);
    StoreBits<E>(recon.data(), i, bits);  // exact unless quantized below
    index[i] = kNoIndex;
    if (!OnGrid(x)) continue;
    const int64_t q = grid.Index(x);
    const float xr = E::ToFloat(GridElement<E>(grid, q));
    if (!(std::fabs(static_cast<double>(xr) - x) <= max_rel * static_cast<double>(x))) continue;  // exact
    index[i] = q;
    lo = std::min(lo, q);
    hi = std::max(hi, q);
  }
  const int64_t origin = lo <= hi ? lo + (hi - lo) / 2 : 0;
  int64_t shift = 0;
  if (!base.empty()) {
    uint64_t votes[2 * kMaxShift + 1] = {};
    for (uint64_t i = 0; i < n; ++i) {
      if (index[i] == kNoIndex) continue;
      const float b = E::ToFloat(LoadBits<E>(base.data(), i));
      if (!OnGrid(b)) continue;
      const int64_t d = index[i] - grid.Index(b);
      if (d >= -kMaxShift && d <= kMaxShift) ++votes[d + kMaxShift];
    }
    // The most frequent difference; ties go to the smaller |d|, then to the negative one.
    for (int64_t d = 1; d <= kMaxShift; ++d)
      for (int64_t c : {-d, d})
        if (votes[c + kMaxShift] > votes[shift + kMaxShift]) shift = c;
  }

  // 2. Symbols and the histogram of their bit widths.
  EnsureSize(&s.log_symbols, n);
  std::span<uint32_t> symbols(s.log_symbols.data(), n);
  uint64_t width_count[33] = {};
  for (uint64_t i = 0; i < n; ++i) {
    const Bits bits = LoadBits<E>(values.data(), i);
    uint32_t sym = 0;
    if (bits == 0) {
      sym = kSymbolZero;
    } else if (index[i] != kNoIndex) {
      const int64_t d = index[i] - Predict<E>(grid, base, i, origin, shift);
      sym = d == 0 ? 0 : (d > -(int64_t{1} << 30) && d < (int64_t{1} << 30) ? Zigzag(d) + 1 : UINT32_MAX);
    } else {
      sym = UINT32_MAX;  // exact
    }
    symbols[i] = sym;
    if (sym != UINT32_MAX) ++width_count[std::bit_width(sym)];
  }

  // 3. The width: symbols wider than b are stored exactly (escaped).
  uint32_t best_bits = 1;
  uint64_t best_cost = UINT64_MAX;
  for (uint32_t b = 1; b <= kMaxLogBits; ++b) {
    uint64_t escaped = 0;
    for (uint32_t w = b + 1; w <= 32; ++w) escaped += width_count[w];
    const uint64_t cost = n * b + escaped * (8 * width + kEscapeBits);
    if (cost < best_cost) best_cost = cost, best_bits = b;
  }
  const uint32_t limit = best_bits >= 32 ? UINT32_MAX : (1u << best_bits) - 1;

  // 4. Reconstruction, the exact list and the achieved error.
  EnsureSize(&s.exact_positions, n);
  EnsureSize(&s.exact_raw, n * width);
  uint64_t exact = 0, quantized = 0, zeros = 0;
  double err2 = 0, ref2 = 0, max_abs = 0, achieved_rel = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const Bits bits = LoadBits<E>(values.data(), i);
    const float x = E::ToFloat(bits);
    uint32_t& sym = symbols[i];
    if (sym == kSymbolZero) {
      ++zeros;
    } else if (sym != UINT32_MAX && sym <= limit) {
      const Bits r = GridElement<E>(grid, index[i]);
      StoreBits<E>(recon.data(), i, r);
      const double e = static_cast<double>(E::ToFloat(r)) - x;
      err2 += e * e;
      max_abs = std::max(max_abs, std::fabs(e));
      achieved_rel = std::max(achieved_rel, std::fabs(e) / x);
      ++quantized;
    } else {
      sym = 0;
      s.exact_positions[exact] = static_cast<uint32_t>(i);
      std::memcpy(s.exact_raw.data() + exact * width, &bits, width);
      ++exact;
    }
    if (std::isfinite(x)) ref2 += static_cast<double>(x) * x;
  }
  BuildExactList(std::span<const uint32_t>(s.exact_positions.data(), exact),
                 ByteSpan(s.exact_raw.data(), exact * width), &s.exact_list);

  // 5. Stream.
  const uint64_t packed_bytes = PackedLogBytes(n, best_bits);
  EnsureSize(&s.packed, packed_bytes);
  std::fill(s.packed.begin(), s.packed.begin() + packed_bytes, std::byte{0});
  PackSymbols(symbols, best_bits, s.packed.data());
  StreamHeader h;
  h.version = kStreamVersionLog;
  h.mode = StreamMode::kLog;
  h.type = type;
  h.bits = static_cast<uint8_t>(best_bits);
  h.flags = base.empty() ? 0 : kFlagDelta;
  h.num_levels = grid.per_octave();
  h.element_count = n;
  h.exact_count = exact;
  h.exact_raw_size = exact == 0 ? 0 : s.exact_list.size();
  ASSIGN_OR_RETURN(ByteSpan main, CompressZstd(s.cctx.get(), zstd_level, ByteSpan(s.packed.data(), packed_bytes),
                                               &s.zstd_main));
  ByteSpan exact_z;
  if (exact > 0) {
    ASSIGN_OR_RETURN(exact_z, CompressZstd(s.cctx.get(), zstd_level, s.exact_list, &s.zstd_exact));
  }
  h.main_size = main.size();
  h.exact_size = exact_z.size();
  chunk.bytes.reserve(StreamHeader::kEncodedSize + kLogParamsSize + main.size() + exact_z.size() + kTrailerSize);
  h.EncodeTo(&chunk.bytes);
  ByteWriter w(&chunk.bytes);
  w.U64(std::bit_cast<uint64_t>(grid.ratio()));
  w.U32(static_cast<uint32_t>(static_cast<int32_t>(origin)));
  w.U32(static_cast<uint32_t>(static_cast<int32_t>(shift)));
  w.Bytes(main);
  w.Bytes(exact_z);
  AppendChecksum(&chunk.bytes);
  if (chunk.bytes.size() >= values.size()) return std::optional<EncodedChunk>();

  chunk.stats.mode = static_cast<uint8_t>(StreamMode::kLog);
  chunk.stats.bits = h.bits;
  chunk.stats.quantized = quantized;
  chunk.stats.exact = exact + zeros;
  chunk.stats.max_abs = max_abs;
  chunk.stats.max_rel = achieved_rel;
  chunk.stats.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  chunk.stats.err2_sum = err2;
  chunk.stats.ref2_sum = ref2;
  return std::optional<EncodedChunk>(std::move(chunk));
}

template <typename E>
Status DecodeTyped(const LogGrid& grid, uint32_t bits, int64_t origin, int64_t shift, ByteSpan packed, ByteSpan base,
                   MutableByteSpan out) {
  using Bits = typename E::Bits;
  const uint64_t n = out.size() / sizeof(Bits);
  SymbolReader reader(packed, bits);
  if (base.empty() && bits <= kMaxTableBits && (uint64_t{1} << bits) <= n) {
    // A key frame predicts every element from the origin, so a symbol alone
    // names the element: decode through a table of all 2^bits of them.
    std::vector<Bits> table(size_t{1} << bits);
    for (uint32_t sym = 0; sym < table.size(); ++sym)
      table[sym] = sym == kSymbolZero ? Bits{0} : GridElement<E>(grid, origin + (sym == 0 ? 0 : Unzigzag(sym - 1)));
    for (uint64_t i = 0; i < n; ++i) StoreBits<E>(out.data(), i, table[reader.Next()]);
    return Status::Ok();
  }
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t sym = reader.Next();
    if (sym == kSymbolZero) {
      StoreBits<E>(out.data(), i, Bits{0});
      continue;
    }
    const int64_t q = Predict<E>(grid, base, i, origin, shift) + (sym == 0 ? 0 : Unzigzag(sym - 1));
    StoreBits<E>(out.data(), i, GridElement<E>(grid, q));
  }
  return Status::Ok();
}

}  // namespace

double LogGrid::RatioFor(double max_rel) { return std::min(2.0, 1.0 + 1.9 * max_rel); }

Result<LogGrid> LogGrid::FromRatio(double ratio) {
  if (!(ratio > 1.0 && ratio <= 2.0))
    return Status::InvalidArgument("log grid: ratio " + std::to_string(ratio) + ", want in (1, 2]");
  LogGrid g;
  g.ratio_ = ratio;
  g.mantissa_.push_back(1.0);
  for (double next = ratio; next < 2.0; next = next * ratio) {
    if (g.mantissa_.size() >= kMaxLogLevels)
      return Status::InvalidArgument("log grid: ratio " + std::to_string(ratio) + " needs over 2^16 levels per octave");
    g.mantissa_.push_back(next);
  }
  g.per_octave_ = static_cast<uint32_t>(g.mantissa_.size());
  g.inv_per_octave_ = 1.0 / static_cast<double>(g.per_octave_);
  for (double m : g.mantissa_) g.mantissa_f32_bits_.push_back(std::bit_cast<uint32_t>(static_cast<float>(m)));
  g.mantissa_.push_back(2.0);
  uint32_t log2_buckets = 1;
  while ((1u << log2_buckets) < 2 * g.per_octave_) ++log2_buckets;
  g.bucket_shift_ = 52 - log2_buckets;
  g.bucket_level_.resize(size_t{1} << log2_buckets);
  uint32_t j = 0;
  for (size_t b = 0; b < g.bucket_level_.size(); ++b) {
    const double lower = 1.0 + std::ldexp(static_cast<double>(b), -static_cast<int>(log2_buckets));  // exact
    while (j + 1 < g.per_octave_ && g.mantissa_[j + 1] <= lower) ++j;
    g.bucket_level_[b] = j;
  }
  return g;
}

int64_t LogGrid::Index(double x) const {
  // x is a positive finite float, so a normal double: split its bits exactly
  // into x = m * 2^e with m in [1, 2).
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const int64_t e = static_cast<int64_t>(bits >> 52) - 1023;
  const uint64_t fraction = bits & ((uint64_t{1} << 52) - 1);
  const double m = std::bit_cast<double>(fraction | (uint64_t{1023} << 52));
  // j = the last level <= m (the bucket's level, or at most one further).
  uint32_t j = bucket_level_[fraction >> bucket_shift_];
  while (j + 1 < per_octave_ && mantissa_[j + 1] <= m) ++j;
  const double below = mantissa_[j];
  const double above = mantissa_[j + 1];  // 2.0 after the last level
  const int64_t q = e * per_octave_ + j;
  return above - m < m - below ? q + 1 : q;  // both differences are exact (operands in [1, 2])
}

double LogGrid::Value(int64_t q) const {
  const int64_t k = per_octave_;
  const int64_t e = q >= 0 ? q / k : -((-q + k - 1) / k);  // floor(q / k)
  const double m = mantissa_[static_cast<size_t>(q - e * k)];
  if (e >= -1022 && e <= 1023) return m * std::bit_cast<double>(static_cast<uint64_t>(e + 1023) << 52);  // exact
  return std::ldexp(m, static_cast<int>(std::clamp<int64_t>(e, -4000, 4000)));  // beyond the float range anyway
}

Result<std::optional<EncodedChunk>> EncodeLogChunk(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                   Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out) {
  switch (type) {
    case ElementType::kF32: return EncodeTyped<F32Elem>(type, values, base, max_rel, s, zstd_level, recon_out);
    case ElementType::kF16: return EncodeTyped<F16Elem>(type, values, base, max_rel, s, zstd_level, recon_out);
    case ElementType::kBF16: return EncodeTyped<BF16Elem>(type, values, base, max_rel, s, zstd_level, recon_out);
  }
  return Status::InvalidArgument("log encode: element type");
}

Status DecodeLogBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                     Scratch::Buffers& s) {
  ByteReader r(body, "lossy log chunk");
  const double ratio = std::bit_cast<double>(r.U64());
  const int64_t origin = static_cast<int32_t>(r.U32());
  const int64_t shift = static_cast<int32_t>(r.U32());
  ByteSpan main = r.Bytes(h.main_size);
  ByteSpan exact_z = r.Bytes(h.exact_size);
  RETURN_IF_ERROR(r.status());
  if (r.remaining() != 0) return Status::Corruption("lossy log chunk: " + std::to_string(r.remaining()) + " trailing bytes");
  const bool delta = (h.flags & kFlagDelta) != 0;
  if (!delta && shift != 0) return Status::Corruption("lossy log chunk: a key frame with a delta shift");
  if (shift < -kMaxShift || shift > kMaxShift)
    return Status::Corruption("lossy log chunk: delta shift " + std::to_string(shift) + ", want |shift| <= 64");
  Result<LogGrid> grid = LogGrid::FromRatio(ratio);
  if (!grid.ok()) return Status::Corruption("lossy log chunk: " + grid.status().message());
  if (grid->per_octave() != h.num_levels)
    return Status::Corruption("lossy log chunk: levels per octave, want=" + std::to_string(grid->per_octave()) +
                              " have=" + std::to_string(h.num_levels));
  const uint64_t packed_bytes = PackedLogBytes(h.element_count, h.bits);
  EnsureSize(&s.packed, packed_bytes);
  RETURN_IF_ERROR(Unzstd(s.dctx.get(), main, s.packed.data(), packed_bytes, "log symbols"));
  ByteSpan packed(s.packed.data(), packed_bytes);
  switch (type) {
    case ElementType::kF32: RETURN_IF_ERROR(DecodeTyped<F32Elem>(*grid, h.bits, origin, shift, packed, base, out)); break;
    case ElementType::kF16: RETURN_IF_ERROR(DecodeTyped<F16Elem>(*grid, h.bits, origin, shift, packed, base, out)); break;
    case ElementType::kBF16: RETURN_IF_ERROR(DecodeTyped<BF16Elem>(*grid, h.bits, origin, shift, packed, base, out)); break;
  }
  return ApplyExactStream(s.dctx.get(), exact_z, h, ElementSize(type), &s.exact_list, out);
}

}  // namespace ckptfs::lossy
