// Per-element arithmetic shared verbatim by the CPU reference and the CUDA
// kernels (this header compiles under g++ and nvcc). Everything here is
// integer bit manipulation or single IEEE operations (add, subtract,
// multiply, compare) without contraction, so both backends produce the same
// bits by construction. Plain C++ when not compiled by nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CKPTFS_HD __host__ __device__ __forceinline__
#else
#define CKPTFS_HD inline __attribute__((always_inline))
#endif

namespace ckptfs::lossy {

// Elements per error/norm partial sum, and lanes inside a block. The sum of a
// block is: lane l (0..31) adds the squares of elements i with i % 32 == l in
// increasing order; then for s = 16, 8, 4, 2, 1: lane[l] += lane[l + s]; the
// block's partial is lane[0]. Partials are added in block order on the host.
inline constexpr uint32_t kReduceBlock = 4096;
inline constexpr uint32_t kReduceLanes = 32;
// Histogram of the residual's float bit patterns >> kHistogramShift: sign,
// exponent and the top 5 mantissa bits (32 bins per octave, both signs).
inline constexpr uint32_t kHistogramShift = 18;
inline constexpr uint32_t kHistogramBins = 1u << (32 - kHistogramShift);
inline constexpr uint32_t kMagnitudeBins = kHistogramBins / 2;
// Magnitude bit patterns at or above this are Inf or NaN.
inline constexpr uint32_t kNonFiniteBits = 0x7f800000u;
inline constexpr uint32_t kMaxLevels = 255;  // 2^8 - 1
// Symbols are packed 8 to a group of `bits` bytes.
inline constexpr uint32_t kPackGroup = 8;

CKPTFS_HD uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
CKPTFS_HD float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
CKPTFS_HD uint64_t DoubleBits(double d) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

// IEEE binary16 <-> binary32. HalfToFloat is exact; FloatToHalf rounds to
// nearest even, overflows to Inf, keeps NaN a (quiet) NaN.
CKPTFS_HD float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    // man * 2^-24 is exact in binary32.
    float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return BitsFloat(sign | FloatBits(mag));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}
CKPTFS_HD uint16_t FloatToHalf(float f) {
  uint32_t bits = FloatBits(f);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t a = bits & 0x7fffffffu;
  uint32_t out;
  if (a >= kNonFiniteBits) {
    out = a > kNonFiniteBits ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (a >= 0x477ff000u) {  // >= 65520: rounds to Inf
    out = 0x7c00u;
  } else if (a < 0x38800000u) {  // below 2^-14: subnormal or zero
    // Adding 0.5 (2^-1) aligns the value's bits so that the float adder's
    // round-to-nearest-even does the half rounding.
    float shifted = BitsFloat(a) + 0.5f;
    out = FloatBits(shifted) - 0x3f000000u;
  } else {
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu;  // rebias exponent (-112 << 23) and add the half-ulp - 1
    a += odd;
    out = a >> 13;
  }
  return static_cast<uint16_t>(out | sign);
}
CKPTFS_HD float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }
CKPTFS_HD uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > kNonFiniteBits) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Element traits: the stored bit pattern and its float view.
struct F32Elem {
  using Bits = uint32_t;
  static CKPTFS_HD float ToFloat(Bits b) { return BitsFloat(b); }
  static CKPTFS_HD Bits FromFloat(float f) { return FloatBits(f); }
};
struct F16Elem {
  using Bits = uint16_t;
  static CKPTFS_HD float ToFloat(Bits b) { return HalfToFloat(b); }
  static CKPTFS_HD Bits FromFloat(float f) { return FloatToHalf(f); }
};
struct BF16Elem {
  using Bits = uint16_t;
  static CKPTFS_HD float ToFloat(Bits b) { return Bf16ToFloat(b); }
  static CKPTFS_HD Bits FromFloat(float f) { return FloatToBf16(f); }
};

// The classification thresholds and codebook of one chunk. Both backends
// read the same struct (the GPU copies it to constant/global memory).
struct QuantizeTable {
  uint32_t prune_below = 0;              // |r| bit pattern < this: pruned
  uint32_t exact_from = kNonFiniteBits;  // |r| bit pattern >= this: exact (<= kNonFiniteBits)
  uint32_t bits = 1;                     // symbol width, 1..8
  uint32_t num_levels = 0;               // 0..2^bits - 1
  float levels[kMaxLevels];              // ascending; symbols 1..num_levels
  float bounds[kMaxLevels];              // bounds[j] = (levels[j] + levels[j+1]) / 2, then +Inf
};

// Index of the nearest level of r: the number of bounds below r. Branchless
// binary search over the 255 padded bounds (8 steps).
CKPTFS_HD uint32_t NearestLevel(const float* bounds, float r) {
  uint32_t pos = 0;
  for (uint32_t step = 128; step != 0; step >>= 1) pos += (bounds[pos + step - 1] < r) ? step : 0u;
  return pos;
}

// The outcome of one element: its symbol, reconstructed bits and class.
enum ElementClass : uint32_t { kPruned = 0, kQuantized = 1, kExact = 2 };

template <typename E>
struct ElementResult {
  typename E::Bits recon;
  uint32_t symbol;
  uint32_t cls;
};

// Classifies and quantizes one element: x = value bits, b = base bits
// (has_base false: key frame), r = the residual ToFloat(x) - ToFloat(b).
template <typename E>
CKPTFS_HD ElementResult<E> QuantizeElement(const QuantizeTable& t, typename E::Bits x, typename E::Bits b,
                                           bool has_base, float r) {
  ElementResult<E> out;
  uint32_t mag = FloatBits(r) & 0x7fffffffu;
  if (mag >= t.exact_from) {
    out.recon = x;
    out.symbol = 0;
    out.cls = kExact;
    return out;
  }
  float base = has_base ? E::ToFloat(b) : 0.0f;
  if (mag < t.prune_below || t.num_levels == 0) {
    out.recon = has_base ? b : static_cast<typename E::Bits>(0);
    out.symbol = 0;
    out.cls = kPruned;
    return out;
  }
  uint32_t k = NearestLevel(t.bounds, r);
  out.recon = E::FromFloat(base + t.levels[k]);
  out.symbol = k + 1;
  out.cls = kQuantized;
  return out;
}

// Reconstructs one element from its symbol (exact elements are written
// afterwards from the outlier list).
template <typename E>
CKPTFS_HD typename E::Bits DequantizeElement(const float* levels, uint32_t symbol, typename E::Bits b, bool has_base) {
  if (symbol == 0) return has_base ? b : static_cast<typename E::Bits>(0);
  float base = has_base ? E::ToFloat(b) : 0.0f;
  return E::FromFloat(base + levels[symbol - 1]);
}

// Squared error of one reconstructed element in double (0 for non-finite
// originals, which are always stored exactly).
template <typename E>
CKPTFS_HD double SquaredError(typename E::Bits x, typename E::Bits recon, double* abs_error) {
  float xf = E::ToFloat(x);
  if ((FloatBits(xf) & 0x7fffffffu) >= kNonFiniteBits) {
    *abs_error = 0.0;
    return 0.0;
  }
  double e = static_cast<double>(E::ToFloat(recon)) - static_cast<double>(xf);
  *abs_error = e < 0 ? -e : e;
  return e * e;
}

// Element i's bits of a little-endian array, and their store, on the host.
template <typename E>
typename E::Bits LoadBits(const std::byte* p, uint64_t i) {
  typename E::Bits b;
  std::memcpy(&b, p + i * sizeof b, sizeof b);  // little-endian host (checked in lossy.cc)
  return b;
}
template <typename E>
void StoreBits(std::byte* p, uint64_t i, typename E::Bits b) {
  std::memcpy(p + i * sizeof b, &b, sizeof b);
}

// Folds a block's kReduceLanes lane sums into its partial, in the fixed
// order above: lane[l] += lane[l + s] for s = 16, 8, 4, 2, 1.
CKPTFS_HD double FoldLanes(double* lanes) {
  for (uint32_t s = kReduceLanes / 2; s != 0; s >>= 1)
    for (uint32_t l = 0; l < s; ++l) lanes[l] = lanes[l] + lanes[l + s];
  return lanes[0];
}

// Square of a finite value (0 for Inf/NaN), for the norm.
CKPTFS_HD double FiniteSquare(float xf) {
  if ((FloatBits(xf) & 0x7fffffffu) >= kNonFiniteBits) return 0.0;
  double d = static_cast<double>(xf);
  return d * d;
}

}  // namespace ckptfs::lossy
