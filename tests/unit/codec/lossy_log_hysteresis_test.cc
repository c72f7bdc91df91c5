// Step 1b of the log mode (hysteresis): the AVX2 path against the scalar
// element, bit for bit, on the cases its fast lanes leave to the scalar
// element (levels outside the normal floats, base indices near the int32
// limits, a partial last group) and on ordinary ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/log_index.h"

namespace ckptfs::lossy {
namespace {

// A positive float over the whole binary32 range (subnormals and values
// whose nearby levels are not normal floats included), or a tame one.
float AnyPositive(std::mt19937& rng, bool tame) {
  switch (tame ? 3 : rng() % 4) {
    case 0: return std::bit_cast<float>(static_cast<uint32_t>(rng() % 0x7F7FFFFFu) + 1);
    case 1: return std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, static_cast<int>(rng() % 8) - 150);
    case 2: return std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, 126 + static_cast<int>(rng() % 2));
    default: return 1e-3f * (1.0f + static_cast<float>(rng() % 10000) / 1000.0f);
  }
}

TEST(LossyLogHysteresis, Avx2KeepsTheLevelsTheScalarElementKeeps) {
  if (!LogSimdAvailable()) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(5);
  int wide_cases = 0;  // cases the AVX-512 path ran
  for (double max_rel : {1e-3, 1e-2, 0.2, 1.0}) {
    Result<LogGrid> grid = LogGrid::FromRatio(LogGrid::RatioFor(max_rel));
    ASSERT_TRUE(grid.ok());
    std::optional<LogFractionTable> table = LogFractionTable::Build(*grid);
    if (!table) continue;  // too many levels per octave for the vector passes
    const double bound = std::min(max_rel, 0.5);
    for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{13}, size_t{64}, size_t{4099}}) {
      for (int32_t shift : {0, -2, 3}) {
        SCOPED_TRACE("max_rel " + std::to_string(max_rel) + " n " + std::to_string(n) + " shift " +
                     std::to_string(shift));
        std::vector<float> x(n);
        std::vector<int32_t> index(n), base_index(n);
        std::vector<uint32_t> recon(n);
        // Most groups of 8 are tame (the vector lanes); the others mix in
        // what only the scalar element handles.
        bool tame = true;
        for (size_t i = 0; i < n; ++i) {
          if (i % 8 == 0) tame = rng() % 4 != 0;
          x[i] = AnyPositive(rng, tame);
          const LogGrid::Point p = grid->Locate(x[i]);
          index[i] = static_cast<int32_t>(p.q);
          recon[i] = std::bit_cast<uint32_t>(p.value);
          // Mostly a level or two from the predicted one, which the bound
          // may or may not allow; some special or far base indices.
          const int32_t off = static_cast<int32_t>(rng() % 5) - 2;
          base_index[i] = index[i] - shift + off;
          int which = static_cast<int>(rng() % 16);
          if (tame && (which == 3 || which == 4)) which = 5;
          switch (which) {
            case 0: base_index[i] = kNoIndex; break;
            case 1: index[i] = kZeroIndex; break;
            case 2: index[i] = kNoIndex; break;
            case 3: base_index[i] = std::numeric_limits<int32_t>::max() - 1; break;
            case 4: base_index[i] = std::numeric_limits<int32_t>::min() + 2; break;
            default: break;
          }
        }
        std::vector<uint8_t> masks((n + 7) / 8);
        MovedLevelMasksAvx2(index.data(), base_index.data(), shift, n, masks.data());
        const auto* values = reinterpret_cast<const std::byte*>(x.data());
        std::vector<int32_t> want_index = index, got_index = index;
        std::vector<uint32_t> want_recon = recon, got_recon = recon;
        bool want_changed = false;
        for (size_t i = 0; i < n; ++i)
          if ((masks[i / 8] >> (i % 8)) & 1)
            want_changed |= KeepPredictedLevel<F32Elem>(*grid, values, base_index.data(), 0, shift, bound, i,
                                                        want_index.data(),
                                                        reinterpret_cast<std::byte*>(want_recon.data()));
        const bool got_changed =
            KeepPredictedLevelsF32Avx2(*grid, *table, values, base_index.data(), 0, shift, bound, n, got_index.data(),
                                       reinterpret_cast<std::byte*>(got_recon.data()), masks.data());
        EXPECT_EQ(got_changed, want_changed);
        EXPECT_EQ(got_index, want_index);
        EXPECT_EQ(got_recon, want_recon);
        if (LogAvx512Available() && table->has_small) {
          ++wide_cases;
          std::vector<int32_t> wide_index = index;
          std::vector<uint32_t> wide_recon = recon;
          const bool wide_changed = KeepPredictedLevelsF32Avx512(
              *grid, *table, values, base_index.data(), 0, shift, bound, n, wide_index.data(),
              reinterpret_cast<std::byte*>(wide_recon.data()), masks.data());
          EXPECT_EQ(wide_changed, want_changed);
          EXPECT_EQ(wide_index, want_index);
          EXPECT_EQ(wide_recon, want_recon);
        }
        if (n >= 4096) {
          EXPECT_TRUE(want_changed) << "the test should move some levels";
          EXPECT_NE(want_index, index);
        }
      }
    }
  }
  if (LogAvx512Available()) {
    EXPECT_GT(wide_cases, 0) << "no grid with small tables: the AVX-512 path went untested";
  }
}

}  // namespace
}  // namespace ckptfs::lossy
