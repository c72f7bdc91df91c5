// Row-column bases of update denominators (codec/tensor/lossy/
// row_column_base.h, FORMAT.md "Row-column base"): the block and its exact
// synthesis, the parameters area (version 8), and a second moment with an
// outer-product structure stored in fewer bytes and read back within its
// bound, key frame and deltas after it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/row_column_base.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

std::vector<std::byte> Block(int32_t global, const std::vector<int8_t>& rows, const std::vector<int8_t>& columns) {
  std::vector<std::byte> b(4);
  StoreLE32(b.data(), static_cast<uint32_t>(global));
  for (int8_t r : rows) b.push_back(std::byte(static_cast<uint8_t>(r)));
  for (int8_t c : columns) b.push_back(std::byte(static_cast<uint8_t>(c)));
  return b;
}

TEST(RowColumnBase, SynthesisIsExactPowersOfTwoInEighthsAndClamped) {
  std::vector<std::byte> out(4 * 2 * 3);
  ASSERT_TRUE(lossy::SynthesizeRowColumnBase(Block(0, {0, 8}, {0, 4, -12}), 3, out));
  EXPECT_EQ(F32At(out, 0), 1.0f);
  EXPECT_EQ(F32At(out, 1), 0x1.6a09e6p+0f) << "2^(1/2), the float nearest";
  EXPECT_EQ(F32At(out, 2), 0x1.6a09e6p-2f) << "2^(-3/2): floor(-12 / 8) = -2, remainder 4";
  EXPECT_EQ(F32At(out, 3), 2.0f);
  EXPECT_EQ(F32At(out, 4), 0x1.6a09e6p+1f);
  EXPECT_EQ(F32At(out, 5), 0x1.6a09e6p-1f);
  for (int e = -40; e < 40; ++e) {
    std::vector<std::byte> one(4);
    ASSERT_TRUE(lossy::SynthesizeRowColumnBase(Block(e, {0}, {0}), 1, one));
    EXPECT_NEAR(std::log2(F32At(one, 0)), e / 8.0, 1e-6) << e;
  }
  // Every exponent in range equals ldexp of its eighth (the synthesis adds
  // to the exponent field instead of calling it).
  const float eighths[8] = {0x1p+0f, 0x1.172b84p+0f, 0x1.306fe0p+0f, 0x1.4bfdaep+0f,
                            0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};
  for (int e = -126 * 8; e <= 127 * 8 + 7; ++e) {
    std::vector<std::byte> one(4);
    ASSERT_TRUE(lossy::SynthesizeRowColumnBase(Block(e, {0}, {0}), 1, one));
    ASSERT_EQ(F32At(one, 0), std::ldexp(eighths[e & 7], e >> 3)) << e;
  }
  std::vector<std::byte> one(4);
  ASSERT_TRUE(lossy::SynthesizeRowColumnBase(Block(-5000, {-100}, {-100}), 1, one));
  EXPECT_EQ(F32At(one, 0), 0x1p-126f) << "never a denormal";
  ASSERT_TRUE(lossy::SynthesizeRowColumnBase(Block(5000, {100}, {100}), 1, one));
  EXPECT_EQ(F32At(one, 0), 0x1.d5818ep+127f) << "never infinite";
  EXPECT_FALSE(lossy::SynthesizeRowColumnBase(Block(0, {0, 0}, {0, 0}), 3, out)) << "block of another shape";
  EXPECT_FALSE(lossy::SynthesizeRowColumnBase(Block(0, {0, 0}, {0, 0, 0}), 0, out));
  EXPECT_FALSE(lossy::SynthesizeRowColumnBase(Block(0, {0, 0}, {0, 0, 0}), 4, out)) << "not whole rows";
}

// v_ij = 2^(r_i + c_j + noise): what Adam's second moment of a linear
// layer looks like (rows and columns of different gradient scales).
std::vector<float> OuterProduct(size_t rows, size_t columns, double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> r(rows), c(columns);
  for (double& x : r) x = -20 + 2.0 * normal(rng);
  for (double& x : c) x = 1.5 * normal(rng);
  std::vector<float> v(rows * columns);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < columns; ++j)
      v[i * columns + j] = static_cast<float>(std::exp2(r[i] + c[j] + noise * normal(rng)));
  return v;
}

// The vector kernel writes the portable code's bits: random rows and
// columns, globals at and past both clamps (a hostile block may hold any
// int32), widths that are no multiple of 8.
TEST(RowColumnBase, VectorSynthesisMatchesThePortableCode) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> eighth(-127, 127);
  for (int32_t global : {0, -1000, 1000, -1100, 1100, -2000000000, 2000000000, INT32_MIN, INT32_MAX}) {
    for (uint64_t columns : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{37}}) {
      const uint64_t rows = 5;
      std::vector<std::byte> block(lossy::RowColumnBlockSize(rows, columns));
      StoreLE32(block.data(), static_cast<uint32_t>(global));
      for (size_t k = 4; k < block.size(); ++k) block[k] = std::byte(static_cast<uint8_t>(eighth(rng)));
      std::vector<std::byte> fast(4 * rows * columns), portable(fast.size());
      ASSERT_TRUE(lossy::SynthesizeRowColumnBase(block, columns, fast));
      ASSERT_TRUE(lossy::SynthesizeRowColumnBasePortable(block, columns, portable));
      EXPECT_EQ(fast, portable) << "global " << global << " columns " << columns;
    }
  }
}

// The base made slice by slice (as the log decoder asks for it: slices that
// start and end inside rows) is the whole synthesis, bit for bit, with and
// without the vector kernel; a block of the wrong size opens nothing.
TEST(RowColumnBase, SlicesMatchTheWholeSynthesis) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> eighth(-127, 127);
  for (uint64_t columns : {uint64_t{1}, uint64_t{7}, uint64_t{37}, uint64_t{64}}) {
    const uint64_t rows = 41;
    const uint64_t n = rows * columns;
    std::vector<std::byte> block(lossy::RowColumnBlockSize(rows, columns));
    StoreLE32(block.data(), static_cast<uint32_t>(-300));
    for (size_t k = 4; k < block.size(); ++k) block[k] = std::byte(static_cast<uint8_t>(eighth(rng)));
    std::vector<std::byte> whole(4 * n);
    ASSERT_TRUE(lossy::SynthesizeRowColumnBase(block, columns, whole));
    for (bool vector : {false, true}) {
      const auto slices = lossy::RowColumnBaseSlices::Open(block, columns, n, vector);
      ASSERT_TRUE(slices.has_value());
      EXPECT_EQ(slices->elements(), n);
      for (uint64_t slice : {uint64_t{1}, uint64_t{5}, uint64_t{50}, n}) {
        std::vector<std::byte> got(4 * n);
        for (uint64_t first = 0; first < n; first += slice)
          slices->Fill(first, std::min(slice, n - first), got.data() + 4 * first);
        EXPECT_EQ(got, whole) << "columns " << columns << " slice " << slice << " vector " << vector;
      }
    }
    EXPECT_FALSE(lossy::RowColumnBaseSlices::Open(block, columns, n + columns).has_value());
    EXPECT_FALSE(lossy::RowColumnBaseSlices::Open(ByteSpan(block).first(block.size() - 1), columns, n).has_value());
    EXPECT_FALSE(lossy::RowColumnBaseSlices::Open(block, 0, n).has_value());
  }
}

// The vector fit gives the portable fit's block byte for byte: outer
// products with noise, widths that are no multiple of 8, and elements the
// fit skips or scales (zeros, negatives, infinities, NaN, denormals).
TEST(RowColumnBase, VectorFitMatchesThePortableCode) {
  std::mt19937 rng(5);
  for (uint64_t columns : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{37}, uint64_t{1024}}) {
    for (double noise : {0.1, 3.0}) {
      const uint64_t rows = columns == 1024 ? 64 : 41;
      std::vector<float> v = OuterProduct(rows, columns, noise, static_cast<uint32_t>(columns));
      for (float& x : v) {
        switch (rng() % 40) {
          case 0: x = 0.0f; break;
          case 1: x = -x; break;
          case 2: x = std::numeric_limits<float>::infinity(); break;
          case 3: x = std::numeric_limits<float>::quiet_NaN(); break;
          case 4: x = std::numeric_limits<float>::denorm_min() * static_cast<float>(1 + rng() % 100000); break;
          default: break;
        }
      }
      const ByteSpan bytes(reinterpret_cast<const std::byte*>(v.data()), v.size() * 4);
      auto fast = lossy::FitRowColumnBase(bytes, columns);
      auto portable = lossy::FitRowColumnBasePortable(bytes, columns);
      ASSERT_TRUE(fast && portable);
      EXPECT_EQ(*fast, *portable) << "columns " << columns << " noise " << noise;
    }
  }
  // Nothing finite and positive: no block either way.
  std::vector<float> none(64, -1.0f);
  const ByteSpan bytes(reinterpret_cast<const std::byte*>(none.data()), none.size() * 4);
  EXPECT_FALSE(lossy::FitRowColumnBase(bytes, 8));
  EXPECT_FALSE(lossy::FitRowColumnBasePortable(bytes, 8));
}

TEST(RowColumnBase, FitRecoversAnOuterProduct) {
  const size_t rows = 60, columns = 90;
  const std::vector<float> v = OuterProduct(rows, columns, 0.0, 3);
  std::optional<std::vector<std::byte>> block = lossy::FitRowColumnBase(F32Bytes(v), columns);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->size(), lossy::RowColumnBlockSize(rows, columns));
  std::vector<std::byte> base(4 * v.size());
  ASSERT_TRUE(lossy::SynthesizeRowColumnBase(*block, columns, base));
  double worst = 0;
  for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(std::log2(static_cast<double>(F32At(base, i)) / v[i])));
  EXPECT_LT(worst, 0.3) << "octaves";
  std::vector<float> nothing(v.size(), 0.0f);
  nothing[5] = -1.0f;
  EXPECT_FALSE(lossy::FitRowColumnBase(F32Bytes(nothing), columns)) << "no positive element";
  EXPECT_FALSE(lossy::FitRowColumnBase(F32Bytes(v), 7)) << "not whole rows";
}

LossyChunkParams RowColumnParams() {
  LossyChunkParams p;
  p.flags = LossyChunkParams::kFlagRowColumn;
  p.bits = 5;
  p.mode = 2;
  p.max_rel = 0.3;
  p.err2_sum = 1.0;
  p.ref2_sum = 9.0;
  p.source_digest = 0xabcdef;
  p.row_column = RowColumnTerm{200, 4 + 120 + 200};
  return p;
}

TEST(RowColumnParams, VersionEightRoundTripsAndRejectsWhatItCannotMean) {
  const std::vector<std::byte> good = EncodeParams(RowColumnParams());
  ASSERT_EQ(good.size(), LossyChunkParams::kEncodedSizeV8);
  EXPECT_EQ(good[0], std::byte{8});
  Result<LossyChunkParams> back = LossyChunkParams::DecodeFrom(good);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->row_column);
  EXPECT_EQ(back->row_column->columns, 200u);
  EXPECT_EQ(back->row_column->block_bytes, 324u);
  EXPECT_FALSE(back->delta()) << "reads no base version";
  EXPECT_EQ(back->max_rel, 0.3);
  EXPECT_EQ(back->source_digest, 0xabcdefu);
  EXPECT_TRUE(EncodeParams(*back) == good);

  auto rejected = [](const std::vector<std::byte>& bytes, const char* why) {
    EXPECT_EQ(LossyChunkParams::DecodeFrom(bytes).status().code(), StatusCode::kCorruption) << why;
  };
  std::vector<std::byte> b = good;
  b[0] = std::byte{7};
  rejected(b, "version 7 in 224 bytes");
  b = good;
  b[1] = std::byte{LossyChunkParams::kFlagRowColumn | LossyChunkParams::kFlagDelta};
  rejected(b, "and a base version");
  b = good;
  b[1] = std::byte{0};
  rejected(b, "without the flag");
  b = good;
  b[100] = std::byte{1};
  rejected(b, "a prediction area");
  b = good;
  b[212] = std::byte{1};
  rejected(b, "reserved bits");
  b = good;
  StoreLE32(b.data() + 208, 0);
  rejected(b, "no columns");
  LossyChunkParams quantized = RowColumnParams();
  quantized.mode = 1;
  quantized.budget_rel_l2 = 0.01;
  rejected(EncodeParams(quantized), "a row-column base outside the log mode");
}

FileBuilder SecondMomentFile(const std::vector<float>& v, bool matrix) {
  std::vector<float> m(v.size());
  for (size_t i = 0; i < v.size(); ++i) m[i] = 0.01f * std::sqrt(v[i]) * ((i % 7) - 3.0f);
  const std::vector<uint64_t> shape = matrix ? std::vector<uint64_t>{375, 64} : std::vector<uint64_t>{24000};
  FileBuilder f;
  f.Verbatim(RandomBytes(40, 1))
      .Tensor("model.a.weight", DType::kF32, shape, NormalF32(24000, 5))
      .Tensor("optimizer.state.0.exp_avg", DType::kF32, shape, F32Bytes(m))
      .Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, shape, F32Bytes(v))
      .Verbatim(RandomBytes(24, 2));
  return f;
}

struct VChunks {
  uint64_t stored = 0;
  uint32_t row_column = 0, total = 0;
};

VChunks SecondMomentChunks(const BlobReader& reader, const Segment& vs) {
  VChunks out;
  for (uint32_t c = 0; c < reader.chunks().size(); ++c) {
    const ChunkInfo& chunk = reader.chunks()[c];
    if (chunk.logical_offset < vs.offset || chunk.logical_offset >= vs.offset + vs.length) continue;
    ++out.total;
    out.stored += chunk.stored_length;
    if (chunk.codec != ChunkCodec::kLossy) continue;
    Result<LossyChunkParams> p = LossyChunkParams::DecodeFrom(reader.chunk_params(c));
    EXPECT_TRUE(p.ok());
    out.row_column += p.ok() && p->row_column ? 1 : 0;
  }
  return out;
}

// A chain of versions of SecondMomentFile (a matrix), each read back.
struct SecondMomentChain {
  explicit SecondMomentChain(const EncodeOptions& o) : options(o) {}
  // Appends the version holding second moment `v`; the second moment's
  // chunks of its blob (nullopt on a failure, reported).
  std::optional<VChunks> Append(const std::vector<float>& v) {
    const FileBuilder f = SecondMomentFile(v, true);
    const int version = static_cast<int>(ids.size());
    std::optional<std::vector<std::byte>> got = AppendVersion(f, options, version, &resolver, &ids, &previous, &blobs);
    if (!got) return std::nullopt;
    const Segment& vs = f.layout.segments[3];
    for (size_t i = 0; i < v.size(); ++i)
      max_rel = std::max(max_rel, std::fabs(static_cast<double>(F32At(ByteSpan(*got).subspan(vs.offset), i)) / v[i] - 1.0));
    return SecondMomentChunks(*previous, vs);
  }
  const EncodeOptions& options;
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  std::shared_ptr<const BlobReader> previous;
  double max_rel = 0;  // the largest relative error read back
};

TEST(RowColumn, AnOuterProductSecondMomentCostsLessAndStaysWithinItsBound) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, true);
  std::vector<float> v = OuterProduct(375, 64, 0.3, 9);
  CachedBlob flat(SecondMomentFile(v, false), options);
  ASSERT_TRUE(flat.reader);
  const VChunks flat_v = SecondMomentChunks(*flat.reader, SecondMomentFile(v, false).layout.segments[3]);
  EXPECT_EQ(flat_v.row_column, 0u) << "a vector has no rows";
  SecondMomentChain chain(options);
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int version = 0; version < 3; ++version) {
    if (version > 0)
      for (float& x : v) x *= 0.97f * std::exp2(0.1f * normal(rng));
    const std::optional<VChunks> chunks = chain.Append(v);
    ASSERT_TRUE(chunks.has_value());
    if (version == 0) {
      EXPECT_EQ(chunks->row_column, chunks->total) << "every chunk of the key frame";
      EXPECT_LT(chunks->stored, 0.85 * flat_v.stored) << "the same values as a vector";
    } else {
      EXPECT_EQ(chunks->row_column, 0u) << "a near version predicts better (version " << version << ")";
    }
  }
  ExpectCachedReadOfNewest(&chain.resolver, chain.ids, chain.blobs);
  EXPECT_LE(chain.max_rel, 0.45 + 1e-6) << "denominator_budget, 2.25 times opt_budget 0.2";
}

// A version far from its base (a second moment early in training: each
// element moves by more than its row and column explain), whose base's
// chunks were coded against their row-column fit: its band decides first
// and the chunks are coded against their own fit, within the bound.
TEST(RowColumn, AFarVersionOfARowColumnChunkIsCodedAgainstItsOwnFit) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, true);
  SecondMomentChain chain(options);
  for (int version = 0; version < 3; ++version) {
    // Other row and column scales each version, and each element's own
    // deviation from them drawn anew.
    const std::vector<float> v = OuterProduct(375, 64, 0.3, 11 + static_cast<uint32_t>(version));
    const std::optional<VChunks> chunks = chain.Append(v);
    ASSERT_TRUE(chunks.has_value());
    EXPECT_EQ(chunks->row_column, chunks->total) << "version " << version;
    if (version > 0) {
      // Only the winner was encoded whole: no plain stream first for the
      // second moment's chunks (the plain encodes count the others).
      const FileBuilder f = SecondMomentFile(v, true);
      const ObjectId& base_id = chain.ids[chain.ids.size() - 2];
      const BaseRef base{base_id, *chain.resolver.OpenBlob(base_id)};
      EncodeStats stats;
      EXPECT_EQ(Encode(f.bytes, f.layout, options, &base, &stats), chain.blobs.back());
      EXPECT_EQ(stats.stages[EncodeStage::kRowColumn].calls, chunks->total);
      EXPECT_EQ(stats.stages[EncodeStage::kRowColumn].kept, chunks->total);
      EncodeStats key_stats;
      Encode(f.bytes, f.layout, options, nullptr, &key_stats);
      EXPECT_EQ(stats.stages[EncodeStage::kLossy].calls, key_stats.stages[EncodeStage::kLossy].calls)
          << "the delta frame encoded as many plain streams as the key frame";
    }
  }
  ExpectCachedReadOfNewest(&chain.resolver, chain.ids, chain.blobs);
  EXPECT_LE(chain.max_rel, 0.45 + 1e-6) << "denominator_budget, 2.25 times opt_budget 0.2";
}

TEST(RowColumn, ABlockThatDoesNotFitIsRejectedAtOpen) {
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const std::vector<std::byte> blob =
      Encode(SecondMomentFile(OuterProduct(375, 64, 0.3, 9), true).bytes,
             SecondMomentFile(OuterProduct(375, 64, 0.3, 9), true).layout, DefaultLossy(policy, true));
  ASSERT_TRUE(OpenBytes(blob).ok());
  for (uint32_t columns : {63u, 32u}) {
    const std::vector<std::byte> bad = EditFirstLossyParams(
        blob, [](const LossyChunkParams& p) { return p.row_column.has_value(); },
        [columns](LossyChunkParams& p, const BlobIndex&, size_t) { p.row_column->columns = columns; });
    Result<std::shared_ptr<const BlobReader>> opened = OpenBytes(bad);
    EXPECT_EQ(opened.status().code(), StatusCode::kCorruption) << columns;
  }
}

}  // namespace
}  // namespace ckptfs
