#include "codec/tensor/lossy/symbol_groups.h"

#include <cstring>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/kernels_cpu_simd.h"

namespace ckptfs::lossy {

void PackGroups(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out, bool use_simd) {
  if (count == 0) return;  // (the pointers may be null then)
  if (bits == 8) {
    std::memcpy(out, symbols, count);
    return;
  }
  if (use_simd && PackGroupsBmi2(symbols, count, bits, out)) return;
  for (uint64_t g = 0; g < count; g += kPackGroup) {
    uint64_t word = 0;
    for (uint32_t j = 0; j < kPackGroup; ++j) word |= static_cast<uint64_t>(symbols[g + j]) << (j * bits);
    for (uint32_t k = 0; k < bits; ++k) out[k] = std::byte((word >> (8 * k)) & 0xff);
    out += bits;
  }
}

void UnpackGroups(const std::byte* packed, uint64_t count, uint32_t bits, uint8_t* out, bool use_simd) {
  if (count == 0) return;
  if (bits == 8) {
    std::memcpy(out, packed, count);
    return;
  }
  if (use_simd && UnpackGroupsBmi2(packed, count, bits, out)) return;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (uint64_t g = 0; g < count; g += kPackGroup, packed += bits) {
    uint64_t word = 0;
    for (uint32_t k = 0; k < bits; ++k) word |= static_cast<uint64_t>(packed[k]) << (8 * k);
    for (uint32_t j = 0; j < kPackGroup; ++j) out[g + j] = static_cast<uint8_t>((word >> (j * bits)) & mask);
  }
}

}  // namespace ckptfs::lossy
