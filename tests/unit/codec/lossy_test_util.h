// Helpers shared by the lossy codec tests: deterministic tensor generators
// and an independent (naive) error measurement.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy::testing {

enum class Dist { kNormal, kLaplace, kHeavyTail, kConstant, kZeros, kDenormal, kNonFinite, kPositive };

inline std::string DistName(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kLaplace: return "laplace";
    case Dist::kHeavyTail: return "heavytail";
    case Dist::kConstant: return "constant";
    case Dist::kZeros: return "zeros";
    case Dist::kDenormal: return "denormal";
    case Dist::kNonFinite: return "nonfinite";
    case Dist::kPositive: return "positive";
  }
  return "?";
}

inline std::vector<float> Generate(Dist d, size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::exponential_distribution<float> expo(50.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (d) {
      case Dist::kNormal: v[i] = normal(rng); break;
      case Dist::kLaplace: v[i] = (uni(rng) < 0.5f ? -1.0f : 1.0f) * expo(rng); break;
      case Dist::kHeavyTail: {
        float x = normal(rng);
        if (uni(rng) < 0.002f) x *= 1000.0f;  // rare huge outliers
        v[i] = x;
        break;
      }
      case Dist::kConstant: v[i] = 0.125f + 1e-3f; break;
      case Dist::kZeros: v[i] = 0.0f; break;
      case Dist::kDenormal: v[i] = (uni(rng) - 0.5f) * 1e-39f; break;
      case Dist::kNonFinite: {
        float u = uni(rng);
        v[i] = u < 0.01f ? NAN : u < 0.02f ? INFINITY : u < 0.03f ? -INFINITY : normal(rng);
        break;
      }
      case Dist::kPositive: v[i] = std::fabs(normal(rng)) * std::fabs(normal(rng)); break;  // like exp_avg_sq
    }
  }
  return v;
}

// Encodes floats as elements of `type` (rounded to nearest even).
inline std::vector<std::byte> ToElements(ElementType type, const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * ElementSize(type));
  for (size_t i = 0; i < v.size(); ++i) {
    if (type == ElementType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      uint16_t h = type == ElementType::kF16 ? FloatToHalf(v[i]) : FloatToBf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline float ElementAt(ElementType type, const std::vector<std::byte>& b, size_t i) {
  if (type == ElementType::kF32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return type == ElementType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

struct NaiveError {
  double err_sq = 0, norm_sq = 0, max_abs = 0;
  bool nonfinite_exact = true;  // every non-finite original is reproduced bit for bit
};

// Straightforward error over finite elements, independent of the codec's
// blocked reduction.
inline NaiveError Measure(ElementType type, const std::vector<std::byte>& orig, const std::vector<std::byte>& recon) {
  NaiveError e;
  size_t w = ElementSize(type), n = orig.size() / w;
  for (size_t i = 0; i < n; ++i) {
    float x = ElementAt(type, orig, i), y = ElementAt(type, recon, i);
    if (!std::isfinite(x)) {
      if (std::memcmp(orig.data() + w * i, recon.data() + w * i, w) != 0) e.nonfinite_exact = false;
      continue;
    }
    double d = static_cast<double>(y) - static_cast<double>(x);
    e.err_sq += d * d;
    e.norm_sq += static_cast<double>(x) * x;
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  return e;
}

// Decodes `encoded` twice: plainly, and writing, patching and hashing the
// output slice by slice (DecodeChunk with a checksum). Both must give the
// same status and bytes, and the second the chunk checksum of those bytes
// (always for the quantized and log modes, the byte after the version).
// Returns the plain decode's status; `out` holds its bytes.
// A base handed out slice by slice (BaseSlices) from bytes in memory.
class SpanBaseSlices final : public BaseSlices {
 public:
  explicit SpanBaseSlices(ByteSpan base) : base_(base) {}
  uint64_t elements() const override { return base_.size() / 4; }
  void Fill(uint64_t first, uint64_t count, std::byte* out) const override {
    std::memcpy(out, base_.data() + 4 * first, 4 * count);
  }

 private:
  ByteSpan base_;
};

// Decodes `encoded` plainly into `out`, and compares: the sliced and hashed
// decode; for an f32 base, the decode with the base given slice by slice
// (log mode) or made whole from its slices (the others).
inline Status DecodeBothWays(ElementType type, ByteSpan encoded, ByteSpan base, MutableByteSpan out, Scratch* scratch) {
  Status plain = DecodeChunk(type, encoded, base, out, scratch);
  if (type == ElementType::kF32 && !base.empty()) {
    const SpanBaseSlices slices(base);
    std::vector<std::byte> from_slices(out.size(), std::byte{0x5a});
    for (bool hash : {false, true}) {
      std::optional<uint64_t> checksum;
      Status s = DecodeChunk(type, encoded, {}, from_slices, scratch, nullptr, hash ? &checksum : nullptr, {}, &slices);
      EXPECT_EQ(plain.code(), s.code()) << plain.ToString() << " / " << s.ToString();
      if (plain.ok() && s.ok()) {
        EXPECT_TRUE(std::equal(out.begin(), out.end(), from_slices.begin())) << "the decode from base slices differs";
      }
    }
  }
  std::vector<std::byte> sliced(out.size(), std::byte{0xa5});
  std::optional<uint64_t> checksum;
  Status hashed = DecodeChunk(type, encoded, base, sliced, scratch, nullptr, &checksum);
  EXPECT_EQ(plain.code(), hashed.code()) << plain.ToString() << " / " << hashed.ToString();
  if (plain.ok() && hashed.ok()) {
    EXPECT_TRUE(std::equal(out.begin(), out.end(), sliced.begin())) << "the sliced decode differs";
    const bool sliced_mode = encoded.size() > 1 && encoded[1] != std::byte{0};
    EXPECT_EQ(checksum.has_value(), sliced_mode);
    if (checksum) {
      EXPECT_EQ(*checksum, Checksum64(out));
    }
  }
  return plain;
}

// Rewrites the trailing checksum after a test edited a stream on purpose.
inline void Reseal(std::vector<std::byte>* stream) {
  size_t body = stream->size() - 8;
  StoreLE64(stream->data() + body, Checksum64(ByteSpan(stream->data(), body)));
}

}  // namespace ckptfs::lossy::testing
