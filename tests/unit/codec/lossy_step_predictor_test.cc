// The step predictor's arithmetic (codec/tensor/lossy/step_predictor.h,
// step_kernels.h; FORMAT.md "Step prediction"): the fit recovers its
// coefficients, bad inputs fall back, and the vector kernels equal the
// portable code bit for bit (predictions, bf16 rounding, error sums). The
// predicted chunks in blobs: container_step_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/step_predictor.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

TEST(StepPredictor, FitRecoversTheCoefficientsAndPredictsBitForBit) {
  constexpr size_t kN = 4096;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> wb(kN), m(kN), v(kN), mb(kN), vb(kN), w(kN);
  for (size_t i = 0; i < kN; ++i) {
    wb[i] = 0.05f * normal(rng);
    m[i] = 1e-3f * normal(rng);
    v[i] = 1e-6f * (1.0f + std::fabs(normal(rng)));
    mb[i] = 1e-3f * normal(rng);
    vb[i] = 1e-6f * (1.0f + std::fabs(normal(rng)));
  }
  std::vector<std::byte> wb_b = F32Bytes(wb), m_b = F32Bytes(m), v_b = F32Bytes(v), mb_b = F32Bytes(mb),
                         vb_b = F32Bytes(vb);
  lossy::StepSources s{lossy::ElementType::kF32, wb_b, lossy::ElementType::kF32, m_b, v_b, mb_b, vb_b};
  ASSERT_TRUE(lossy::CheckStepSources(s).ok());
  for (size_t i = 0; i < kN; ++i) {
    const double u = m[i] / (std::sqrt(static_cast<double>(v[i])) + 1e-8);
    const double ub = mb[i] / (std::sqrt(static_cast<double>(vb[i])) + 1e-8);
    w[i] = static_cast<float>(wb[i] - 2e-3 * u - 1e-3 * ub);
  }
  std::vector<std::byte> w_b = F32Bytes(w);
  std::vector<double> steps(2 * kN);
  // Steps in binary64 (the weights above were made so) and in binary32
  // (within its rounding of u: the same fit, predictions within 1e-6).
  std::vector<std::byte> by_precision[2];
  for (bool f32 : {false, true}) {
    SCOPED_TRACE(f32 ? "binary32 steps" : "binary64 steps");
    std::vector<std::byte> fitted(w_b.size());
    std::optional<lossy::StepPredictor> fit = lossy::FitAndPredict(w_b, s, 1e-8, f32, steps.data(), fitted);
    ASSERT_TRUE(fit.has_value());
    EXPECT_EQ(fit->f32_steps, f32);
    EXPECT_NEAR(fit->step, -2e-3, 1e-6);
    EXPECT_NEAR(fit->base_step, -1e-3, 1e-6);
    EXPECT_GT(std::fabs(lossy::StepCorrelation(w_b, s, 1e-8, 512)), 0.8);

    std::vector<std::byte> p1(w_b.size()), p2(w_b.size());
    lossy::PredictWeights(*fit, s, p1);
    lossy::PredictWeights(*fit, s, p2);
    EXPECT_EQ(p1, p2);
    EXPECT_EQ(p1, fitted);
    for (size_t i = 0; i < kN; ++i) EXPECT_NEAR(F32At(p1, i), w[i], 1e-6f) << i;
    by_precision[f32] = p1;

    // Without the base step the fit takes u alone.
    lossy::StepSources no_base = s;
    no_base.m_base = no_base.v_base = ByteSpan();
    ASSERT_TRUE(lossy::CheckStepSources(no_base).ok());
    fit = lossy::FitAndPredict(w_b, no_base, 1e-8, f32, steps.data(), fitted);
    ASSERT_TRUE(fit.has_value());
    EXPECT_EQ(fit->base_step, 0.0);
  }
  // The flag is no dead letter: binary32 steps round some predictions otherwise.
  EXPECT_NE(by_precision[0], by_precision[1]);
}

TEST(StepPredictor, BadInputsFallBackAndMismatchedSizesAreRejected) {
  // v < 0 or NaN, m NaN: u = 0 (the base-step term still counts, so this is
  // told apart from the fallback below); a prediction that is not finite as
  // an f32 keeps w_base.
  std::vector<float> wb{1.0f, 2.0f, 3.0f, 4.0f}, m{1.0f, NAN, 1.0f, 1e30f}, v{-1.0f, 1.0f, NAN, 1e-40f};
  std::vector<float> mb{1.0f, 1.0f, 1.0f, 0.0f}, vb{1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<std::byte> wb_b = F32Bytes(wb), m_b = F32Bytes(m), v_b = F32Bytes(v), mb_b = F32Bytes(mb),
                         vb_b = F32Bytes(vb);
  lossy::StepSources s{lossy::ElementType::kF32, wb_b, lossy::ElementType::kF32, m_b, v_b, mb_b, vb_b};
  ASSERT_TRUE(lossy::CheckStepSources(s).ok());
  for (bool f32 : {false, true}) {
    SCOPED_TRACE(f32 ? "binary32 steps" : "binary64 steps");
    lossy::StepPredictor p{1.0, 1e30, 0.5, 1e-8, f32};
    std::vector<std::byte> out(wb_b.size()), portable(wb_b.size());
    lossy::PredictWeights(p, s, out);
    lossy::PredictWeightsPortable(p, s, portable);
    EXPECT_EQ(out, portable);
    auto with_base_step = [f32](double w) {  // u = 0: w + 0.5 * 1 / (sqrt(1) + eps)
      if (f32) {  // everything in binary32
        float q = 1.0f * static_cast<float>(w);
        q += 1e30f * 0.0f;
        q += 0.5f * (1.0f / (std::sqrt(1.0f) + static_cast<float>(1e-8)));
        return q;
      }
      double q = w;
      q += 1e30 * 0.0;
      q += 0.5 * (1.0 / (std::sqrt(1.0) + 1e-8));
      return static_cast<float>(q);
    };
    EXPECT_EQ(F32At(out, 0), with_base_step(1.0));  // v < 0
    EXPECT_EQ(F32At(out, 1), with_base_step(2.0));  // m NaN
    EXPECT_EQ(F32At(out, 2), with_base_step(3.0));  // v NaN
    EXPECT_EQ(F32At(out, 3), 4.0f);                 // p overflows f32: w_base
  }

  lossy::StepSources bad = s;
  bad.m = ByteSpan(m_b).first(8);
  EXPECT_FALSE(lossy::CheckStepSources(bad).ok());
  bad = s;
  bad.v_base = ByteSpan();  // v_base missing while v and m_base are present
  EXPECT_FALSE(lossy::CheckStepSources(bad).ok());
}

// Raw element bits of `type`: mostly normal values, with the specials the
// predictor must treat alike in every path (NaN, +-Inf, negative and
// subnormal v, zeros, values whose prediction overflows the type).
std::vector<std::byte> StepTestBits(lossy::ElementType type, size_t n, float sigma, bool positive, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::uniform_int_distribution<int> special(0, 63);
  const size_t size = lossy::ElementSize(type);
  std::vector<std::byte> out(n * size);
  for (size_t i = 0; i < n; ++i) {
    float x = positive ? std::fabs(normal(rng)) : normal(rng);
    switch (special(rng)) {
      case 0: x = NAN; break;
      case 1: x = INFINITY; break;
      case 2: x = -INFINITY; break;
      case 3: x = -std::fabs(x); break;
      case 4: x = 1e-41f; break;
      case 5: x = 0.0f; break;
      case 6: x = -0.0f; break;
      case 7: x = 3e38f; break;
      default: break;
    }
    if (type == lossy::ElementType::kF32) {
      const uint32_t bits = std::bit_cast<uint32_t>(x);
      std::memcpy(out.data() + 4 * i, &bits, 4);
    } else {
      const uint16_t bits = type == lossy::ElementType::kF16 ? lossy::FloatToHalf(x) : lossy::FloatToBf16(x);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

// The vector kernels (AVX2 where the CPU has it) and the portable code give
// the same predictions and fitted coefficients bit for bit: every weight
// and state type, lengths that are no multiple of the vector or block
// width, with and without v and the base step, on values with specials.
TEST(StepPredictor, VectorKernelsMatchThePortableCodeBitForBit) {
  using lossy::ElementType;
  const ElementType types[] = {ElementType::kF32, ElementType::kF16, ElementType::kBF16};
  uint32_t seed = 10;
  for (ElementType wt : types) {
    for (ElementType st : types) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{259}, size_t{1031}}) {
        for (int shape = 0; shape < 4; ++shape) {
          const bool has_v = shape & 1, has_base = shape & 2;
          const std::vector<std::byte> wb = StepTestBits(wt, n, 0.05f, false, ++seed);
          const std::vector<std::byte> w = StepTestBits(wt, n, 0.05f, false, ++seed);
          const std::vector<std::byte> m = StepTestBits(st, n, 1e-3f, false, ++seed);
          const std::vector<std::byte> v = StepTestBits(st, n, 1e-6f, true, ++seed);
          const std::vector<std::byte> mb = StepTestBits(st, n, 1e-3f, false, ++seed);
          const std::vector<std::byte> vb = StepTestBits(st, n, 1e-6f, true, ++seed);
          lossy::StepSources s{wt, wb, st, m, has_v ? ByteSpan(v) : ByteSpan(),
                               has_base ? ByteSpan(mb) : ByteSpan(), has_base && has_v ? ByteSpan(vb) : ByteSpan()};
          ASSERT_TRUE(lossy::CheckStepSources(s).ok());
          const std::string where = fmt::format("weights {} state {} n {} v {} base {}", static_cast<int>(wt),
                                                static_cast<int>(st), n, has_v, has_base);
          // Fitted and predicted: the same coefficients and bits with either
          // kernels, and the same prediction as PredictWeights computes
          // from the coefficients (without the base's moments when the fit
          // left their term out): what a decoder reads.
          // The scale fit of a first moment against its base, by either kernels.
          const std::optional<double> scale = lossy::FitScale(wt, w, wb);
          const std::optional<double> portable_scale = lossy::FitScalePortable(wt, w, wb);
          ASSERT_EQ(scale.has_value(), portable_scale.has_value()) << where;
          if (scale) {
            EXPECT_EQ(std::bit_cast<uint64_t>(*scale), std::bit_cast<uint64_t>(*portable_scale)) << where;
          }
          for (bool f32 : {false, true}) {
          SCOPED_TRACE(f32 ? "binary32 steps" : "binary64 steps");
          std::vector<double> steps(2 * n);
          std::vector<std::byte> joint(wb.size()), portable_joint(wb.size()), apart(wb.size());
          const std::optional<lossy::StepPredictor> fit = lossy::FitAndPredict(w, s, 1e-8, f32, steps.data(), joint);
          const std::optional<lossy::StepPredictor> portable_fit =
              lossy::FitAndPredictPortable(w, s, 1e-8, f32, steps.data(), portable_joint);
          ASSERT_EQ(fit.has_value(), portable_fit.has_value()) << where;
          if (fit) {
            EXPECT_EQ(std::bit_cast<uint64_t>(fit->step), std::bit_cast<uint64_t>(portable_fit->step)) << where;
            EXPECT_EQ(std::bit_cast<uint64_t>(fit->base_step), std::bit_cast<uint64_t>(portable_fit->base_step))
                << where;
            EXPECT_EQ(joint, portable_joint) << where;
            lossy::StepSources used = s;
            if (portable_fit->base_step == 0.0) used.m_base = used.v_base = ByteSpan();
            lossy::PredictWeightsPortable(*portable_fit, used, apart);
            EXPECT_EQ(joint, apart) << where;
          }
          // Coefficients that overflow some predictions, and a scale alone.
          for (const lossy::StepPredictor& p : {lossy::StepPredictor{1.0, -2e-3, -1e-3, 1e-8, f32},
                                                lossy::StepPredictor{0.9, 1e35, 0.5, 1e-8, f32},
                                                lossy::StepPredictor{1.0, 0.0, 0.0, 1e-8, f32}}) {
            std::vector<std::byte> out(wb.size()), portable(wb.size());
            lossy::PredictWeights(p, s, out);
            lossy::PredictWeightsPortable(p, s, portable);
            EXPECT_EQ(out, portable) << where << " step " << p.step;
          }
          }
        }
      }
    }
  }
  // Without a first moment: the scale alone.
  const std::vector<std::byte> wb = StepTestBits(ElementType::kF32, 999, 0.05f, false, 99);
  lossy::StepSources scale_only{ElementType::kF32, wb, ElementType::kF32, {}, {}, {}, {}};
  std::vector<std::byte> out(wb.size()), portable(wb.size());
  lossy::PredictWeights(lossy::StepPredictor{0.97, 0.0, 0.0, 1e-8}, scale_only, out);
  lossy::PredictWeightsPortable(lossy::StepPredictor{0.97, 0.0, 0.0, 1e-8}, scale_only, portable);
  EXPECT_EQ(out, portable);
}

// bf16 weights: the vector kernel's rounding to bf16 against the portable
// code's on predictions made to land on what random values never hit:
// exact ties (an even and an odd last bit), the neighbours of a tie, values
// that round to an infinity, and weights that are not finite. With weights
// 0, no v and coefficients (1, 1, 0) a prediction is the first moment's
// value itself.
TEST(StepPredictor, Bf16RoundingOfTheVectorKernelMatchesThePortableCode) {
  using lossy::ElementType;
  const uint32_t cases[] = {0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F818001u, 0xBF818000u,
                            0x7F7FFFFFu, 0xFF7F8000u, 0x7F7F7FFFu, 0x00018000u, 0x3DCCCCCDu};
  const size_t n = 1031;
  std::mt19937 rng(77);
  std::vector<std::byte> wb(2 * n), m(4 * n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = cases[rng() % std::size(cases)];
    std::memcpy(m.data() + 4 * i, &bits, 4);
    const uint16_t w = (rng() % 16 == 0) ? uint16_t{0x7FC0} : (rng() % 16 == 0) ? uint16_t{0xFF80} : uint16_t{0};
    std::memcpy(wb.data() + 2 * i, &w, 2);
  }
  const lossy::StepSources s{ElementType::kBF16, wb, ElementType::kF32, m, {}, {}, {}};
  ASSERT_TRUE(lossy::CheckStepSources(s).ok());
  std::vector<std::byte> out(wb.size()), portable(wb.size());
  const lossy::StepPredictor unit{1.0, 1.0, 0.0, 1e-8};
  lossy::PredictWeights(unit, s, out);
  lossy::PredictWeightsPortable(unit, s, portable);
  EXPECT_EQ(out, portable);
  // The cases did what they are meant to: a tie with an odd last bit
  // rounds up, one with an even last bit stays, a value past the largest
  // bf16 keeps the weight.
  size_t up = 0, even = 0, kept = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t mi;
    uint16_t wi, pi;
    std::memcpy(&mi, m.data() + 4 * i, 4);
    std::memcpy(&wi, wb.data() + 2 * i, 2);
    std::memcpy(&pi, portable.data() + 2 * i, 2);
    if (wi != 0) continue;
    up += mi == 0x3F818000u && pi == 0x3F82;
    even += mi == 0x3F808000u && pi == 0x3F80;
    kept += mi == 0x7F7FFFFFu && pi == 0;
  }
  EXPECT_GT(up, 0u);
  EXPECT_GT(even, 0u);
  EXPECT_GT(kept, 0u);
}

// The error sums that weigh a prediction: the vector kernel adds the same
// lanes in the same order as the portable code (same bits), specials and
// lengths that are no multiple of 4 included.
TEST(StepPredictor, ErrorSumsOfTheVectorKernelMatchThePortableCode) {
  uint32_t seed = 500;
  for (lossy::ElementType type : {lossy::ElementType::kF32, lossy::ElementType::kBF16, lossy::ElementType::kF16}) {
    const DType dtype = type == lossy::ElementType::kF32   ? DType::kF32
                        : type == lossy::ElementType::kF16 ? DType::kF16
                                                           : DType::kBF16;
    for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{6}, size_t{257}, size_t{4099}}) {
      const std::vector<std::byte> a = StepTestBits(type, n, 0.05f, false, ++seed);
      const std::vector<std::byte> b = StepTestBits(type, n, 0.05f, false, ++seed);
      const ErrorSums fast = MeasureError(dtype, a, b), portable = MeasureErrorPortable(dtype, a, b);
      // Two reconstructions in one pass: each as its own call.
      const auto [pair_b, pair_a] = MeasureErrorPair(dtype, a, b, a);
      const ErrorSums self = MeasureErrorPortable(dtype, a, a);
      for (const auto& [one, alone] : {std::pair{pair_b, portable}, std::pair{pair_a, self}}) {
        EXPECT_EQ(std::bit_cast<uint64_t>(one.err2), std::bit_cast<uint64_t>(alone.err2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(one.ref2), std::bit_cast<uint64_t>(alone.ref2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(one.max_abs), std::bit_cast<uint64_t>(alone.max_abs)) << n;
      }
      EXPECT_EQ(std::bit_cast<uint64_t>(fast.err2), std::bit_cast<uint64_t>(portable.err2)) << n;
      EXPECT_EQ(std::bit_cast<uint64_t>(fast.ref2), std::bit_cast<uint64_t>(portable.ref2)) << n;
      EXPECT_EQ(std::bit_cast<uint64_t>(fast.max_abs), std::bit_cast<uint64_t>(portable.max_abs)) << n;
      // A reconstruction without specials (a's own specials are skipped):
      // finite sums, so the comparison is not one of NaN bits only.
      {
        std::vector<float> clean(n);
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal(0.0f, 0.05f);
        for (float& x : clean) x = normal(rng);
        std::vector<std::byte> clean_b = F32Bytes(clean);
        if (type != lossy::ElementType::kF32) {
          clean_b.resize(2 * n);
          for (size_t i = 0; i < n; ++i) {
            const uint16_t bits =
                type == lossy::ElementType::kF16 ? lossy::FloatToHalf(clean[i]) : lossy::FloatToBf16(clean[i]);
            std::memcpy(clean_b.data() + 2 * i, &bits, 2);
          }
        }
        const ErrorSums c = MeasureError(dtype, a, clean_b), cp = MeasureErrorPortable(dtype, a, clean_b);
        const auto [pair_clean, pair_b2] = MeasureErrorPair(dtype, a, clean_b, b);
        EXPECT_EQ(std::bit_cast<uint64_t>(pair_clean.err2), std::bit_cast<uint64_t>(cp.err2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(pair_clean.max_abs), std::bit_cast<uint64_t>(cp.max_abs)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(pair_b2.err2), std::bit_cast<uint64_t>(portable.err2)) << n;
        EXPECT_TRUE(std::isfinite(c.err2) && std::isfinite(c.ref2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(c.err2), std::bit_cast<uint64_t>(cp.err2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(c.ref2), std::bit_cast<uint64_t>(cp.ref2)) << n;
        EXPECT_EQ(std::bit_cast<uint64_t>(c.max_abs), std::bit_cast<uint64_t>(cp.max_abs)) << n;
      }
    }
  }
}

}  // namespace
}  // namespace ckptfs
