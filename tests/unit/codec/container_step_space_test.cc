// Step space (codec/optimizer/step_space.h, FORMAT.md "Step space"): Adam's
// first moment coded as m / (sqrt(v) + eps) against the same version's
// reconstructed second moment. The parameters area (version 5), whole chains
// of an Adam run (decoded bit for bit with and without a chunk cache, the
// step-space error within budget), the fallback for non-finite values, and
// hostile indexes rejected at Open.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/container/lossy_report.h"
#include "codec/optimizer/step_space.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

LossyChunkParams StepSpaceParams() {
  LossyChunkParams p = DeltaParams();
  p.step_space = StepSpace{4096, kStepSpaceEps};
  return p;
}

// The scales and the division element by element against the binary32
// formula written out here (the library runs them eight lanes wide where it
// can): same bits, same verdict, over lengths around the vector width and
// hostile values (negative, zero, subnormal, huge, NaN, infinities) placed
// in the vector part and in the tail.
TEST(StepSpaceArithmetic, ScalesAndDivisionEqualTheScalarFormulaBitForBit) {
  std::mt19937 rng(7);
  const float specials[] = {-1.0f, 0.0f, -0.0f, 1e-45f, 3e38f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  auto bytes_of = [](const std::vector<float>& f) {
    std::vector<std::byte> b(4 * f.size());
    if (!f.empty()) std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{1000}, size_t{1003}}) {
    for (int special = -1; special < static_cast<int>(std::size(specials)); ++special) {
      for (size_t at : {size_t{0}, n > 0 ? n - 1 : 0}) {
      for (bool in_v : {true, false}) {
        SCOPED_TRACE("n " + std::to_string(n) + " special " + std::to_string(special) + " at " + std::to_string(at) +
                     (in_v ? " in v" : " in m"));
        std::uniform_real_distribution<float> pos(0.0f, 1e-3f), any(-1.0f, 1.0f);
        std::vector<float> v(n), m(n);
        for (size_t i = 0; i < n; ++i) {
          v[i] = pos(rng) * pos(rng);
          m[i] = any(rng) * 1e-3f;
        }
        if (special >= 0 && n > 0) (in_v ? v : m)[at] = specials[special];
        std::vector<std::byte> s(4 * n), x(4 * n);
        const bool scales_ok = StepScales(bytes_of(v), kStepSpaceEps, s.data());
        bool want_scales_ok = true;
        std::vector<float> want_s(n);
        for (size_t i = 0; i < n; ++i) {
          volatile float root = std::sqrt(v[i]);
          want_s[i] = root + kStepSpaceEps;
          want_scales_ok &= std::isfinite(want_s[i]) && want_s[i] > 0;
        }
        EXPECT_EQ(scales_ok, want_scales_ok);
        if (n > 0) {
          ASSERT_EQ(std::memcmp(s.data(), want_s.data(), s.size()), 0);
        }
        const bool divide_ok = DivideByScales(bytes_of(m), s.data(), x.data());
        bool want_divide_ok = true;
        std::vector<float> want_x(n);
        for (size_t i = 0; i < n; ++i) {
          want_x[i] = m[i] / want_s[i];
          want_divide_ok &= std::isfinite(want_x[i]);
        }
        EXPECT_EQ(divide_ok, want_divide_ok);
        for (size_t i = 0; i < n; ++i) {
          if (std::isnan(want_x[i])) {
            float got;
            std::memcpy(&got, x.data() + 4 * i, 4);
            EXPECT_TRUE(std::isnan(got)) << i;  // the NaN's payload is the hardware's either way
          } else {
            EXPECT_EQ(std::memcmp(x.data() + 4 * i, &want_x[i], 4), 0) << i;
          }
        }
      }
      }
    }
  }
}

TEST(StepSpaceParams, VersionFiveRoundTripsAndRejectsWhatItCannotMean) {
  // Alone, and with a scaled base (the prediction a first moment may have).
  LossyChunkParams scaled = StepSpaceParams();
  StepPrediction s;
  s.predictor.scale = 0.6;
  s.predictor.eps = 1e-8;
  scaled.prediction = s;
  for (const LossyChunkParams& p : {StepSpaceParams(), scaled}) {
    const std::vector<std::byte> bytes = EncodeParams(p);
    ASSERT_EQ(bytes.size(), LossyChunkParams::kEncodedSizeV5);
    EXPECT_EQ(bytes[0], std::byte{5});
    Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_TRUE(back->step_space);
    EXPECT_EQ(back->step_space->v_offset, 4096u);
    EXPECT_EQ(back->step_space->eps, kStepSpaceEps);
    EXPECT_EQ(back->prediction.has_value(), p.prediction.has_value());
    EXPECT_TRUE(EncodeParams(*back) == bytes);
  }
  auto rejected = [](std::vector<std::byte> bytes, const char* why) {
    Result<LossyChunkParams> r = LossyChunkParams::DecodeFrom(bytes);
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << why;
  };
  const std::vector<std::byte> good = EncodeParams(StepSpaceParams());
  std::vector<std::byte> b = good;
  b[0] = std::byte{4};
  rejected(b, "version 4 in 160 bytes");
  b = good;
  b[1] = std::byte{LossyChunkParams::kFlagDelta};
  rejected(b, "version 5 without the step-space flag");
  b = good;
  b[100] = std::byte{1};
  rejected(b, "a prediction area that is not zero without a prediction");
  b = good;
  b[157] = std::byte{1};
  rejected(b, "reserved bytes");
  for (float eps : {0.0f, -1e-8f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    b = good;
    StoreLE32(b.data() + 152, std::bit_cast<uint32_t>(eps));
    rejected(b, "eps not finite and > 0");
  }
  LossyChunkParams stepped = scaled;
  stepped.prediction->has_step = true;
  stepped.prediction->m_offset = 8;
  rejected(EncodeParams(stepped), "a step term in a step-space chunk");
  // The step-space flag in a shorter version.
  b = EncodeParams(scaled);
  b.resize(LossyChunkParams::kEncodedSizeV4);
  b[0] = std::byte{4};
  rejected(b, "the step-space flag in version 4");
}

struct SpaceChain {
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  uint32_t space_chunks = 0;      // exp_avg chunks in step space, over the chain
  uint32_t predicted_chunks = 0;  // chunks with a step prediction or a scaled base
};

// Encodes `versions` checkpoints of the run as a chain with the first
// moments in step space; checks that each decodes (whole-file checksum) and
// measures every large exp_avg's error on the step, with the scales of the
// reconstructed second moment. Returns the worst such error of the last
// version.
double EncodeSpaceChain(bool space, int versions, MapResolver* resolver, SpaceChain* chain,
                        std::optional<double> step_budget = std::nullopt, bool predict = true) {
  policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  if (step_budget) policy.SetMomentumStepBudget(*step_budget);
  EncodeOptions options = DefaultLossy(policy, predict);
  options.momentum_step_space = space;
  AdamRun run;
  std::shared_ptr<const BlobReader> previous;
  double worst = 0;
  for (int version = 0; version < versions; ++version) {
    if (version > 0) run.Steps(5);
    FileBuilder f = run.File();
    std::optional<std::vector<std::byte>> got =
        AppendVersion(f, options, version, resolver, &chain->ids, &previous, &chain->blobs);
    if (!got) return INFINITY;
    for (uint32_t c = 0; c < previous->chunks().size(); ++c) {
      if (previous->chunks()[c].codec != ChunkCodec::kLossy) continue;
      Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(previous->chunk_params(c));
      EXPECT_TRUE(p.ok());
      if (p.ok() && p->step_space) ++chain->space_chunks;
      if (p.ok() && p->prediction) ++chain->predicted_chunks;
    }
    // Each exp_avg segment is followed by its exp_avg_sq (AdamRun::File).
    worst = 0;
    for (size_t t = 0; t < f.layout.tensors.size(); ++t) {
      if (!f.layout.tensors[t].name.ends_with(".exp_avg")) continue;
      const Segment& m = f.layout.segments[t + 1];
      const Segment& v = f.layout.segments[t + 2];
      if (m.length / 4 < kMinStepSpaceElements) continue;
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < m.length / 4; ++i) {
        const double s = std::sqrt(F32At(ByteSpan(*got).subspan(v.offset), i)) + kStepSpaceEps;
        const double x = F32At(ByteSpan(f.bytes).subspan(m.offset), i) / s;
        const double d = F32At(ByteSpan(*got).subspan(m.offset), i) / s - x;
        err2 += d * d;
        ref2 += x * x;
      }
      worst = std::max(worst, std::sqrt(err2 / ref2));
    }
  }
  return worst;
}

TEST(StepSpace, FirstMomentsKeepTheirBudgetOnTheStep) {
  MapResolver resolver, plain_resolver;
  SpaceChain chain, plain;
  // The same number as the budget on m: 0.2.
  const double space_error = EncodeSpaceChain(true, 4, &resolver, &chain, 0.2);
  const double plain_error = EncodeSpaceChain(false, 4, &plain_resolver, &plain);
  // Every exp_avg chunk of the large tensors, every version.
  EXPECT_EQ(chain.space_chunks, 4u * 2u * (AdamRun::kN * 4 / (32 << 10) + 1)) << chain.space_chunks;
  EXPECT_EQ(plain.space_chunks, 0u);
  // The default optimizer budget (0.2), measured on m / (sqrt(v) + eps),
  // with a margin for the rounding of m = x_hat * s.
  EXPECT_LE(space_error, 0.2 * 1.001);
  // An L2 budget on m itself leaves the steps of small-v elements far
  // worse off (the run's gradient scales span several octaves).
  EXPECT_GT(plain_error, 0.2) << "plain " << plain_error << " step space " << space_error;
  // The default budget on the step: kMomentumStepBudgetFactor times 0.2,
  // the levels' unbiasing gain allowed to raise it kUnbiasAllowance-fold.
  MapResolver default_resolver;
  SpaceChain defaults;
  EXPECT_LE(EncodeSpaceChain(true, 2, &default_resolver, &defaults), 0.5 * lossy::kUnbiasAllowance * 1.001);
  EXPECT_GT(defaults.space_chunks, 0u);
}

// Step prediction off (predict=off) predicts nothing, first moments in step
// space included; with it on, they are coded against a scaled base.
TEST(StepSpace, PredictOffPredictsNoFirstMoment) {
  MapResolver resolver, predicted_resolver;
  SpaceChain off, on;
  EncodeSpaceChain(true, 3, &resolver, &off, std::nullopt, false);
  EncodeSpaceChain(true, 3, &predicted_resolver, &on, std::nullopt, true);
  EXPECT_GT(off.space_chunks, 0u);
  EXPECT_EQ(off.predicted_chunks, 0u);
  EXPECT_GT(on.predicted_chunks, 0u);
}

TEST(StepSpace, ACachedReaderDecodesTheSameBytes) {
  MapResolver resolver;
  SpaceChain chain;
  EncodeSpaceChain(true, 3, &resolver, &chain);
  ExpectCachedReadOfNewest(&resolver, chain.ids, chain.blobs);
}

TEST(StepSpace, NonFiniteMomentsStayAsTheyAreBitForBit) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  EncodeOptions options = DefaultLossy(policy, true);
  options.momentum_step_space = true;
  AdamRun run;
  FileBuilder f = run.File();
  // A NaN with a payload in b's first moment (state 0), a negative second
  // moment in a's (state 1): neither chunk can be coded in step space.
  const Segment& m0 = f.layout.segments[4];
  const Segment& v1 = f.layout.segments[7];
  StoreLE32(f.bytes.data() + m0.offset + 4 * 10, 0x7fc01234u);
  StoreLE32(f.bytes.data() + v1.offset + 4 * 20, std::bit_cast<uint32_t>(-1.0f));
  MapResolver resolver;
  const std::vector<std::byte> blob = Encode(f.bytes, f.layout, options);
  auto reader = resolver.OpenBlob(resolver.Add(blob));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<std::vector<std::byte>> got = DecodeAll(**reader);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(LoadLE32(got->data() + m0.offset + 4 * 10), 0x7fc01234u);
  uint32_t space = 0;
  for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) {
    const ChunkInfo& chunk = (*reader)->chunks()[c];
    if (chunk.codec != ChunkCodec::kLossy) continue;
    Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom((*reader)->chunk_params(c));
    ASSERT_TRUE(p.ok());
    if (!p->step_space) continue;
    ++space;
    const std::string& name = (*reader)->tensors()[(*reader)->segments()[chunk.segment].tensor].name;
    // Only the chunks without the NaN or the negative v.
    if (name == "optimizer.state.0.exp_avg") {
      EXPECT_GT(chunk.logical_offset, m0.offset + 40);
    }
    if (name == "optimizer.state.1.exp_avg") {
      EXPECT_GT(chunk.logical_offset, f.layout.segments[6].offset + 80);
    }
  }
  EXPECT_GT(space, 0u);
}

// Rewrites the step space of the first step-space chunk of `blob`.
std::vector<std::byte> EditFirstSpace(const std::vector<std::byte>& blob,
                                      const std::function<void(StepSpace&, const BlobIndex&, size_t)>& edit) {
  return EditFirstLossyParams(
      blob, [](const LossyChunkParams& p) { return p.step_space.has_value(); },
      [&](LossyChunkParams& p, const BlobIndex& index, size_t c) { edit(*p.step_space, index, c); });
}

TEST(StepSpace, OpenRejectsSecondMomentRangesThatCannotBeRead) {
  MapResolver resolver;
  SpaceChain chain;
  EncodeSpaceChain(true, 2, &resolver, &chain);
  auto open = [&](std::vector<std::byte> bytes) { return testing::OpenBytes(std::move(bytes), std::nullopt, &resolver); };
  ASSERT_TRUE(open(chain.blobs.back()).ok());

  // v read from the chunk itself: a cycle.
  Result<std::shared_ptr<const BlobReader>> r =
      open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex& index, size_t c) {
        s.v_offset = index.chunks[c].logical_offset;
      }));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("covers a step-predicted or step-space chunk"), std::string::npos)
      << r.status().ToString();

  // v read from a step-predicted weight chunk (which reads the first moments).
  r = open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex& index, size_t) {
    for (size_t c = 0; c < index.chunks.size(); ++c) {
      Result<LossyChunkParams> q = LossyChunkParams::DecodeFrom(index.params[c]);
      if (q.ok() && q->prediction && q->prediction->has_step) {
        s.v_offset = index.chunks[c].logical_offset;
        return;
      }
    }
    ADD_FAILURE() << "no step-predicted chunk";
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();

  // v past the end of the file.
  r = open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex& index, size_t) {
    s.v_offset = index.header.logical_size - 4;
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("past the logical size"), std::string::npos) << r.status().ToString();

  // v straddling the end of its tensor, or in bytes that are no f32 tensor.
  r = open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex& index, size_t c) {
    for (const SegmentInfo& seg : index.segments)
      if (seg.offset <= s.v_offset && s.v_offset < seg.offset + seg.length) {
        s.v_offset = seg.offset + seg.length - index.chunks[c].logical_length + 4;
        return;
      }
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not inside one f32 tensor"), std::string::npos) << r.status().ToString();
  r = open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex&, size_t) { s.v_offset = 0; }));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not inside one f32 tensor"), std::string::npos) << r.status().ToString();

  // Another parameter's second moment as v: it opens, and the decoded
  // checksum catches the other scales; nothing is made up.
  r = open(EditFirstSpace(chain.blobs.back(), [](StepSpace& s, const BlobIndex& index, size_t) {
    for (const SegmentInfo& seg : index.segments)
      if (seg.tensor >= 0 && index.tensors[seg.tensor].name == "optimizer.state.1.exp_avg_sq") s.v_offset = seg.offset;
  }));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<std::vector<std::byte>> decoded = DecodeAll(**r);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(decoded.status().code() == StatusCode::kChecksumMismatch ||
              decoded.status().code() == StatusCode::kCorruption)
      << decoded.status().ToString();
}

}  // namespace
}  // namespace ckptfs
