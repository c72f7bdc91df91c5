// Log mode: classify -> grid index -> symbol against the predictor -> pick
// the symbol width -> pack -> exact list -> zstd. See LOSSY.md section 9.
#include "codec/tensor/lossy/log_codec.h"

#include <endian.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/log_index.h"
#include "codec/tensor/lossy/symbol_stream.h"

namespace ckptfs::lossy {
namespace {

// Bytes after the header: the grid ratio (f64), the origin (i32), the delta shift (i32).
constexpr size_t kLogParamsSize = 16;
// Key frames of up to this symbol width decode through a table (at most
// 2^16 entries, and never more entries than elements).
constexpr uint32_t kMaxTableBits = 16;
// Per escaped element the exact list costs its bits plus about 2 bytes of position.
constexpr uint64_t kEscapeBits = 16;
// Below this many elements the vector pass is not worth building its table
// for (unless the scratch holds one already).
constexpr uint64_t kMinSimdElements = 4096;

uint64_t PackedLogBytes(uint64_t n, uint32_t bits) { return (n * bits + 7) / 8; }

// Calls visit(i) for every i < n, or with masks (a byte per group of 8
// elements) for the elements whose bit is set, in ascending order.
template <typename Visit>
void VisitElements(uint64_t n, const uint8_t* masks, Visit&& visit) {
  if (masks == nullptr) {
    for (uint64_t i = 0; i < n; ++i) visit(i);
    return;
  }
  for (uint64_t g = 0; g < (n + 7) / 8; ++g)
    for (uint32_t m = masks[g]; m != 0; m &= m - 1) visit(g * 8 + static_cast<uint64_t>(std::countr_zero(m)));
}

template <typename E>
typename E::Bits GridElement(const LogGrid& grid, int64_t q) {
  return E::FromFloat(grid.FloatValue(q));
}

// Hysteresis never keeps a level further than this from the value, however
// loose the bound: nearest-level rounding keeps every element within 1/3
// on the coarsest grid, and a kept level is a second moment's (an update's
// denominator's) error; at max_rel = 1 a level at 1/1000 of the value, or
// one that underflowed to 0, would pass the bound's check (a step 30 times
// too large, or m / eps).
constexpr double kMaxHysteresisRel = 0.5;

// Step 1b: every quantized element whose predicted level is another than
// its nearest one takes the predicted level when its reconstruction there
// is positive and within min(max_rel, kMaxHysteresisRel) of the value
// (KeepPredictedLevel). Returns whether any element changed (its index and
// reconstruction). With masks (MovedLevelMasksAvx2), only the elements
// whose bit is set are visited: the others are skipped by the element's
// first tests anyway; f32 elements then go through the AVX2 path when
// `table` is the grid's (the AVX-512 one when `avx512` and its small
// tables exist).
template <typename E>
bool KeepPredictedLevels(const LogGrid& grid, const LogFractionTable* table, const std::byte* values,
                         const int32_t* base_index, int64_t origin, int64_t shift, double max_rel, uint64_t n,
                         int32_t* index, std::byte* recon, const uint8_t* masks, bool avx512) {
  const double bound = std::min(max_rel, kMaxHysteresisRel);
  if constexpr (std::is_same_v<E, F32Elem>) {
    if (masks != nullptr && table != nullptr && table->Serves(grid)) {
      if (avx512 && table->has_small)
        return KeepPredictedLevelsF32Avx512(grid, *table, values, base_index, origin, static_cast<int32_t>(shift),
                                            bound, n, index, recon, masks);
      return KeepPredictedLevelsF32Avx2(grid, *table, values, base_index, origin, static_cast<int32_t>(shift), bound,
                                        n, index, recon, masks);
    }
  }
  bool changed = false;
  VisitElements(n, masks, [&](uint64_t i) {
    changed |= KeepPredictedLevel<E>(grid, values, base_index, origin, shift, bound, i, index, recon);
  });
  return changed;
}

// Appends b-bit symbols (b <= 24) to a little-endian bit string (symbol i
// occupies bits [i*b, (i+1)*b)), four bytes
// at a time: `out` needs kPackedSlack bytes past the packed size.
class SymbolWriter {
 public:
  SymbolWriter(std::byte* out, uint32_t bits) : out_(out), bits_(bits) {}
  void Put(uint32_t s) {
    acc_ |= static_cast<uint64_t>(s) << filled_;
    filled_ += bits_;
    if (filled_ >= 32) {
      const uint32_t word = htole32(static_cast<uint32_t>(acc_));
      std::memcpy(out_, &word, 4);
      out_ += 4;
      acc_ >>= 32;
      filled_ -= 32;
    }
  }
  void Finish() {
    for (; filled_ > 0; filled_ = filled_ > 8 ? filled_ - 8 : 0, acc_ >>= 8) *out_++ = std::byte(acc_ & 0xff);
  }

 private:
  std::byte* out_;
  uint32_t bits_;
  uint64_t acc_ = 0;
  uint32_t filled_ = 0;
};

template <typename E>
Result<std::optional<EncodedChunk>> EncodeTyped(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out, SimdLevel max_simd) {
  using Bits = typename E::Bits;
  const size_t width = sizeof(Bits);
  const uint64_t n = values.size() / width;
  Result<LogGrid> grid_or = LogGrid::FromRatio(LogGrid::RatioFor(max_rel));
  if (!grid_or.ok()) return std::optional<EncodedChunk>();  // finer than the grid allows: lossless
  const LogGrid& grid = *grid_or;  // the format's rounding: the base's indices, as the decoder finds them
  Result<LogGrid> code_grid_or = LogGrid::FromRatio(grid.ratio(), LogRounding::kLog);
  if (!code_grid_or.ok()) return code_grid_or.status();
  const LogGrid& code_grid = *code_grid_or;  // the elements coded here: rounded in log
  const bool delta = !base.empty();

  EncodedChunk chunk;
  MutableByteSpan recon = recon_out;
  if (recon.empty()) {
    chunk.reconstruction.resize(values.size());
    recon = chunk.reconstruction;
  }

  // 1. Each element's grid index (or why it has none), its reconstruction,
  //    the key frame's index range (its origin is the middle, so symbols
  //    stay small) and, in a delta frame, the base's indices and the votes
  //    for the shift; then the error sums. The sums assume that no quantized
  //    element is escaped in step 3 or keeps another level in step 1b (else
  //    step 4 redoes them).
  EnsureSize(&s.log_index, n);
  std::span<int32_t> index(s.log_index.data(), n);
  std::span<int32_t> base_index;
  if (delta) {
    EnsureSize(&s.log_base_index, n);
    base_index = std::span<int32_t>(s.log_base_index.data(), n);
  }
  LogIndexSums sums;
  const bool simd = max_simd != SimdLevel::kScalar && LogSimdAvailable();
  const bool simd_index = simd && std::is_same_v<E, F32Elem> && (s.log_table || n >= kMinSimdElements);
  if (simd_index) {
    for (auto [table, g] : {std::pair{&s.log_table, &grid}, std::pair{&s.log_code_table, &code_grid}}) {
      if (*table && (*table)->Serves(*g)) continue;
      std::optional<LogFractionTable> built = LogFractionTable::Build(*g);
      *table = built ? std::make_shared<const LogFractionTable>(std::move(*built)) : nullptr;
    }
  }
  IndexGrids grids{code_grid, grid};
  if (simd_index && s.log_table && s.log_code_table) {  // built above for these grids, or null
    grids.code_table = s.log_code_table.get();
    grids.base_table = s.log_table.get();
  }
  if (grids.code_table != nullptr && grids.code_table->has_small && grids.base_table->has_small &&
      max_simd == SimdLevel::kAvx512 && LogAvx512Available()) {
    IndexPassF32Avx512(grids, values.data(), delta ? base.data() : nullptr, max_rel, n, index.data(),
                       base_index.data(), recon.data(), &sums);
  } else if (grids.code_table != nullptr) {
    IndexPassF32Avx2(grids, values.data(), delta ? base.data() : nullptr, max_rel, n, index.data(),
                     base_index.data(), recon.data(), &sums);
  } else if (delta) {
    for (uint64_t i = 0; i < n; ++i)
      IndexElement<E, true>(grids, values.data(), base.data(), max_rel, i, index.data(), base_index.data(),
                            recon.data(), &sums);
  } else {
    for (uint64_t i = 0; i < n; ++i)
      IndexElement<E, false>(grids, values.data(), base.data(), max_rel, i, index.data(), base_index.data(),
                             recon.data(), &sums);
  }
  const int64_t lo = sums.lo, hi = sums.hi;
  const int64_t origin = lo <= hi ? lo + (hi - lo) / 2 : 0;
  int64_t shift = 0;
  if (delta) {
    uint64_t votes[2 * kMaxShift + 1];
    for (int64_t d = 0; d <= 2 * kMaxShift; ++d)
      votes[d] = sums.votes[0][d] + sums.votes[1][d] + sums.votes[2][d] + sums.votes[3][d];
    // The most frequent difference; ties go to the smaller |d|, then to the negative one.
    for (int64_t d = 1; d <= kMaxShift; ++d)
      for (int64_t c : {-d, d})
        if (votes[c + kMaxShift] > votes[shift + kMaxShift]) shift = c;
  }

  // 1b. Hysteresis (delta frames): an element whose predicted level (its
  //     base's, moved by the shift) still meets the bound keeps that level,
  //     symbol 0, instead of moving to its nearest one. Nearest-level
  //     rounding re-codes every element that crosses a midpoint between two
  //     levels, however little it moved; a second moment drifts by a few
  //     percent per version, element by element, so most of a delta frame's
  //     nonzero symbols were such crossings while the base's level was still
  //     well within the bound. The decoder is unchanged: it never sees why
  //     a symbol is 0. (The error sums are redone in step 4.)
  // (By AVX2 only the elements that step 1b would look at are visited:
  // about a quarter of a second moment one step after its base.)
  const uint8_t* masks = nullptr;
  if (delta && simd) {
    EnsureSize(&s.log_masks, (n + 7) / 8);
    MovedLevelMasksAvx2(index.data(), base_index.data(), static_cast<int32_t>(shift), n, s.log_masks.data());
    masks = s.log_masks.data();
  }
  const bool kept_levels =
      delta && KeepPredictedLevels<E>(grid, s.log_table.get(), values.data(), base_index.data(), origin, shift,
                                      max_rel, n, index.data(), recon.data(), masks,
                                      max_simd == SimdLevel::kAvx512 && LogAvx512Available());

  // 2. Symbols and the histogram of their bit widths.
  EnsureSize(&s.log_symbols, n);
  std::span<uint32_t> symbols(s.log_symbols.data(), n);
  LogWidthCounts widths;
  if (simd) {
    SymbolPassAvx2(index.data(), delta ? base_index.data() : nullptr, origin, shift, n, symbols.data(), &widths);
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t sym = Symbol(index[i], delta ? Predict(base_index[i], origin, shift) : origin);
      symbols[i] = sym;
      widths.Add(i, sym, index[i]);
    }
  }
  // 2b. Zero carry (delta frames): over a +0.0 base element symbols 0 and
  //     1 exchange, so a zero that stays a zero costs symbol 0 (a zero mask
  //     repeated in every version would otherwise cost its entropy each time).
  uint64_t carried = 0, uncarried = 0;  // zeros now symbol 0; values at the origin now symbol 1
  if (delta) {
    // (By AVX2 only the elements over a +0.0 base element are visited.)
    const uint8_t* carry_masks = nullptr;
    if (simd && std::is_same_v<E, F32Elem>) {
      EnsureSize(&s.log_masks, (n + 7) / 8);
      ZeroCarryMasksF32Avx2(symbols.data(), base.data(), n, s.log_masks.data());
      carry_masks = s.log_masks.data();
    }
    VisitElements(n, carry_masks, [&](uint64_t i) {
      const uint32_t sym = symbols[i];
      if (sym > kSymbolZero || LoadLogBits<E>(base.data(), i) != 0) return;
      symbols[i] = sym ^ 1;
      const uint32_t from = std::bit_width(sym), to = std::bit_width(sym ^ 1);
      --widths.counts[i & 3][from];
      ++widths.counts[i & 3][to];
      carried += sym == kSymbolZero ? 1 : 0;
      uncarried += sym == 0 ? 1 : 0;
    });
  }
  const uint64_t far = widths.far;
  const auto& width_counts = widths.counts;
  uint64_t width_count[33] = {};
  for (uint32_t w = 0; w <= 32; ++w)
    width_count[w] = width_counts[0][w] + width_counts[1][w] + width_counts[2][w] + width_counts[3][w];

  // 3. The width: symbols wider than b are stored exactly (escaped). Up to
  //    kMaxRansBits the symbols are entropy-coded (rANS, LOSSY.md 5.7): a
  //    symbol costs about -log2 of its frequency, so a wider b costs only
  //    the rare wide symbols' bits, where an escape costs an element and its
  //    position. Wider, a symbol costs b bits (a zstd frame).
  uint32_t best_bits = 1;
  double best_cost = std::numeric_limits<double>::infinity();
  {
    std::array<uint64_t, (1u << kMaxRansBits) + 1> by_symbol{};  // the last: wider, or no symbol
    {
      // Four tables, elements in turn: a run of equal symbols (most are 0)
      // no longer waits on one counter's previous increment.
      constexpr uint32_t kTop = 1u << kMaxRansBits;
      std::array<std::array<uint32_t, kTop + 1>, 4> counts{};
      uint64_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (uint32_t l = 0; l < 4; ++l) ++counts[l][std::min<uint32_t>(symbols[i + l], kTop)];
      for (; i < n; ++i) ++counts[0][std::min<uint32_t>(symbols[i], kTop)];
      for (uint32_t v = 0; v <= kTop; ++v)
        by_symbol[v] = uint64_t{counts[0][v]} + counts[1][v] + counts[2][v] + counts[3][v];
    }
    for (uint32_t b = 1; b <= kMaxRansBits; ++b) {
      const uint32_t top = (1u << b) - 1;
      uint64_t escaped = by_symbol[1u << kMaxRansBits];
      for (uint32_t v = top + 1; v < (1u << kMaxRansBits); ++v) escaped += by_symbol[v];
      double bits = 0.0;
      auto add = [&](uint64_t count) {
        if (count > 0) bits += static_cast<double>(count) * -std::log2(static_cast<double>(count) / n);
      };
      add(by_symbol[0] + escaped);  // escapes are symbol 0
      for (uint32_t v = 1; v <= top; ++v) add(by_symbol[v]);
      const double cost = bits + static_cast<double>(escaped) * (8 * width + kEscapeBits) + 16.0 * (top + 1);
      if (cost < best_cost) best_cost = cost, best_bits = b;
    }
  }
  for (uint32_t b = kMaxRansBits + 1; b <= kMaxLogBits; ++b) {
    uint64_t escaped = 0;
    for (uint32_t w = b + 1; w <= 32; ++w) escaped += width_count[w];
    const double cost = static_cast<double>(n * b + escaped * (8 * width + kEscapeBits));
    if (cost < best_cost) best_cost = cost, best_bits = b;
  }
  const uint32_t limit = (1u << best_bits) - 1;  // best_bits <= 24
  uint64_t escaped_quantized = far;
  for (uint32_t w = best_bits + 1; w <= 32; ++w) escaped_quantized += width_count[w];  // +0 (width 1) never escapes

  // 4. Pack; escaped symbols become 0 and their elements go to the exact
  //    list with their original bits.
  const uint64_t packed_bytes = PackedLogBytes(n, best_bits);
  EnsureSize(&s.packed, packed_bytes + std::max(kPackedSlack, kPackSimdSlack));
  EnsureSize(&s.exact_positions, n);
  EnsureSize(&s.exact_raw, n * width);
  uint64_t exact = 0, zeros = 0;
  if (simd && best_bits <= kMaxPackSimdBits) {
    exact = ListEscapesAvx2(symbols.data(), n, limit, s.exact_positions.data());
    for (uint64_t k = 0; k < exact; ++k) {
      const uint32_t i = s.exact_positions[k];
      const Bits bits = LoadLogBits<E>(values.data(), i);
      StoreLogBits<E>(recon.data(), i, bits);
      std::memcpy(s.exact_raw.data() + k * width, &bits, width);
    }
    zeros = PackSymbolsAvx2(symbols.data(), n, best_bits, s.packed.data());
  } else {
    SymbolWriter writer(s.packed.data(), best_bits);
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t sym = symbols[i];
      if (sym > limit) {
        const Bits bits = LoadLogBits<E>(values.data(), i);
        StoreLogBits<E>(recon.data(), i, bits);
        s.exact_positions[exact] = static_cast<uint32_t>(i);
        std::memcpy(s.exact_raw.data() + exact * width, &bits, width);
        ++exact;
        sym = 0;
      }
      zeros += sym == kSymbolZero ? 1 : 0;
      writer.Put(sym);
    }
    writer.Finish();
  }
  if (escaped_quantized > 0 || kept_levels) {
    // Escaped quantized elements are exact, so their errors leave the sums
    // (common in delta frames: an element that moved far from its base);
    // kept levels changed their elements' errors (step 1b).
    sums.err2 = sums.max_abs = sums.achieved_rel = 0;
    sums.quantized = 0;
    if (simd && std::is_same_v<E, F32Elem>) {
      EscapedErrorSumsF32Avx2(values.data(), recon.data(), index.data(), symbols.data(), limit, n, &sums);
    } else {
      for (uint64_t i = 0; i < n; ++i)
        AddEscapedErrors<E>(values.data(), recon.data(), index.data(), symbols.data(), limit, i, &sums);
    }
  }
  BuildExactList(std::span<const uint32_t>(s.exact_positions.data(), exact),
                 ByteSpan(s.exact_raw.data(), exact * width), &s.exact_list);

  // 5. Stream.
  StreamHeader h;
  h.mode = StreamMode::kLog;
  h.type = type;
  h.bits = static_cast<uint8_t>(best_bits);
  h.flags = (delta ? kFlagDelta | kFlagZeroCarry : 0) | kFlagCompactHeader;
  h.num_levels = grid.per_octave();
  h.element_count = n;
  h.exact_count = exact;
  h.exact_raw_size = exact == 0 ? 0 : s.exact_list.size();
  ASSIGN_OR_RETURN(SymbolStream coded,
                   CompressSymbols(s, zstd_level, ByteSpan(s.packed.data(), packed_bytes), best_bits, n));
  const ByteSpan main = coded.bytes;
  h.version = StreamHeader::VersionFor(h.mode, coded.rans);
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
  chunk.stats.quantized = sums.quantized;
  chunk.stats.exact = exact + zeros + carried - uncarried;  // packed symbol 1s over zero bases are not zeros
  chunk.stats.max_abs = sums.max_abs;
  chunk.stats.max_rel = sums.achieved_rel;
  chunk.stats.rel_l2 = sums.ref2 > 0 ? std::sqrt(sums.err2 / sums.ref2) : 0.0;
  chunk.stats.err2_sum = sums.err2;
  chunk.stats.ref2_sum = sums.ref2;
  return std::optional<EncodedChunk>(std::move(chunk));
}

// `packed` has kPackedSlack readable bytes past its end. With avx512 an
// f32 key frame's table decode runs by AVX-512 (with avx2 by AVX2, for
// symbols up to kMaxAvx2UnpackBits), and with a vector_table
// (see DecodeDeltaF32Avx2's requirements) an f32 delta frame by AVX-512
// (its small tables) or AVX2.
// Decodes the elements of a log stream slice by slice: [first, first +
// count) of `out` from the packed symbols and, for a delta frame, the base.
// What depends on the whole chunk (the key-frame symbol table, the path)
// is decided once.
template <typename E>
class LogSliceDecoder {
 public:
  using Bits = typename E::Bits;
  // `sliced_base`: the base comes with each slice (Slice's `base_slice`),
  // `base` is empty.
  LogSliceDecoder(const LogGrid& grid, uint32_t bits, int64_t origin, int64_t shift, bool zero_carry, ByteSpan packed,
                  ByteSpan base, bool sliced_base, MutableByteSpan out, bool avx512, bool avx2,
                  const LogFractionTable* vector_table)
      : grid_(grid), bits_(bits), mask_((1u << bits) - 1), origin_(origin), shift_(shift), zero_carry_(zero_carry),
        packed_(packed),
        base_(base), out_(out), avx512_(avx512), avx2_(avx2), vector_table_(vector_table) {
    const uint64_t n = out.size() / sizeof(Bits);
    if (base.empty() && !sliced_base && bits <= kMaxTableBits && (uint64_t{1} << bits) <= n) {
      // A key frame predicts every element from the origin, so a symbol alone
      // names the element: decode through a table of all 2^bits of them.
      table_.resize(size_t{1} << bits);
      for (uint32_t sym = 0; sym < table_.size(); ++sym)
        table_[sym] = sym == kSymbolZero ? Bits{0} : GridElement<E>(grid, origin + (sym == 0 ? 0 : Unzigzag(sym - 1)));
    }
  }

  // REQUIRES: first is a multiple of 8 (the slice's symbols start on a byte).
  // `base_slice`: the base's elements [first, first + n), when it comes in
  // slices.
  Status Slice(uint64_t first, uint64_t n, const std::byte* base_slice = nullptr) {
    const std::byte* p = packed_.data() + first * bits_ / 8;
    std::byte* out = out_.data() + first * sizeof(Bits);
    if (!table_.empty()) {
      if constexpr (std::is_same_v<E, F32Elem>) {
        if (avx512_) {
          DecodeKeyTableF32Avx512(table_.data(), p, bits_, n, out);
          return Status::Ok();
        }
        if (avx2_ && bits_ <= kMaxAvx2UnpackBits) {
          DecodeKeyTableF32Avx2(table_.data(), p, bits_, n, out);
          return Status::Ok();
        }
      }
      for (uint64_t i = 0; i < n; ++i) StoreLogBits<E>(out, i, table_[SymbolAt(p, i, bits_, mask_)]);
      return Status::Ok();
    }
    const std::byte* b = base_slice != nullptr ? base_slice
                         : base_.empty()         ? nullptr
                                                 : base_.data() + first * sizeof(Bits);
    if constexpr (std::is_same_v<E, F32Elem>) {
      if (vector_table_ != nullptr && b != nullptr) {
        if (avx512_ && vector_table_->has_small)
          DecodeDeltaF32Avx512(grid_, *vector_table_, p, bits_, origin_, shift_, zero_carry_, b, n, out);
        else
          DecodeDeltaF32Avx2(grid_, *vector_table_, p, bits_, origin_, shift_, zero_carry_, b, n, out);
        return Status::Ok();
      }
    }
    for (uint64_t i = 0; i < n; ++i)
      StoreLogBits<E>(out, i,
                      DecodeLogElement<E>(grid_, SymbolAt(p, i, bits_, mask_), b, i, origin_, shift_, zero_carry_));
    return Status::Ok();
  }

 private:
  const LogGrid& grid_;
  uint32_t bits_, mask_;
  int64_t origin_, shift_;
  bool zero_carry_;
  ByteSpan packed_, base_;
  MutableByteSpan out_;
  bool avx512_, avx2_;
  const LogFractionTable* vector_table_;
  std::vector<Bits> table_;
};

}  // namespace

Result<std::optional<EncodedChunk>> EncodeLogChunk(ElementType type, ByteSpan values, ByteSpan base, double max_rel,
                                                   Scratch::Buffers& s, int zstd_level, MutableByteSpan recon_out,
                                                   SimdLevel max_simd) {
  switch (type) {
    case ElementType::kF32: return EncodeTyped<F32Elem>(type, values, base, max_rel, s, zstd_level, recon_out, max_simd);
    case ElementType::kF16: return EncodeTyped<F16Elem>(type, values, base, max_rel, s, zstd_level, recon_out, max_simd);
    case ElementType::kBF16: return EncodeTyped<BF16Elem>(type, values, base, max_rel, s, zstd_level, recon_out, max_simd);
  }
  return Status::InvalidArgument("log encode: element type");
}

Status DecodeLogBody(ElementType type, const StreamHeader& h, ByteSpan body, ByteSpan base, MutableByteSpan out,
                     Scratch::Buffers& s, SimdLevel max_simd, Checksum64Stream* hash, const BaseSlices* base_slices,
                     const SliceFinish* finish) {
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
  if (!delta) base_slices = nullptr;
  if (base_slices != nullptr && (type != ElementType::kF32 || !base.empty() || base_slices->elements() != h.element_count))
    return Status::InvalidArgument("lossy log chunk: a sliced base of f32 elements as many as the chunk's, alone");
  if (shift < -kMaxShift || shift > kMaxShift)
    return Status::Corruption("lossy log chunk: delta shift " + std::to_string(shift) + ", want |shift| <= 64");
  Result<LogGrid> grid = LogGrid::FromRatio(ratio);
  if (!grid.ok()) return Status::Corruption("lossy log chunk: " + grid.status().message());
  if (grid->per_octave() != h.num_levels)
    return Status::Corruption("lossy log chunk: levels per octave, want=" + std::to_string(grid->per_octave()) +
                              " have=" + std::to_string(h.num_levels));
  const uint64_t packed_bytes = PackedLogBytes(h.element_count, h.bits);
  EnsureSize(&s.packed, packed_bytes + kPackedSlack);
  RETURN_IF_ERROR(DecompressSymbols(s, h.SymbolsAreRans(), main, h.bits, h.element_count,
                                    MutableByteSpan(s.packed.data(), packed_bytes), "log symbols"));
  std::fill_n(s.packed.begin() + static_cast<ptrdiff_t>(packed_bytes), kPackedSlack, std::byte{0});
  ByteSpan packed(s.packed.data(), packed_bytes);
  // The vector delta decode (AVX-512 when the grid has under 64 levels per
  // octave, else AVX2): f32, an origin whose indices fit 32-bit lanes, and
  // enough elements to pay for the table (unless the scratch holds it).
  const LogFractionTable* vector_table = nullptr;
  const uint64_t n = h.element_count;
  const bool avx512 = max_simd == SimdLevel::kAvx512 && LogAvx512Available();
  const bool avx2 = max_simd >= SimdLevel::kAvx2 && LogSimdAvailable();
  if (type == ElementType::kF32 && delta && avx2 && origin > -kMaxVectorOrigin && origin < kMaxVectorOrigin) {
    if ((!s.log_table || !s.log_table->Serves(*grid)) && n >= kMinSimdElements) {
      std::optional<LogFractionTable> table = LogFractionTable::Build(*grid);
      s.log_table = table ? std::make_shared<const LogFractionTable>(std::move(*table)) : nullptr;
    }
    if (s.log_table && s.log_table->Serves(*grid)) vector_table = s.log_table.get();
  }
  ASSIGN_OR_RETURN(ExactPatcher exact, ExactPatcher::Open(s.dctx.get(), exact_z, h, ElementSize(type), &s.exact_list));
  auto run = [&]<typename E>(bool vector_ok) {
    LogSliceDecoder<E> decoder(*grid, h.bits, origin, shift, (h.flags & kFlagZeroCarry) != 0, packed, base,
                               base_slices != nullptr, out, vector_ok && avx512, vector_ok && avx2,
                               vector_ok ? vector_table : nullptr);
    // A sliced base is made a slice at a time, in cache, just before its slice.
    if (base_slices != nullptr) EnsureSize(&s.base_slice, kDecodeSliceElements * sizeof(typename E::Bits));
    return DecodeInSlices(
        n, sizeof(typename E::Bits), exact, hash, out,
        [&](uint64_t first, uint64_t count) {
          if (base_slices == nullptr) return decoder.Slice(first, count);
          base_slices->Fill(first, count, s.base_slice.data());
          return decoder.Slice(first, count, s.base_slice.data());
        },
        /*sliced=*/base_slices != nullptr, finish);
  };
  switch (type) {
    case ElementType::kF32: return run.template operator()<F32Elem>(true);
    case ElementType::kF16: return run.template operator()<F16Elem>(false);
    case ElementType::kBF16: return run.template operator()<BF16Elem>(false);
  }
  return Status::Internal("log decode: element type");
}

}  // namespace ckptfs::lossy
