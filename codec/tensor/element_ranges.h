// The byte ranges of each byte plane of a float chunk's non-zero elements,
// gathered while the chunk is scanned (its blocks are then in L1), so that
// the rANS model of a plane needs no pass of its own over the plane.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "codec/common/simd_level.h"
#include "codec/tensor/rans.h"

namespace ckptfs {

class ElementByteRanges {
 public:
  // Elements of `width` bytes, width in {2, 4}.
  explicit ElementByteRanges(size_t width);

  // Adds the elements in[0, count * width) whose bytes are not all zero.
  // REQUIRES: CpuHasSimd(level) (every level gives the same ranges).
  void Add(const std::byte* in, size_t count, SimdLevel level = BestSimdLevel());

  // The ranges of plane k (byte k of every element) of the elements added,
  // and of a zero byte too with `with_zero` (a dense chunk with zero
  // elements: they are in its planes).
  rans::ByteRanges Plane(size_t k, bool with_zero) const;

 private:
  static constexpr size_t kLanes = 64;
  size_t width_;
  // Running unsigned min and max and signed min and max of the bytes; byte
  // lane j holds plane j % width_'s.
  alignas(64) std::array<std::array<uint8_t, kLanes>, 4> lanes_;
};

}  // namespace ckptfs
