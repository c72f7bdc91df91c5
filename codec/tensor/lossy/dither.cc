#include "codec/tensor/lossy/dither.h"

#include <bit>
#include <cmath>

namespace ckptfs::lossy {

namespace {

uint64_t SplitMix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

double DitherOffset(uint64_t seed, uint64_t i) {
  return static_cast<double>(SplitMix64(seed, i) >> 11) * 0x1p-53 - 0.5;
}

bool SubtractDither(double step, uint64_t seed, MutableByteSpan p, uint8_t* contexts) {
  static_assert(kDitherContexts == 16, "the top four bits of the offset");
  if (!std::isfinite(step) || !(step > 0)) return false;
  const uint64_t n = p.size() / 4;
  for (uint64_t i = 0; i < n; ++i) {
    std::byte* at = p.data() + 4 * i;
    const uint64_t z = SplitMix64(seed, i);
    if (contexts != nullptr) contexts[i] = static_cast<uint8_t>(z >> 60);
    const double offset = step * (static_cast<double>(z >> 11) * 0x1p-53 - 0.5);
    const float v = static_cast<float>(static_cast<double>(std::bit_cast<float>(LoadLE32(at))) - offset);
    if (std::isfinite(v)) StoreLE32(at, std::bit_cast<uint32_t>(v));
  }
  return true;
}

}  // namespace ckptfs::lossy
