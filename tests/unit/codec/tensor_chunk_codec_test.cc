#include "codec/tensor/chunk_codec.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <limits>
#include <optional>
#include <random>

#include "blob_test_util.h"
#include "codec/common/hash.h"
#include "codec/tensor/chunk_encoder.h"

namespace ckptfs {
namespace {

std::vector<std::byte> EncodeWith(ChunkCodec id, ByteSpan data, const ChunkContext& ctx) {
  CodecScratch scratch;
  ScratchBuffer out;
  Result<size_t> n = FindChunkCodec(id)->Encode(data, ctx, scratch, &out);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? std::vector<std::byte>(out.data(), out.data() + *n) : std::vector<std::byte>{};
}

Status DecodeWith(ChunkCodec id, ByteSpan stored, const ChunkContext& ctx, MutableByteSpan out,
                  ByteSpan params = {}) {
  CodecScratch scratch;
  return FindChunkCodec(id)->Decode(stored, params, ctx, scratch, out);
}

std::vector<std::byte> SpecialFloats(size_t count) {
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), -1e-40f, 1.0f, 3.4e38f, -2.5f};
  std::vector<std::byte> out(count * 4);
  for (size_t i = 0; i < count; ++i) std::memcpy(out.data() + 4 * i, &specials[i % 10], 4);
  // A signalling NaN payload must survive bit for bit too.
  const uint32_t snan = 0x7fa00001;
  if (count > 3) std::memcpy(out.data() + 12, &snan, 4);
  return out;
}

TEST(ChunkCodec, RegistryKnowsEveryCodecAndNothingElse) {
  for (uint8_t id : {0, 1, 2, 3, 4, 5, 16}) {
    ASSERT_NE(FindChunkCodec(static_cast<ChunkCodec>(id)), nullptr) << int{id};
    EXPECT_EQ(FindChunkCodec(static_cast<ChunkCodec>(id))->id(), static_cast<ChunkCodec>(id));
  }
  for (int id = 6; id < 256; ++id) {
    if (id != 16) {
      EXPECT_FALSE(IsKnownChunkCodec(static_cast<uint8_t>(id))) << id;
    }
  }
}

TEST(ChunkCodec, KeyFrameCodecsRoundTripEveryFloatPattern) {
  struct Case {
    DType dtype;
    std::vector<std::byte> data;
  };
  std::vector<Case> cases = {
      {DType::kF32, testing::NormalF32(10000, 1)},
      {DType::kF32, SpecialFloats(1001)},
      {DType::kF32, std::vector<std::byte>(4096, std::byte{0x3f})},
      {DType::kBF16, testing::NormalBF16(5001, 2)},
      {DType::kF16, testing::NormalBF16(17, 3)},
      {DType::kF32, testing::NormalF32(1, 4)},
      {DType::kF32, {}},
  };
  for (const Case& c : cases) {
    for (ChunkCodec id : {ChunkCodec::kRaw, ChunkCodec::kZstd, ChunkCodec::kBytePlaneZstd}) {
      ChunkContext ctx{c.dtype, 3, {}};
      std::vector<std::byte> stored = EncodeWith(id, c.data, ctx);
      std::vector<std::byte> back(c.data.size());
      ASSERT_TRUE(DecodeWith(id, stored, ctx, back).ok()) << ChunkCodecName(id);
      ASSERT_EQ(back, c.data) << ChunkCodecName(id) << " " << DTypeName(c.dtype) << " " << c.data.size();
    }
  }
}

TEST(ChunkCodec, BytePlaneBeatsZstdOnNormalWeights) {
  std::vector<std::byte> w = testing::NormalF32(1 << 18, 5);
  ChunkContext ctx{DType::kF32, 3, {}};
  size_t planes = EncodeWith(ChunkCodec::kBytePlaneZstd, w, ctx).size();
  size_t zstd = EncodeWith(ChunkCodec::kZstd, w, ctx).size();
  EXPECT_LT(planes, zstd);
  EXPECT_LT(planes * 115, w.size() * 100) << "want at least 1.15x on normal f32";
}

TEST(ChunkCodec, XorCodecRoundTripsAndShrinksSmallUpdates) {
  std::vector<std::byte> base = testing::NormalF32(50000, 6);
  std::vector<std::byte> next = base;
  for (size_t i = 0; i < 50000; i += 97) next[4 * i] ^= std::byte{1};  // a few mantissa bits change
  ChunkContext ctx{DType::kF32, 3, base};
  std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneXorZstd, next, ctx);
  EXPECT_LT(stored.size() * 20, next.size());
  std::vector<std::byte> back(next.size());
  ASSERT_TRUE(DecodeWith(ChunkCodec::kBytePlaneXorZstd, stored, ctx, back).ok());
  EXPECT_EQ(back, next);
}

TEST(ChunkCodec, ZstdWithBaseCostsOnlyWhatChangedAndNeedsItsBase) {
  // An RNG state saved again unchanged, and a pickle with a few bytes changed.
  const std::vector<std::byte> rng = testing::RandomBytes(5056, 21);
  const std::vector<std::byte> saved_before = rng;  // its own memory, as a base always is
  ChunkContext same{DType::kU8, 3, saved_before};
  std::vector<std::byte> stored = EncodeWith(ChunkCodec::kZstdWithBase, rng, same);
  EXPECT_LT(stored.size(), 40u);
  std::vector<std::byte> back(rng.size());
  ASSERT_TRUE(DecodeWith(ChunkCodec::kZstdWithBase, stored, same, back).ok());
  EXPECT_EQ(back, rng);

  std::vector<std::byte> next = testing::RandomBytes(20000, 22);
  std::vector<std::byte> base = next;
  for (size_t i = 0; i < base.size(); i += 2000) base[i] ^= std::byte{0x5a};
  ChunkContext ctx{DType::kI64, 3, base};
  stored = EncodeWith(ChunkCodec::kZstdWithBase, next, ctx);
  EXPECT_LT(stored.size(), 400u);
  back.assign(next.size(), std::byte{0});
  ASSERT_TRUE(DecodeWith(ChunkCodec::kZstdWithBase, stored, ctx, back).ok());
  EXPECT_EQ(back, next);

  // Another base decodes other bytes or fails; never the chunk.
  std::vector<std::byte> other = base;
  other[100] ^= std::byte{1};
  ChunkContext wrong{DType::kI64, 3, other};
  back.assign(next.size(), std::byte{0});
  Status s = DecodeWith(ChunkCodec::kZstdWithBase, stored, wrong, back);
  if (s.ok()) {
    EXPECT_NE(back, next);
  }
  // A base of the wrong length is refused (Corruption), as is a missing one.
  ChunkContext shorter{DType::kI64, 3, ByteSpan(base).first(base.size() - 8)};
  EXPECT_FALSE(DecodeWith(ChunkCodec::kZstdWithBase, stored, shorter, back).ok());
  EXPECT_FALSE(FindChunkCodec(ChunkCodec::kZstdWithBase)->Accepts(DType::kU8, false));
  // A plain zstd frame of other bytes than the prefix predicts still decodes.
  std::vector<std::byte> plain = EncodeWith(ChunkCodec::kZstd, next, ChunkContext{DType::kU8, 3, {}});
  back.assign(next.size(), std::byte{0});
  ASSERT_TRUE(DecodeWith(ChunkCodec::kZstdWithBase, plain, ctx, back).ok());
  EXPECT_EQ(back, next);
}

TEST(ChunkCodec, ZerosCodecRefusesNonZeroAndStoredBytes) {
  CodecScratch scratch;
  ScratchBuffer out;
  std::vector<std::byte> data(100);
  data[99] = std::byte{1};
  EXPECT_EQ(FindChunkCodec(ChunkCodec::kZeros)->Encode(data, {}, scratch, &out).status().code(),
            StatusCode::kUnsupported);
  std::vector<std::byte> back(100, std::byte{7});
  ASSERT_TRUE(DecodeWith(ChunkCodec::kZeros, {}, {}, back).ok());
  EXPECT_EQ(back, std::vector<std::byte>(100));
  EXPECT_EQ(DecodeWith(ChunkCodec::kZeros, data, {}, back).code(), StatusCode::kCorruption);
}

TEST(ChunkCodec, DecodeRejectsParamsForLosslessCodecs) {
  std::vector<std::byte> data = testing::RandomBytes(64, 7);
  std::vector<std::byte> params(3);
  std::vector<std::byte> back(64);
  EXPECT_EQ(DecodeWith(ChunkCodec::kRaw, data, {}, back, params).code(), StatusCode::kCorruption);
}

TEST(ChunkCodec, ZstdDecodeRefusesAFrameDeclaringMoreThanTheChunk) {
  // A decompression bomb: 16 MiB of zeros in a few hundred bytes, offered
  // as a 4 KiB chunk. It must fail before inflating.
  std::vector<std::byte> bomb_src(16 << 20);
  std::vector<std::byte> bomb(ZSTD_compressBound(bomb_src.size()));
  bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), bomb_src.data(), bomb_src.size(), 1));
  std::vector<std::byte> out(4096);
  Status s = DecodeWith(ChunkCodec::kZstd, bomb, {}, out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("declares"), std::string::npos) << s.message();
}

TEST(ChunkCodec, HostileBytePlanePayloadsFailCleanly) {
  std::vector<std::byte> w = testing::NormalF32(4096, 8);
  ChunkContext ctx{DType::kF32, 3, {}};
  std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneZstd, w, ctx);
  std::vector<std::byte> back(w.size());
  // Every truncation.
  for (size_t n = 0; n < stored.size(); n += 7)
    EXPECT_FALSE(DecodeWith(ChunkCodec::kBytePlaneZstd, ByteSpan(stored).first(n), ctx, back).ok()) << n;
  // Wrong plane count, unknown mode, trailing bytes, wrong dtype.
  std::vector<std::byte> bad = stored;
  bad[0] = std::byte{2};
  EXPECT_EQ(DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back).code(), StatusCode::kCorruption);
  bad = stored;
  bad[1] = std::byte{9};
  EXPECT_EQ(DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back).code(), StatusCode::kCorruption);
  bad = stored;
  bad.push_back(std::byte{0});
  EXPECT_EQ(DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back).code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeWith(ChunkCodec::kBytePlaneZstd, stored, ChunkContext{DType::kI32, 3, {}}, back).code(),
            StatusCode::kCorruption);
  // A byte flip anywhere: an error or, if it lands in a raw plane, other bytes; never a crash.
  for (size_t i = 0; i < stored.size(); i += 3) {
    bad = stored;
    bad[i] ^= std::byte{0x5a};
    (void)DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back);
  }
}

// Weights with a share of exact zeros, as trained Adam states have.
std::vector<std::byte> WithZeros(DType dtype, size_t count, size_t every, uint32_t seed) {
  const size_t width = DTypeSize(dtype);
  std::vector<std::byte> w = testing::NormalF32(count, seed);
  std::vector<std::byte> out(count * width);
  for (size_t i = 0; i < count; ++i) {
    // bf16: the high half of the f32 (little-endian).
    std::memcpy(out.data() + i * width, w.data() + 4 * i + (4 - width), width);
    if (i % every == 0) std::fill_n(out.begin() + i * width, width, std::byte{0});
  }
  return out;
}

TEST(ChunkCodec, SparsePayloadRoundTripsAndBeatsTheDensePlanes) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (size_t count : {size_t{33}, size_t{4097}, size_t{100000}}) {
      ChunkContext ctx{dtype, 3, {}};
      std::vector<std::byte> data = WithZeros(dtype, count, 8, static_cast<uint32_t>(count));
      std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneZstd, data, ctx);
      ASSERT_FALSE(stored.empty());
      EXPECT_EQ(static_cast<uint8_t>(stored[0]), 0x80 | DTypeSize(dtype)) << "sparse form chosen";
      std::vector<std::byte> back(data.size());
      ASSERT_TRUE(DecodeWith(ChunkCodec::kBytePlaneZstd, stored, ctx, back).ok());
      EXPECT_EQ(back, data);
      if (count == 100000) {
        // A zero in 8 costs ~0.54 bits as a mask instead of a symbol in each plane.
        std::vector<std::byte> dense = WithZeros(dtype, count, 8, static_cast<uint32_t>(count));
        for (size_t i = 0; i < count; i += 8) dense[i * DTypeSize(dtype)] = std::byte{1};
        std::vector<std::byte> dense_stored = EncodeWith(ChunkCodec::kBytePlaneZstd, dense, ctx);
        EXPECT_EQ(static_cast<uint8_t>(dense_stored[0]), DTypeSize(dtype));
        EXPECT_LT(stored.size(), dense_stored.size());
      }
    }
  }
}

TEST(ChunkCodec, HostileSparsePayloadsFailCleanly) {
  std::vector<std::byte> data = WithZeros(DType::kF32, 3001, 4, 5);
  ChunkContext ctx{DType::kF32, 3, {}};
  std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneZstd, data, ctx);
  ASSERT_EQ(static_cast<uint8_t>(stored[0]), 0x84);
  std::vector<std::byte> back(data.size());
  for (size_t n = 0; n < stored.size(); n += 5)
    EXPECT_FALSE(DecodeWith(ChunkCodec::kBytePlaneZstd, ByteSpan(stored).first(n), ctx, back).ok()) << n;
  // A mask with a bit past the last element (3001 % 8 = 1: bits 1-7 of the
  // last byte must be clear). Rebuild the payload with a raw mask to reach it.
  const size_t mask_bytes = (3001 + 7) / 8;
  std::vector<std::byte> mask(mask_bytes, std::byte{0});
  for (size_t i = 0; i < 3001; i += 4) mask[i / 8] |= std::byte(1u << (i % 8));
  mask.back() |= std::byte{0x80};
  std::vector<std::byte> bad = {std::byte{0x84}, std::byte{0}};
  ByteWriter(&bad).U32(static_cast<uint32_t>(mask_bytes));
  for (int k = 0; k < 4; ++k) {
    bad.push_back(std::byte{2});  // constant planes of whatever length is right
    ByteWriter(&bad).U32(1);
  }
  bad.insert(bad.end(), mask.begin(), mask.end());
  for (int k = 0; k < 4; ++k) bad.push_back(std::byte{0x11});
  EXPECT_EQ(DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back).code(), StatusCode::kCorruption);
  mask.back() &= std::byte{0x7f};
  std::copy(mask.begin(), mask.end(), bad.begin() + 1 + 5 * 5);
  ASSERT_TRUE(DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back).ok());
  // Byte flips: an error or other bytes, never a crash.
  for (size_t i = 0; i < stored.size(); i += 3) {
    bad = stored;
    bad[i] ^= std::byte{0x5a};
    (void)DecodeWith(ChunkCodec::kBytePlaneZstd, bad, ctx, back);
  }
}

TEST(ChunkCodec, RawAndCodedPlanesInAnyOrderRoundTrip) {
  // Planes 0 and 2 near uniform (raw: plane 0 is split straight into the
  // payload, plane 2 comes after a coded plane), 1 and 3 skewed (rANS);
  // dense and sparse, one scratch for all so that stale buffers would show.
  CodecScratch scratch;
  ScratchBuffer out;
  const size_t count = 100003;
  const std::vector<std::byte> noise = testing::RandomBytes(2 * count, 9);
  for (size_t zero_every : {size_t{0}, size_t{5}}) {
    std::vector<std::byte> data(4 * count);
    for (size_t i = 0; i < count; ++i) {
      data[4 * i] = noise[2 * i];
      data[4 * i + 1] = std::byte(i * 7 % 5);
      data[4 * i + 2] = noise[2 * i + 1];
      data[4 * i + 3] = std::byte(0x3c + i % 3);
      if (zero_every != 0 && i % zero_every == 0) std::fill_n(data.begin() + 4 * i, 4, std::byte{0});
    }
    ChunkContext ctx{DType::kF32, 3, {}};
    Result<size_t> n = FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Encode(data, ctx, scratch, &out);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    const bool sparse = zero_every != 0;
    ASSERT_EQ(static_cast<uint8_t>(out.data()[0]), sparse ? 0x84 : 0x04);
    const size_t first = sparse ? 1 : 0;
    const uint8_t want_modes[4] = {0, 3, 0, 3};  // raw, rANS, raw, rANS
    for (size_t k = 0; k < 4; ++k) EXPECT_EQ(static_cast<uint8_t>(out.data()[1 + 5 * (first + k)]), want_modes[k]) << k;
    std::vector<std::byte> back(data.size());
    ASSERT_TRUE(FindChunkCodec(ChunkCodec::kBytePlaneZstd)
                    ->Decode(ByteSpan(out.data(), *n), {}, ctx, scratch, back)
                    .ok());
    EXPECT_EQ(back, data) << "zero every " << zero_every;
  }
}

TEST(ChunkCodec, StreamedDecodeHandlesZeroRunsAcrossBlocks) {
  // The usual float chunk (top byte rANS, the others raw) decodes block by
  // block, putting the zeros back as it goes: zero runs longer than a block
  // (blocks with nothing to decode), blocks with no zeros, runs across
  // block ends; dense too. Truncating the rANS plane's stream is an error.
  CodecScratch scratch;
  ScratchBuffer out;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const size_t width = DTypeSize(dtype), count = 20011;
    const std::vector<std::byte> noise = testing::RandomBytes(width * count, 17);
    for (bool sparse : {false, true}) {
      std::vector<std::byte> data(noise);
      for (size_t i = 0; i < count; ++i) {
        data[width * i + width - 1] = std::byte(0x3c + (i * 5 % 7) / 3);
        const bool zero = sparse && (i % 4000 < 1300 || (i % 4000 > 2600 && i % 9 == 0));
        if (zero) std::fill_n(data.begin() + width * i, width, std::byte{0});
      }
      ChunkContext ctx{dtype, 3, {}};
      Result<size_t> n = FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Encode(data, ctx, scratch, &out);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_EQ(static_cast<uint8_t>(out.data()[0]), (sparse ? 0x80 : 0) | width);
      const size_t first = sparse ? 1 : 0;
      for (size_t k = 0; k < width; ++k)
        ASSERT_EQ(static_cast<uint8_t>(out.data()[1 + 5 * (first + k)]), k + 1 == width ? 3 : 0) << k;
      std::vector<std::byte> stored(out.data(), out.data() + *n);
      std::vector<std::byte> back(data.size());
      ASSERT_TRUE(FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Decode(stored, {}, ctx, scratch, back).ok());
      EXPECT_EQ(back, data) << DTypeName(dtype) << (sparse ? " sparse" : " dense");
      // The rANS plane is last: drop its last word and declare it shorter.
      const size_t entry = 1 + 5 * (first + width - 1) + 1;
      uint32_t len = LoadLE32(stored.data() + entry);
      StoreLE32(stored.data() + entry, len - 2);
      stored.resize(stored.size() - 2);
      EXPECT_EQ(FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Decode(stored, {}, ctx, scratch, back).code(),
                StatusCode::kCorruption);
    }
  }
}

// Normal f32 values whose two low mantissa bytes are noise, as in trained
// weights: only the sign/exponent plane is worth coding.
std::vector<std::byte> TrainedLikeF32(size_t count, uint32_t seed) {
  std::vector<std::byte> out = testing::NormalF32(count, seed);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    out[4 * i] = static_cast<std::byte>(rng());
    out[4 * i + 1] = static_cast<std::byte>(rng());
  }
  return out;
}

// Decode with a checksum: the streamed float path (one rANS plane, the
// others raw) hashes each block as it writes it; the value must be the
// chunk checksum of the whole output, whatever the block boundaries, the
// zero mask or the XOR with a base. Other paths leave it to the caller.
TEST(ChunkCodec, DecodeHashesTheOutputAsItGoesOnTheStreamedPath) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (size_t count : {size_t{1}, size_t{33}, size_t{511}, size_t{512}, size_t{513}, size_t{4097}, size_t{100000}}) {
      const uint32_t seed = static_cast<uint32_t>(count);
      const std::vector<std::byte> normal = dtype == DType::kF32 ? TrainedLikeF32(count, seed)
                                                                 : testing::NormalBF16(count, seed);
      const std::vector<std::byte> sparse = WithZeros(dtype, count, 8, seed);
      for (const std::vector<std::byte>* input : {&normal, &sparse}) {
        const std::vector<std::byte>& data = *input;
        ChunkContext ctx{dtype, 3, {}};
        std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneZstd, data, ctx);
        std::vector<std::byte> back(data.size());
        CodecScratch scratch;
        std::optional<uint64_t> checksum = 12345;
        ASSERT_TRUE(FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Decode(stored, {}, ctx, scratch, back, &checksum).ok());
        EXPECT_EQ(back, data);
        if (checksum) {
          EXPECT_EQ(*checksum, Checksum64(data)) << DTypeName(dtype) << " x " << count;
        }
        // Normal weights: sign/exponent plane rANS, the rest raw (streamed).
        if (input == &normal && count >= 4097) {
          EXPECT_TRUE(checksum.has_value()) << DTypeName(dtype) << " x " << count << ": not streamed";
        }
      }
      // A delta chunk: XOR and hash per block. Two unrelated tensors keep the
      // residual's sign/exponent plane for rANS (the streamed path).
      std::vector<std::byte> base = dtype == DType::kF32 ? TrainedLikeF32(count, seed + 1)
                                                         : testing::NormalBF16(count, seed + 1);
      ChunkContext delta{dtype, 3, base};
      std::vector<std::byte> stored = EncodeWith(ChunkCodec::kBytePlaneXorZstd, normal, delta);
      std::vector<std::byte> back(normal.size());
      CodecScratch scratch;
      std::optional<uint64_t> checksum;
      ASSERT_TRUE(FindChunkCodec(ChunkCodec::kBytePlaneXorZstd)->Decode(stored, {}, delta, scratch, back, &checksum).ok());
      EXPECT_EQ(back, normal);
      if (checksum) {
        EXPECT_EQ(*checksum, Checksum64(normal)) << "delta " << DTypeName(dtype) << " x " << count;
      }
      if (count >= 4097) {
        EXPECT_TRUE(checksum.has_value()) << "delta " << DTypeName(dtype) << " x " << count;
      }
    }
  }
  // A codec without the streamed path leaves it empty (a stale value is cleared).
  std::vector<std::byte> data = testing::NormalF32(1000, 3);
  ChunkContext ctx{DType::kF32, 3, {}};
  std::vector<std::byte> stored = EncodeWith(ChunkCodec::kZstd, data, ctx);
  std::vector<std::byte> back(data.size());
  CodecScratch scratch;
  std::optional<uint64_t> checksum = 1;
  ASSERT_TRUE(FindChunkCodec(ChunkCodec::kZstd)->Decode(stored, {}, ctx, scratch, back, &checksum).ok());
  EXPECT_FALSE(checksum.has_value());
}

TEST(ChunkCodec, SparseChunksOfAlmostOnlyZerosRoundTrip) {
  // So few non-zero elements that the element sample may hold none.
  CodecScratch scratch;
  ScratchBuffer out;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const size_t width = DTypeSize(dtype), count = 5000;
    for (size_t nonzero : {size_t{1}, size_t{7}, size_t{9}, size_t{40}}) {
      std::vector<std::byte> data(width * count, std::byte{0});
      for (size_t j = 0; j < nonzero; ++j) data[width * (j * 97 + 1) + width - 1] = std::byte(0x3c + j % 3);
      ChunkContext ctx{dtype, 3, {}};
      Result<size_t> n = FindChunkCodec(ChunkCodec::kBytePlaneZstd)->Encode(data, ctx, scratch, &out);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      EXPECT_EQ(static_cast<uint8_t>(out.data()[0]), 0x80 | width);
      std::vector<std::byte> back(data.size());
      ASSERT_TRUE(FindChunkCodec(ChunkCodec::kBytePlaneZstd)
                      ->Decode(ByteSpan(out.data(), *n), {}, ctx, scratch, back)
                      .ok());
      EXPECT_EQ(back, data) << DTypeName(dtype) << " " << nonzero;
    }
  }
}

TEST(ChunkCodec, PayloadsOfTheFirstEncoderStillDecode) {
  // A dense payload as the encoder wrote it before rANS planes and sparse
  // payloads: planes raw, raw, zstd (literal settings then), constant.
  const size_t count = 1000;
  std::vector<std::byte> data(4 * count);
  std::vector<std::vector<std::byte>> planes(4, std::vector<std::byte>(count));
  for (size_t i = 0; i < count; ++i) {
    planes[0][i] = std::byte(i * 7);
    planes[1][i] = std::byte(i * 13 + 1);
    planes[2][i] = std::byte(0x40 + i % 3);
    planes[3][i] = std::byte{0x3c};
    for (size_t k = 0; k < 4; ++k) data[4 * i + k] = planes[k][i];
  }
  std::vector<std::byte> zstd(ZSTD_compressBound(count));
  zstd.resize(ZSTD_compress(zstd.data(), zstd.size(), planes[2].data(), count, 1));
  std::vector<std::byte> payload = {std::byte{4}};
  const std::vector<std::pair<uint8_t, size_t>> entries = {{0, count}, {0, count}, {1, zstd.size()}, {2, 1}};
  for (auto [mode, length] : entries) {
    payload.push_back(std::byte{mode});
    ByteWriter(&payload).U32(static_cast<uint32_t>(length));
  }
  payload.insert(payload.end(), planes[0].begin(), planes[0].end());
  payload.insert(payload.end(), planes[1].begin(), planes[1].end());
  payload.insert(payload.end(), zstd.begin(), zstd.end());
  payload.push_back(std::byte{0x3c});
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(DecodeWith(ChunkCodec::kBytePlaneZstd, payload, ChunkContext{DType::kF32, 3, {}}, back).ok());
  EXPECT_EQ(back, data);
}

TEST(ChunkEncoder, PicksTheFittingCodec) {
  CodecScratch scratch;
  ScratchBuffer out;
  auto pick = [&](ByteSpan data, DType dtype, ByteSpan base = {}) {
    Result<ChunkEncoding> e = EncodeChunkBest(data, dtype, 3, base, scratch, &out);
    EXPECT_TRUE(e.ok());
    return e->codec;
  };
  std::vector<std::byte> zeros(1 << 16);
  EXPECT_EQ(pick(zeros, DType::kF32), ChunkCodec::kZeros);
  EXPECT_EQ(pick(testing::RandomBytes(1 << 16, 9), DType::kU8), ChunkCodec::kRaw);
  EXPECT_EQ(pick(testing::RandomBytes(1 << 16, 9), DType::kF32), ChunkCodec::kRaw);
  std::vector<std::byte> w = testing::NormalF32(1 << 14, 10);
  EXPECT_EQ(pick(w, DType::kF32), ChunkCodec::kBytePlaneZstd);
  std::string text(1 << 14, 'a');
  for (size_t i = 0; i < text.size(); i += 5) text[i] = static_cast<char>('a' + i % 7);
  EXPECT_EQ(pick(AsBytes(text), DType::kU8), ChunkCodec::kZstd);
  EXPECT_EQ(pick(w, DType::kF32, w), ChunkCodec::kBytePlaneXorZstd);  // unchanged: all-zero residual
  EXPECT_EQ(pick(w, DType::kF32, testing::NormalF32(1 << 14, 11)), ChunkCodec::kBytePlaneZstd);
  // Anything else against a base: zstd with the base as its prefix when that is smaller.
  const std::vector<std::byte> state = testing::RandomBytes(1 << 12, 12);
  const std::vector<std::byte> state_before = state;
  EXPECT_EQ(pick(state, DType::kU8, state_before), ChunkCodec::kZstdWithBase);
  EXPECT_EQ(pick(state, DType::kU8, testing::RandomBytes(1 << 12, 13)), ChunkCodec::kRaw);
}

}  // namespace
}  // namespace ckptfs
