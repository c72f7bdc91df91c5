// The CPU kernels against the per-element spec (element_ops.h): the AVX2
// and AVX-512 paths, the scalar paths and the reference functions must
// agree bit for bit (Relevel with QuantizePack too). Also the f16/bf16 conversions and the search/codebook basics.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/tensor/lossy/codebook.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/level_gain.h"
#include "codec/tensor/lossy/search.h"
#include "tests/unit/codec/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

using testing::Dist;

uint32_t SymbolAt(const std::vector<std::byte>& packed, uint32_t bits, uint64_t i) {
  uint64_t word = 0;
  std::memcpy(&word, packed.data() + (i / kPackGroup) * bits, bits);
  return static_cast<uint32_t>((word >> ((i % kPackGroup) * bits)) & ((1u << bits) - 1));
}

template <typename E>
void CheckLevelAgainstSpec(ElementType type, const std::vector<std::byte>& values, const std::vector<std::byte>& base,
                           const QuantizeTable& t, SimdLevel level) {
  using Bits = typename E::Bits;
  const uint64_t n = values.size() / sizeof(Bits);
  std::unique_ptr<LossyKernels> simd = MakeCpuKernels(level), scalar = MakeCpuKernels(false);
  std::vector<float> r(n), r2(n);
  std::vector<double> np(ReduceBlocks(n)), np2(ReduceBlocks(n));
  ASSERT_TRUE(simd->Residual(type, values, base, r, np).ok());
  ASSERT_TRUE(scalar->Residual(type, values, base, r2, np2).ok());
  ASSERT_EQ(std::memcmp(r.data(), r2.data(), n * 4), 0);
  ASSERT_EQ(std::memcmp(np.data(), np2.data(), np.size() * 8), 0);

  std::vector<std::byte> pk(PackedBytes(n, t.bits)), pk2(pk.size()), rc(values.size()), rc2(values.size());
  std::vector<double> ep(ReduceBlocks(n)), ep2(ReduceBlocks(n));
  double mx = 0, mx2 = 0;
  ClassCounts c, c2;
  ASSERT_TRUE(simd->QuantizePack(type, t, values, base, r, pk, rc, ep, &mx, &c).ok());
  ASSERT_TRUE(scalar->QuantizePack(type, t, values, base, r, pk2, rc2, ep2, &mx2, &c2).ok());
  ASSERT_EQ(pk, pk2);
  ASSERT_EQ(rc, rc2);
  ASSERT_EQ(std::memcmp(ep.data(), ep2.data(), ep.size() * 8), 0);
  ASSERT_EQ(std::memcmp(&mx, &mx2, 8), 0);
  ASSERT_EQ(c.pruned, c2.pruned);
  ASSERT_EQ(c.exact, c2.exact);

  // Element by element against the spec, and the partials recomputed in
  // the documented order.
  uint64_t counted[3] = {0, 0, 0};
  for (uint64_t blk = 0; blk < ReduceBlocks(n); ++blk) {
    double lanes[kReduceLanes] = {};
    for (uint64_t i = blk * kReduceBlock; i < std::min<uint64_t>(n, (blk + 1) * kReduceBlock); ++i) {
      Bits x, b = 0, got;
      std::memcpy(&x, values.data() + i * sizeof x, sizeof x);
      if (!base.empty()) std::memcpy(&b, base.data() + i * sizeof b, sizeof b);
      std::memcpy(&got, rc.data() + i * sizeof got, sizeof got);
      ElementResult<E> want = QuantizeElement<E>(t, x, b, !base.empty(), r[i]);
      ASSERT_EQ(got, want.recon) << "element " << i;
      ASSERT_EQ(SymbolAt(pk, t.bits, i), want.symbol) << "element " << i;
      ++counted[want.cls];
      double abs_err;
      lanes[i % kReduceLanes] += SquaredError<E>(x, want.recon, &abs_err);
    }
    for (uint32_t s = kReduceLanes / 2; s != 0; s >>= 1)
      for (uint32_t l = 0; l < s; ++l) lanes[l] = lanes[l] + lanes[l + s];
    ASSERT_EQ(std::memcmp(&lanes[0], &ep[blk], 8), 0) << "block " << blk;
  }
  EXPECT_EQ(counted[kPruned], c.pruned);
  EXPECT_EQ(counted[kQuantized], c.quantized);
  EXPECT_EQ(counted[kExact], c.exact);

  // Dequantize: both paths, and the spec, on the packed symbols.
  std::vector<std::byte> out(values.size()), out2(values.size());
  uint32_t ms = 0, ms2 = 0;
  std::span<const float> levels(t.levels, kMaxLevels);
  ASSERT_TRUE(simd->Dequantize(type, t.bits, levels, pk, base, out, &ms).ok());
  ASSERT_TRUE(scalar->Dequantize(type, t.bits, levels, pk, base, out2, &ms2).ok());
  ASSERT_EQ(out, out2);
  ASSERT_EQ(ms, ms2);
  uint32_t max_sym = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Bits b = 0, got;
    if (!base.empty()) std::memcpy(&b, base.data() + i * sizeof b, sizeof b);
    std::memcpy(&got, out.data() + i * sizeof got, sizeof got);
    uint32_t sym = SymbolAt(pk, t.bits, i);
    max_sym = std::max(max_sym, sym);
    ASSERT_EQ(got, DequantizeElement<E>(t.levels, sym, b, !base.empty())) << "element " << i;
  }
  EXPECT_EQ(ms, max_sym);

  // Relevel with the levels scaled (the encoder's unbiasing gain) and
  // back: what QuantizePack with that table writes, from the symbols the
  // first pass packed; the symbols and counts stay.
  for (double g : {1.07, 0.5}) {
    std::optional<QuantizeTable> scaled = ScaledLevels(t, g);
    if (!scaled) continue;
    SCOPED_TRACE("relevel gain " + std::to_string(g));
    std::vector<std::byte> pk3(pk.size()), rc3(values.size());
    std::vector<double> ep3(ep.size());
    double mx3 = 0;
    ClassCounts c3;
    ASSERT_TRUE(scalar->QuantizePack(type, *scaled, values, base, r, pk3, rc3, ep3, &mx3, &c3).ok());
    std::vector<std::byte> pk4 = pk, rc4 = rc;
    std::vector<double> ep4(ep.size());
    double mx4 = -1;
    ClassCounts c4 = c;
    ASSERT_TRUE(simd->Relevel(type, *scaled, values, base, r, pk4, rc4, ep4, &mx4, &c4).ok());
    ASSERT_EQ(pk4, pk);
    ASSERT_EQ(rc4, rc3);
    ASSERT_EQ(std::memcmp(ep4.data(), ep3.data(), ep.size() * 8), 0);
    ASSERT_EQ(std::memcmp(&mx4, &mx3, 8), 0);
    EXPECT_EQ(c4.exact, c3.exact);
    ASSERT_TRUE(simd->Relevel(type, t, values, base, r, pk4, rc4, ep4, &mx4, &c4).ok());
    ASSERT_EQ(rc4, rc);
    ASSERT_EQ(std::memcmp(ep4.data(), ep.data(), ep.size() * 8), 0);
    ASSERT_EQ(std::memcmp(&mx4, &mx, 8), 0);
  }

  std::vector<uint32_t> pos(c.exact), pos2(c.exact);
  std::vector<std::byte> raw(c.exact * sizeof(Bits)), raw2(raw.size());
  uint64_t k = 0, k2 = 0;
  ASSERT_TRUE(simd->CompactExact(type, t, values, r, pos, raw, &k).ok());
  ASSERT_TRUE(scalar->CompactExact(type, t, values, r, pos2, raw2, &k2).ok());
  EXPECT_EQ(k, c.exact);
  EXPECT_EQ(pos, pos2);
  EXPECT_EQ(raw, raw2);
}

// Every vector level the CPU runs (AVX2, AVX-512) against the scalar path
// and the spec.
template <typename E>
void CheckAgainstSpec(ElementType type, const std::vector<std::byte>& values, const std::vector<std::byte>& base,
                      const QuantizeTable& t) {
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    SCOPED_TRACE(level == SimdLevel::kAvx2 ? "avx2" : "avx512");
    CheckLevelAgainstSpec<E>(type, values, base, t, level);
  }
}

template <typename E>
void RunSpecChecks(ElementType type) {
  std::unique_ptr<LossyKernels> cpu = MakeCpuKernels();
  for (Dist d : {Dist::kNormal, Dist::kHeavyTail, Dist::kNonFinite, Dist::kDenormal}) {
    for (uint64_t n : {1u, 31u, 33u, 4095u, 4097u, 20000u}) {
      for (bool delta : {false, true}) {
        SCOPED_TRACE(testing::DistName(d) + " n=" + std::to_string(n) + " delta=" + std::to_string(delta));
        std::vector<float> v = testing::Generate(d, n, static_cast<uint32_t>(n));
        std::vector<std::byte> values = testing::ToElements(type, v), base;
        if (delta) {
          for (size_t i = 0; i < v.size(); i += 2) v[i] *= 1.01f;
          base = testing::ToElements(type, v);
        }
        std::vector<float> r(n);
        std::vector<double> np(ReduceBlocks(n));
        std::vector<uint32_t> h(kHistogramBins);
        ASSERT_TRUE(cpu->Residual(type, values, base, r, np).ok());
        ASSERT_TRUE(cpu->Histogram(r, h).ok());
        double norm = 0;
        for (double p : np) norm += p;
        for (double rel : {1e-1, 1e-2, 3e-3}) {
          std::optional<SearchResult> found =
              SearchConfig(h, n, static_cast<uint32_t>(sizeof(typename E::Bits)), {rel * rel * norm, INFINITY});
          if (found) CheckAgainstSpec<E>(type, values, base, found->table);
        }
        // A hand-made table whose levels are denser than the histogram bins
        // (forces the binary-search fallback of the lookup).
        QuantizeTable dense;
        dense.bits = 8;
        dense.num_levels = 255;
        dense.prune_below = 0;
        dense.exact_from = kNonFiniteBits;
        for (uint32_t j = 0; j < 255; ++j) dense.levels[j] = -0.01f + 0.02f * static_cast<float>(j) / 254.0f;
        FillBounds(&dense);
        CheckAgainstSpec<E>(type, values, base, dense);
        // Tables on both sides of the vector passes' ways to find a level
        // (counted bounds, register lookups, gathers) and of the
        // dequantizer's symbol widths, spread over the residual.
        float spread = 0;
        for (float x : r)
          if (std::isfinite(x)) spread = std::max(spread, std::fabs(x));
        for (uint32_t levels : {1u, 3u, 12u, 28u, 29u, 100u}) {
          SCOPED_TRACE("levels=" + std::to_string(levels));
          QuantizeTable even;
          even.num_levels = levels;
          even.bits = static_cast<uint32_t>(std::bit_width(levels));
          even.prune_below = 0;
          even.exact_from = kNonFiniteBits;
          for (uint32_t j = 0; j < levels; ++j)
            even.levels[j] = levels == 1 ? 0.0f : spread * (-1.0f + 2.0f * static_cast<float>(j) / (levels - 1));
          FillBounds(&even);
          CheckAgainstSpec<E>(type, values, base, even);
        }
      }
    }
  }
}

TEST(LossyKernelsTest, F32PathsMatchSpec) { RunSpecChecks<F32Elem>(ElementType::kF32); }

// Residuals exactly at a bound, a step either side of it, at the levels,
// at +-0 and at the thresholds: where a lane's level is counted from the
// bounds (few levels) instead of looked up, ties must fall as in the spec.
TEST(LossyKernelsTest, F32TiesAtTheBoundsMatchSpec) {
  auto ties = [](const QuantizeTable& t) {
    std::vector<float> v;
    for (uint32_t j = 0; j < t.num_levels; ++j)
      for (float x : {t.bounds[j], t.levels[j]})
        if (std::isfinite(x))
          for (float y : {x, std::nextafter(x, INFINITY), std::nextafter(x, -INFINITY)}) v.push_back(y);
    for (float x : {0.0f, -0.0f, 0.01f, -0.01f, 100.0f, -100.0f, std::nextafter(100.0f, 0.0f)}) v.push_back(x);
    while (v.size() < 100) v.insert(v.end(), v.begin(), v.begin() + std::min<size_t>(v.size(), 100 - v.size()));
    return testing::ToElements(ElementType::kF32, v);
  };
  for (uint32_t levels : {0u, 1u, 2u, 3u, 5u, 8u, 9u, 12u}) {
    SCOPED_TRACE("levels=" + std::to_string(levels));
    QuantizeTable t;
    t.num_levels = levels;
    t.bits = levels == 0 ? 1 : static_cast<uint32_t>(std::bit_width(levels));
    t.prune_below = FloatBits(0.01f);
    t.exact_from = FloatBits(100.0f);  // above every level: every bound is reached
    for (uint32_t j = 0; j < levels; ++j) t.levels[j] = -2.0f + 0.37f * static_cast<float>(j * j);
    FillBounds(&t);
    CheckAgainstSpec<F32Elem>(ElementType::kF32, ties(t), {}, t);
  }
  // Symmetric, a bound at 0 and nothing pruned: +0 and -0 on the bound.
  for (uint32_t levels : {2u, 4u, 8u}) {
    SCOPED_TRACE("symmetric levels=" + std::to_string(levels));
    QuantizeTable t;
    t.num_levels = levels;
    t.bits = static_cast<uint32_t>(std::bit_width(levels));
    t.prune_below = 0;
    t.exact_from = FloatBits(100.0f);
    for (uint32_t j = 0; j < levels; ++j)
      t.levels[j] = static_cast<float>(2 * static_cast<int>(j) - static_cast<int>(levels) + 1);
    FillBounds(&t);
    ASSERT_EQ(t.bounds[levels / 2 - 1], 0.0f);
    CheckAgainstSpec<F32Elem>(ElementType::kF32, ties(t), {}, t);
  }
}

// Tables whose top levels crowd into one histogram bin (a bin spans up to
// kProbe bounds): the register lookups then form their largest indices
// (the last start plus every probe, the +Inf padding included).
TEST(LossyKernelsTest, CrowdedTopLevelsMatchSpec) {
  for (uint32_t levels : {12u, 16u, 17u, 28u, 32u, 33u}) {
    for (uint32_t crowded : {2u, 3u, 5u}) {
      SCOPED_TRACE("levels=" + std::to_string(levels) + " crowded=" + std::to_string(crowded));
      QuantizeTable t;
      t.num_levels = levels;
      t.bits = static_cast<uint32_t>(std::bit_width(levels));
      t.prune_below = 0;
      t.exact_from = kNonFiniteBits;
      const uint32_t spread = levels - crowded;
      for (uint32_t j = 0; j < spread; ++j) t.levels[j] = -1.0f + 0.05f * static_cast<float>(j);
      // 1.0, 1.0 + 2^-20, ...: one bin (the top 14 bits of the float).
      for (uint32_t j = 0; j < crowded; ++j)
        t.levels[spread + j] = 1.0f + std::ldexp(1.0f, -20) * static_cast<float>(j);
      FillBounds(&t);
      std::vector<float> v;
      for (uint32_t j = 0; j < levels; ++j)
        for (float x : {t.levels[j], t.bounds[j]})
          if (std::isfinite(x)) {
            v.push_back(x);
            v.push_back(std::nextafter(x, INFINITY));
            v.push_back(std::nextafter(x, -INFINITY));
          }
      v.push_back(1.5f);
      v.push_back(-1.5f);
      while (v.size() % 32 != 7) v.push_back(v[v.size() % 17]);
      CheckAgainstSpec<F32Elem>(ElementType::kF32, testing::ToElements(ElementType::kF32, v), {}, t);
    }
  }
}

// Every symbol of every width decodes as the spec says, whatever the
// quantizer would have made (the vector paths read a value per symbol from
// registers or by gather).
TEST(LossyKernelsTest, DequantizeEverySymbolMatchesSpec) {
  std::mt19937 rng(7);
  QuantizeTable t;
  t.num_levels = kMaxLevels;
  for (uint32_t j = 0; j < kMaxLevels; ++j) t.levels[j] = static_cast<float>(j) * 0.5f - 60.0f;
  const std::span<const float> levels(t.levels, kMaxLevels);
  std::unique_ptr<LossyKernels> scalar = MakeCpuKernels(false);
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    for (bool delta : {false, true}) {
      SCOPED_TRACE("bits=" + std::to_string(bits) + " delta=" + std::to_string(delta));
      const uint64_t n = 1000 + bits;
      std::vector<std::byte> packed(PackedBytes(n, bits));
      for (auto& b : packed) b = static_cast<std::byte>(rng());
      std::vector<float> base_values(n);
      for (float& x : base_values) x = static_cast<float>(rng() % 1000) * 0.25f;
      const std::vector<std::byte> base = delta ? testing::ToElements(ElementType::kF32, base_values)
                                                : std::vector<std::byte>();
      std::vector<std::byte> want(n * 4), got(n * 4);
      uint32_t want_max = 0;
      ASSERT_TRUE(scalar->Dequantize(ElementType::kF32, bits, levels, packed, base, want, &want_max).ok());
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t b = 0, w;
        if (delta) std::memcpy(&b, base.data() + 4 * i, 4);
        std::memcpy(&w, want.data() + 4 * i, 4);
        ASSERT_EQ(w, DequantizeElement<F32Elem>(t.levels, SymbolAt(packed, bits, i), b, delta)) << "element " << i;
      }
      for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!CpuHasSimd(level)) continue;
        SCOPED_TRACE(level == SimdLevel::kAvx2 ? "avx2" : "avx512");
        uint32_t got_max = 0;
        std::unique_ptr<LossyKernels> simd = MakeCpuKernels(level);
        ASSERT_TRUE(simd->Dequantize(ElementType::kF32, bits, levels, packed, base, got, &got_max).ok());
        EXPECT_EQ(got, want);
        EXPECT_EQ(got_max, want_max);
      }
    }
  }
}
TEST(LossyKernelsTest, F16PathsMatchSpec) { RunSpecChecks<F16Elem>(ElementType::kF16); }
TEST(LossyKernelsTest, BF16PathsMatchSpec) { RunSpecChecks<BF16Elem>(ElementType::kBF16); }

// Every half bit pattern through the vector conversions (the AVX2 path uses
// the F16C instructions) against the scalar spec: ToFloat via the residual,
// FromFloat via dequantization against levels that reach overflow, ties,
// subnormal results and NaN bases.
TEST(LossyKernelsTest, F16VectorConversionsMatchSpecForEveryHalf) {
  constexpr uint64_t kN = 0x10000;
  std::vector<std::byte> values(kN * 2), reversed(kN * 2);
  for (uint32_t h = 0; h < kN; ++h) {
    const uint16_t v = static_cast<uint16_t>(h), r = static_cast<uint16_t>(kN - 1 - h);
    std::memcpy(values.data() + 2 * h, &v, 2);
    std::memcpy(reversed.data() + 2 * h, &r, 2);
  }
  std::unique_ptr<LossyKernels> simd = MakeCpuKernels(true), scalar = MakeCpuKernels(false);
  for (bool delta : {false, true}) {
    std::vector<std::byte> base = delta ? reversed : std::vector<std::byte>();
    std::vector<float> r(kN), r2(kN);
    std::vector<double> np(ReduceBlocks(kN)), np2(ReduceBlocks(kN));
    ASSERT_TRUE(simd->Residual(ElementType::kF16, values, base, r, np).ok());
    ASSERT_TRUE(scalar->Residual(ElementType::kF16, values, base, r2, np2).ok());
    for (uint64_t i = 0; i < kN; ++i) {
      const float want = delta ? HalfToFloat(static_cast<uint16_t>(i)) - HalfToFloat(static_cast<uint16_t>(kN - 1 - i))
                               : HalfToFloat(static_cast<uint16_t>(i));
      ASSERT_EQ(FloatBits(r[i]), FloatBits(want)) << "half " << i << " delta " << delta;
    }
    ASSERT_EQ(std::memcmp(r.data(), r2.data(), kN * 4), 0);
    ASSERT_EQ(std::memcmp(np.data(), np2.data(), np.size() * 8), 0);
  }
  // 255 ascending levels: magnitudes from below the smallest subnormal half
  // to past the largest finite half, and exact half-ulp ties of small values.
  std::vector<float> mags;
  for (int e = -27; e <= 16; ++e) {
    mags.push_back(std::ldexp(1.0f, e));
    if (e % 2 == 0) mags.push_back(std::ldexp(1.5f, e));
    mags.push_back(std::ldexp(1.0f + 1.0f / 2048, e));  // a tie at the half's precision
  }
  mags.push_back(65504.0f);
  mags.push_back(65519.0f);
  mags.push_back(65520.0f);  // rounds to Inf
  std::sort(mags.begin(), mags.end());
  std::vector<float> levels;
  for (auto it = mags.rbegin(); it != mags.rend(); ++it) levels.push_back(-*it);
  levels.push_back(0.0f);
  for (float m : mags) levels.push_back(m);
  ASSERT_LE(levels.size(), kMaxLevels);
  while (levels.size() < kMaxLevels) levels.push_back(levels.back() * 1.0001f);
  for (uint32_t shift : {0u, 7u, 101u}) {
    std::vector<std::byte> packed(PackedBytes(kN, 8));
    for (uint64_t i = 0; i < kN; ++i) packed[i] = std::byte((i * 13 + shift + i / 255) % 256);  // 0 = the base
    std::vector<std::byte> out(kN * 2), out2(kN * 2);
    uint32_t ms = 0, ms2 = 0;
    ASSERT_TRUE(simd->Dequantize(ElementType::kF16, 8, levels, packed, values, out, &ms).ok());
    ASSERT_TRUE(scalar->Dequantize(ElementType::kF16, 8, levels, packed, values, out2, &ms2).ok());
    for (uint64_t i = 0; i < kN; ++i) {
      uint16_t got, want_base;
      std::memcpy(&got, out.data() + 2 * i, 2);
      std::memcpy(&want_base, values.data() + 2 * i, 2);
      ASSERT_EQ(got, DequantizeElement<F16Elem>(levels.data(), static_cast<uint32_t>(packed[i]), want_base, true))
          << "half " << i << " symbol " << static_cast<int>(packed[i]);
    }
    ASSERT_EQ(out, out2);
    ASSERT_EQ(ms, ms2);
  }
}

TEST(LossyKernelsTest, HalfConversionsRoundTripAndRoundToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << h;
#if defined(__FLT16_MANT_DIG__)
    ASSERT_EQ(f, static_cast<float>(static_cast<_Float16>(f)));
#endif
  }
#if defined(__FLT16_MANT_DIG__)
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f = BitsFloat(bits);
    if (std::isnan(f)) continue;
    _Float16 want = static_cast<_Float16>(f);  // the compiler's IEEE conversion (round to nearest even)
    uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    ASSERT_EQ(FloatToHalf(f), want_bits) << std::hexfloat << f;
  }
#endif
}

TEST(LossyKernelsTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f7fffffu)), 0x7f80);  // overflows to Inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(BitsFloat(0x7f800001u)))));  // signalling NaN stays NaN
  std::mt19937 rng(6);
  for (int i = 0; i < 100000; ++i) {
    float f = BitsFloat(rng());
    if (!std::isfinite(f) || std::fabs(f) > 3.38e38f) continue;  // `up` below would overflow
    float down = BitsFloat(FloatBits(f) & 0xffff0000u);
    float up = BitsFloat((FloatBits(f) & 0xffff0000u) + 0x10000u);
    float got = Bf16ToFloat(FloatToBf16(f));
    double dd = std::fabs(static_cast<double>(f) - down), du = std::fabs(static_cast<double>(up) - f);
    ASSERT_TRUE(got == (dd < du ? down : du < dd ? up : ((FloatBits(down) >> 16) & 1 ? up : down))) << f;
  }
}

TEST(LossyKernelsTest, CodebookFitsKnownClusters) {
  // Three tight clusters and three levels: the fit must find them.
  std::vector<WeightedPoint> pts;
  for (double c : {-1.0, 0.5, 2.0})
    for (int j = -2; j <= 2; ++j) pts.push_back({c + j * 1e-3, 10.0, 5e-4});
  Codebook book = FitCodebook(pts, 3, 20);
  ASSERT_EQ(book.levels.size(), 3u);
  EXPECT_NEAR(book.levels[0], -1.0, 1e-6);
  EXPECT_NEAR(book.levels[1], 0.5, 1e-6);
  EXPECT_NEAR(book.levels[2], 2.0, 1e-6);
  // Each point's elements spread evenly over its 1e-3 wide bin: distance
  // squared plus width^2 / 12 each.
  const double in_bin = 1e-6 / 12;
  EXPECT_NEAR(book.est_error_sq, 3 * 10 * (2 * 1e-6 + 2 * 4e-6 + 5 * in_bin), 1e-9);
  // Fewer points than levels: every point becomes a level.
  Codebook small = FitCodebook(std::span(pts).first(2), 15, 20);
  EXPECT_EQ(small.levels.size(), 2u);
  EXPECT_NEAR(small.est_error_sq, 2 * 10 * in_bin, 1e-12);  // plus the float rounding of the levels
}

TEST(LossyKernelsTest, SearchPrefersPruningForSparseResiduals) {
  // 90% exact zeros (frozen), 10% small changes: the search prunes the zeros.
  std::vector<uint32_t> h(kHistogramBins, 0);
  h[0] = 90000;
  h[FloatBits(1e-3f) >> kHistogramShift] = 5000;
  h[(FloatBits(-1e-3f) >> kHistogramShift)] = 5000;
  std::optional<SearchResult> r = SearchConfig(h, 100000, 4, {1.0, INFINITY});
  ASSERT_TRUE(r.has_value());
  EXPECT_GE(r->table.prune_below, 1u << kHistogramShift);
  EXPECT_LE(r->table.bits, 2u);
  EXPECT_LT(r->est_bytes, 100000 * 0.5 / 8 + 1000);
}

}  // namespace
}  // namespace ckptfs::lossy
