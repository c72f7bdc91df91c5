// XXH3 one-shot hashes built for AVX2 (hash_avx2.cc is compiled with
// -mavx2). XXH3 gives the same value on every vector width; this only makes
// long inputs faster. Call only where the CPU has AVX2 (hash.cc checks
// once and falls back to the baseline build).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::hash_avx2 {

uint64_t Xxh3_64(const void* data, size_t size);
// XXH3-128 as (high64, low64).
void Xxh3_128(const void* data, size_t size, uint64_t* high64, uint64_t* low64);

}  // namespace ckptfs::hash_avx2
