// Groups of eight b-bit symbols (1 <= b <= 8) in b bytes: symbol j of a group
// at bits [j*b, j*b + b) of its little-endian value (LOSSY.md section 5.3).
// Whole groups are also the start of the log mode's bit string (section 9).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::lossy {

// Packs `count` symbols (a multiple of 8, each < 2^bits) into count / 8 * bits
// bytes; with use_simd, by BMI2 PEXT where the CPU has it.
void PackGroups(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out, bool use_simd);

// The inverse: `count` symbols (a multiple of 8) from count / 8 * bits bytes;
// with use_simd, by BMI2 PDEP where the CPU has it (one byte at a time, this
// loop was 8 % of a key frame's encode).
void UnpackGroups(const std::byte* packed, uint64_t count, uint32_t bits, uint8_t* out, bool use_simd = true);

}  // namespace ckptfs::lossy
