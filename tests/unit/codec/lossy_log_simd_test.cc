// The log mode's vector paths (log_index.h) against the scalar reference:
// the fraction table reproduces LogGrid::Locate for every binary32 fraction,
// whole chunks (key and delta frames, odd lengths, every element class)
// encode to the same bytes, reconstruction and statistics either way, and
// delta frames decode to the same values by the vector and scalar decoders.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/log_index.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/stream.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

// The table's rounded level of fraction f (the formula of log_index.h).
uint32_t TableLevel(const LogFractionTable& t, uint32_t f) {
  const uint32_t entry = t.entry[f >> t.shift];
  return (entry >> 16) + ((f & ((1u << t.shift) - 1)) >= (entry & 0xFFFF) ? 1 : 0);
}

TEST(LossyLogSimd, FractionTableEqualsLocateForEveryFraction) {
  for (double max_rel : {1e-3, 1e-2, 5e-2, 0.5}) {
    Result<LogGrid> grid = LogGrid::FromRatio(LogGrid::RatioFor(max_rel));
    ASSERT_TRUE(grid.ok());
    std::optional<LogFractionTable> t = LogFractionTable::Build(*grid);
    ASSERT_TRUE(t.has_value()) << max_rel;
    const uint32_t k = grid->per_octave();
    ASSERT_EQ(t->level_bits.size(), k + 1);
    // The AVX-512 tables exist for the default grid (K = 37) at least.
    if (max_rel == 1e-2) {
      EXPECT_TRUE(t->has_small);
    }
    for (uint32_t f = 0; f < (1u << 23); ++f) {
      const LogGrid::Point p = grid->Locate(std::bit_cast<float>((127u << 23) | f));
      const uint32_t r = TableLevel(*t, f);
      const uint32_t bucket = f >> t->shift;
      const bool up = (r != t->entry[bucket] >> 16);
      const uint32_t value = up ? t->high_bits[bucket] : t->low_bits[bucket];
      if (static_cast<int64_t>(r) != p.q || t->level_bits[r] != std::bit_cast<uint32_t>(p.value) ||
          value != std::bit_cast<uint32_t>(p.value)) {
        FAIL() << "max_rel " << max_rel << " fraction " << f << " table " << r << " locate " << p.q;
      }
      if (t->has_small) {
        const uint32_t b = f >> 17;
        const bool small_up = (f & ((1u << 17) - 1)) >= t->small_offset[b];
        const uint32_t small_value = small_up ? t->small_high_bits[b] : t->small_low_bits[b];
        if (static_cast<int64_t>(t->small_level[b] + (small_up ? 1 : 0)) != p.q ||
            small_value != std::bit_cast<uint32_t>(p.value)) {
          FAIL() << "max_rel " << max_rel << " fraction " << f << ": the 64-bucket tables miss";
        }
      }
    }
    // Other exponents: q = e K + r and the value's exponent field moves by e.
    std::mt19937 rng(7);
    for (uint32_t field = 1; field <= 252; ++field) {
      for (int s = 0; s < 64; ++s) {
        const uint32_t f = rng() & 0x7FFFFF;
        const LogGrid::Point p = grid->Locate(std::bit_cast<float>((field << 23) | f));
        const int64_t e = static_cast<int64_t>(field) - 127;
        const uint32_t r = TableLevel(*t, f);
        ASSERT_EQ(p.q, e * k + r);
        ASSERT_EQ(std::bit_cast<uint32_t>(p.value), t->level_bits[r] + static_cast<uint32_t>(e << 23));
      }
    }
  }
}

// Everything the log mode distinguishes: zeros, -0, negatives, subnormals,
// values near FLT_MAX (slow lanes), NaN, Inf, and a wide positive range.
std::vector<float> Mixed(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<float> g(-12.0f, 4.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float u = uni(rng);
    v[i] = u < 0.1f    ? 0.0f
           : u < 0.11f ? 1e-42f * (1 + 100 * uni(rng))
           : u < 0.12f ? -g(rng)
           : u < 0.125f ? std::numeric_limits<float>::max() * (0.25f + 0.75f * uni(rng))
           : u < 0.13f ? (u < 0.127f ? NAN : INFINITY)
           : u < 0.135f ? -0.0f
                        : g(rng);
  }
  return v;
}

void ExpectSame(const EncodedChunk& a, const EncodedChunk& b) {
  EXPECT_TRUE(a.bytes == b.bytes);
  EXPECT_TRUE(a.reconstruction == b.reconstruction);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.stats.err2_sum), std::bit_cast<uint64_t>(b.stats.err2_sum));
  EXPECT_EQ(std::bit_cast<uint64_t>(a.stats.ref2_sum), std::bit_cast<uint64_t>(b.stats.ref2_sum));
  EXPECT_EQ(a.stats.max_abs, b.stats.max_abs);
  EXPECT_EQ(a.stats.max_rel, b.stats.max_rel);
  EXPECT_EQ(a.stats.quantized, b.stats.quantized);
  EXPECT_EQ(a.stats.exact, b.stats.exact);
}

// DecodeLogBody on a whole encoded log-mode chunk (header, body, trailer).
std::vector<std::byte> DecodeLog(ElementType type, const std::vector<std::byte>& chunk, ByteSpan base, Scratch& s,
                                 SimdLevel level) {
  if (!s.buffers().dctx) s.buffers().dctx.reset(ZSTD_createDCtx());
  Result<StreamHeader> h = StreamHeader::DecodeFrom(chunk);
  EXPECT_TRUE(h.ok());
  if (!h.ok()) return {};
  std::vector<std::byte> out(h->element_count * ElementSize(type));
  const ByteSpan body =
      ByteSpan(chunk).subspan(h->size, chunk.size() - h->size - kTrailerSize);
  const Status st = DecodeLogBody(type, *h, body, (h->flags & kFlagDelta) != 0 ? base : ByteSpan(), out, s.buffers(),
                                  level);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// A key frame, and delta frames whose base and symbols reach every lane
// class of the vector decode: a base at, below and above the table's
// exponent range, off the grid (zero, negative, NaN, Inf), symbols 0 and
// +0.0, and values that leave the normal range.
// The vector levels this CPU runs (AVX2, and AVX-512 where present).
std::vector<SimdLevel> VectorLevels() {
  std::vector<SimdLevel> levels;
  if (LogSimdAvailable()) levels.push_back(SimdLevel::kAvx2);
  if (CpuHasSimd(SimdLevel::kAvx512) && LogAvx512Available()) levels.push_back(SimdLevel::kAvx512);
  return levels;
}

TEST(LossyLogSimd, FramesDecodeAsTheScalarReference) {
  if (VectorLevels().empty()) GTEST_SKIP() << "no AVX2";
  for (SimdLevel level : VectorLevels()) {
  SCOPED_TRACE("level " + std::to_string(static_cast<int>(level)));
  Scratch vector_scratch, scalar_scratch;
  for (double max_rel : {1e-3, 1e-2, 0.1, 0.5}) {
    for (size_t n : {size_t{4096}, size_t{70001}}) {
      SCOPED_TRACE("max_rel " + std::to_string(max_rel) + " n " + std::to_string(n));
      const std::vector<float> v0 = Mixed(n, static_cast<uint32_t>(n + 1));
      std::vector<float> v1 = v0;
      std::mt19937 rng(5);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t pick = rng() % 64;
        v1[i] = pick == 0   ? Mixed(1, rng())[0]
                : pick == 1 ? v0[i] * 1e30f  // toward the top of the range (or Inf)
                : pick == 2 ? v0[i] * 1e-30f  // toward subnormals
                            : v0[i] * 0.97f;
      }
      const std::vector<std::byte> key = testing::ToElements(ElementType::kF32, v0);
      const std::vector<std::byte> next = testing::ToElements(ElementType::kF32, v1);
      if (!scalar_scratch.buffers().cctx) scalar_scratch.buffers().cctx.reset(ZSTD_createCCtx());
      // The key frame (decoded through its symbol table).
      Result<std::optional<EncodedChunk>> k =
          EncodeLogChunk(ElementType::kF32, key, {}, max_rel, scalar_scratch.buffers(), 1, {}, SimdLevel::kScalar);
      ASSERT_TRUE(k.ok() && k->has_value());
      EXPECT_TRUE(DecodeLog(ElementType::kF32, (*k)->bytes, {}, vector_scratch, level) == (*k)->reconstruction);
      EXPECT_TRUE(DecodeLog(ElementType::kF32, (*k)->bytes, {}, scalar_scratch, SimdLevel::kScalar) ==
                  (*k)->reconstruction);
      Result<std::optional<EncodedChunk>> d =
          EncodeLogChunk(ElementType::kF32, next, key, max_rel, scalar_scratch.buffers(), 1, {}, SimdLevel::kScalar);
      ASSERT_TRUE(d.ok() && d->has_value());
      const EncodedChunk& delta = **d;
      const std::vector<std::byte> scalar = DecodeLog(ElementType::kF32, delta.bytes, key, scalar_scratch, SimdLevel::kScalar);
      const std::vector<std::byte> vector = DecodeLog(ElementType::kF32, delta.bytes, key, vector_scratch, level);
      ASSERT_TRUE(scalar == delta.reconstruction);
      ASSERT_EQ(vector.size(), scalar.size());
      for (size_t i = 0; i < scalar.size(); i += 4)
        ASSERT_EQ(std::memcmp(vector.data() + i, scalar.data() + i, 4), 0) << "element " << i / 4;
    }
  }
  }
}

// The vector delta decode element by element against DecodeLogElement, on
// random symbols of every width (no exact list patches the result): bases
// of every class, large symbols that leave the normal range, origins far
// from the bases' indices.
TEST(LossyLogSimd, DeltaDecodeEqualsDecodeLogElement) {
  if (VectorLevels().empty()) GTEST_SKIP() << "no AVX2";
  for (SimdLevel level : VectorLevels()) {
  std::mt19937_64 rng(11);
  // 3 to 46 levels per octave, and (AVX2 only) 460.
  for (double max_rel : {8e-3, 1e-2, 2e-2, 3e-2, 0.1, 0.5, 1e-3}) {
    Result<LogGrid> grid = LogGrid::FromRatio(LogGrid::RatioFor(max_rel));
    ASSERT_TRUE(grid.ok());
    std::optional<LogFractionTable> table = LogFractionTable::Build(*grid);
    ASSERT_TRUE(table);
    if (level == SimdLevel::kAvx512 && !table->has_small) continue;
    for (uint32_t bits = 1; bits <= 24; ++bits) {
      SCOPED_TRACE("max_rel " + std::to_string(max_rel) + " bits " + std::to_string(bits));
      const size_t n = 1000 + bits;
      const std::vector<std::byte> base = testing::ToElements(ElementType::kF32, Mixed(n, bits));
      std::vector<std::byte> packed((n * bits + 7) / 8 + 8);
      for (std::byte& b : packed) b = std::byte(rng() & 0xff);
      const int64_t origin = static_cast<int64_t>(rng() % 4001) - 2000 + (bits == 24 ? (int64_t{1} << 27) : 0);
      const int64_t shift = static_cast<int64_t>(rng() % (2 * kMaxShift + 1)) - kMaxShift;
      for (bool zero_carry : {false, true}) {
        std::vector<std::byte> out(4 * n);
        if (level == SimdLevel::kAvx512)
          DecodeDeltaF32Avx512(*grid, *table, packed.data(), bits, origin, shift, zero_carry, base.data(), n,
                               out.data());
        else
          DecodeDeltaF32Avx2(*grid, *table, packed.data(), bits, origin, shift, zero_carry, base.data(), n,
                             out.data());
        const uint32_t mask = (1u << bits) - 1;
        for (size_t i = 0; i < n; ++i) {
          uint64_t word;
          std::memcpy(&word, packed.data() + i * bits / 8, 8);
          const uint32_t sym = static_cast<uint32_t>(word >> (i * bits % 8)) & mask;
          const uint32_t want = DecodeLogElement<F32Elem>(*grid, sym, base.data(), i, origin, shift, zero_carry);
          uint32_t got;
          std::memcpy(&got, out.data() + 4 * i, 4);
          ASSERT_EQ(got, want) << "level " << static_cast<int>(level) << " element " << i << " symbol " << sym
                               << " zero_carry " << zero_carry;
        }
      }
    }
  }
  }
}

// The key frame's table decode (out[i] = table[symbol i]) by AVX2 and, where
// the CPU has it, AVX-512, against the symbols read one by one: every width
// the AVX2 path takes, lengths around the group sizes.
TEST(LossyLogSimd, KeyTableDecodeEqualsTheTableLookup) {
  if (!LogSimdAvailable()) GTEST_SKIP() << "no AVX2";
  std::mt19937_64 rng(12);
  for (uint32_t bits = 1; bits <= kMaxAvx2UnpackBits; ++bits) {
    std::vector<uint32_t> table(size_t{1} << bits);
    for (uint32_t& t : table) t = static_cast<uint32_t>(rng());
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{1000} + bits}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " n " + std::to_string(n));
      std::vector<std::byte> packed((n * bits + 7) / 8 + 8);
      for (std::byte& b : packed) b = std::byte(rng() & 0xff);
      const uint32_t mask = (1u << bits) - 1;
      std::vector<uint32_t> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = table[SymbolAt(packed.data(), i, bits, mask)];
      std::vector<uint32_t> got(n);
      DecodeKeyTableF32Avx2(table.data(), packed.data(), bits, n, reinterpret_cast<std::byte*>(got.data()));
      ASSERT_EQ(got, want);
      if (LogAvx512Available()) {
        std::fill(got.begin(), got.end(), 0);
        DecodeKeyTableF32Avx512(table.data(), packed.data(), bits, n, reinterpret_cast<std::byte*>(got.data()));
        ASSERT_EQ(got, want);
      }
    }
  }
}

// The AVX-512 decodes' symbol unpacking, by byte permutes (VBMI) and by
// gathers: each symbol as the scalar rule reads it, for every width.
TEST(LossyLogSimd, SymbolGroupsUnpackAsTheScalarRule) {
  if (!LogAvx512Available()) GTEST_SKIP() << "no AVX-512";
  std::mt19937_64 rng(13);
  for (uint32_t bits = 1; bits <= 24; ++bits) {
    for (uint64_t groups : {uint64_t{1}, uint64_t{3}, uint64_t{70}}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " groups " + std::to_string(groups));
      const uint64_t n = 16 * groups;
      std::vector<std::byte> packed(n * bits / 8 + 8);
      for (std::byte& b : packed) b = std::byte(rng() & 0xff);
      const uint32_t mask = (1u << bits) - 1;
      std::vector<uint32_t> want(n);
      for (uint64_t i = 0; i < n; ++i) want[i] = SymbolAt(packed.data(), i, bits, mask);
      for (bool vbmi : {false, true}) {
        if (vbmi && !LogVbmiAvailable()) continue;
        std::vector<uint32_t> got(n, 0xdeadbeef);
        UnpackSymbolGroupsAvx512(packed.data(), bits, groups, got.data(), vbmi);
        ASSERT_EQ(got, want) << (vbmi ? "permutes" : "gathers");
      }
    }
  }
}

// The candidate masks of steps 1b and 2b: exactly the elements the scalar
// tests let through, for every tail length, with the special indices, sums
// that wrap, and +0.0 / -0.0 bases.
TEST(LossyLogSimd, CandidateMasksMarkExactlyTheScalarCandidates) {
  if (!LogSimdAvailable()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(11);
  const int32_t special[] = {kNoIndex, kZeroIndex, std::numeric_limits<int32_t>::max(), -5, 0, 7};
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{64}, size_t{1003}}) {
    for (int32_t shift : {0, -3, 2}) {
      SCOPED_TRACE("n " + std::to_string(n) + " shift " + std::to_string(shift));
      std::vector<int32_t> index(n), base_index(n);
      std::vector<uint32_t> symbols(n), base_bits(n);
      for (size_t i = 0; i < n; ++i) {
        index[i] = rng() % 4 == 0 ? special[rng() % 6] : static_cast<int32_t>(rng() % 9) - 4;
        // Often exactly the predicted level (in int32 arithmetic, wrapping
        // like the kernel's), sometimes a special index.
        const int32_t predicted_from =
            static_cast<int32_t>(static_cast<uint32_t>(index[i]) - static_cast<uint32_t>(shift));
        base_index[i] = rng() % 3 == 0 ? predicted_from : rng() % 5 == 0 ? special[rng() % 6]
                                                                         : static_cast<int32_t>(rng() % 9) - 4;
        symbols[i] = rng() % 4 == 0 ? rng() : rng() % 3;
        base_bits[i] = rng() % 3 == 0 ? 0u : rng() % 3 == 0 ? 0x80000000u : rng();
      }
      std::vector<uint8_t> moved((n + 7) / 8, 0xEE), carry((n + 7) / 8, 0xEE);
      MovedLevelMasksAvx2(index.data(), base_index.data(), shift, n, moved.data());
      ZeroCarryMasksF32Avx2(symbols.data(), reinterpret_cast<const std::byte*>(base_bits.data()), n, carry.data());
      for (size_t i = 0; i < n; ++i) {
        const int64_t predicted = Predict(base_index[i], 0, shift);
        const bool wraps =
            predicted > std::numeric_limits<int32_t>::max() || predicted < std::numeric_limits<int32_t>::min();
        const bool step_1b = index[i] != kNoIndex && index[i] != kZeroIndex && base_index[i] != kNoIndex &&
                             predicted != index[i] && !wraps;
        const bool step_2b = symbols[i] <= kSymbolZero && base_bits[i] == 0;
        const bool moved_bit = (moved[i / 8] >> (i % 8)) & 1, carry_bit = (carry[i / 8] >> (i % 8)) & 1;
        // (A wrapped sum may be marked: step 1b's own range test drops it.)
        if (!wraps) {
          EXPECT_EQ(moved_bit, step_1b) << i;
        }
        EXPECT_EQ(carry_bit, step_2b) << i;
      }
      for (size_t i = n; i < (n + 7) / 8 * 8; ++i) {
        EXPECT_EQ((moved[i / 8] >> (i % 8)) & 1, 0) << "past the end " << i;
        EXPECT_EQ((carry[i / 8] >> (i % 8)) & 1, 0) << "past the end " << i;
      }
    }
  }
}

TEST(LossyLogSimd, ChunksEncodeAsTheScalarReference) {
  if (!LogSimdAvailable()) GTEST_SKIP() << "no AVX2";
  std::vector<SimdLevel> levels = {SimdLevel::kAvx2};
  if (CpuHasSimd(SimdLevel::kAvx512)) levels.push_back(SimdLevel::kAvx512);
  for (SimdLevel level : levels) {
  Scratch simd_scratch, scalar_scratch;
  for (ElementType type : {ElementType::kF32, ElementType::kF16, ElementType::kBF16}) {
    for (double max_rel : {1e-3, 1e-2, 0.5}) {
      for (size_t n : {size_t{5003}, size_t{70001}}) {
        SCOPED_TRACE("level " + std::to_string(static_cast<int>(level)) + " type " + std::to_string(static_cast<int>(type)) + " max_rel " + std::to_string(max_rel) +
                     " n " + std::to_string(n));
        const std::vector<float> v0 = Mixed(n, static_cast<uint32_t>(n));
        // The next version: most elements decay alike, some move, some change class.
        std::vector<float> v1 = v0;
        std::mt19937 rng(3);
        for (size_t i = 0; i < n; ++i) v1[i] = (rng() % 16 == 0) ? Mixed(1, rng())[0] : v0[i] * 0.97f;
        const std::vector<std::byte> key = testing::ToElements(type, v0), next = testing::ToElements(type, v1);
        auto encode = [&](ByteSpan values, ByteSpan base, bool simd) {
          Scratch& s = simd ? simd_scratch : scalar_scratch;
          if (!s.buffers().cctx) s.buffers().cctx.reset(ZSTD_createCCtx());
          Result<std::optional<EncodedChunk>> c =
              EncodeLogChunk(type, values, base, max_rel, s.buffers(), 1, {}, simd ? level : SimdLevel::kScalar);
          EXPECT_TRUE(c.ok() && c->has_value());
          return c.ok() && c->has_value() ? std::move(**c) : EncodedChunk{};
        };
        const EncodedChunk k_simd = encode(key, {}, true), k_scalar = encode(key, {}, false);
        ExpectSame(k_simd, k_scalar);
        const EncodedChunk d_simd = encode(next, k_scalar.reconstruction, true);
        const EncodedChunk d_scalar = encode(next, k_scalar.reconstruction, false);
        ExpectSame(d_simd, d_scalar);
        // The delta frame decodes to the encoder's reconstruction either way.
        EXPECT_TRUE(DecodeLog(type, d_scalar.bytes, k_scalar.reconstruction, simd_scratch, level) ==
                    d_scalar.reconstruction);
        EXPECT_TRUE(DecodeLog(type, d_scalar.bytes, k_scalar.reconstruction, scalar_scratch, SimdLevel::kScalar) ==
                    d_scalar.reconstruction);
      }
    }
  }
  }
}

}  // namespace
}  // namespace ckptfs::lossy
