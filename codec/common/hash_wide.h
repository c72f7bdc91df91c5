// XXH3 built for wider vector units: hash_avx2.cc (compiled with -mavx2) and
// hash_avx512.cc (-mavx512f) each include hash_wide.inc inside their own
// namespace. XXH3 gives the same value on every vector width; these only make
// long inputs faster. Call a namespace's functions only where the CPU has its
// instructions (hash.cc checks once and falls back to the baseline build).
// The streaming functions take an XXH3_state_t* made by the baseline build:
// the state's layout does not depend on the vector width.
#pragma once

#include <cstddef>
#include <cstdint>

#define CKPTFS_DECLARE_WIDE_XXH3(ns)                                                 \
  namespace ckptfs::ns {                                                             \
  uint64_t Xxh3_64(const void* data, size_t size);                                   \
  /* XXH3-128 as (high64, low64). */                                                 \
  void Xxh3_128(const void* data, size_t size, uint64_t* high64, uint64_t* low64);   \
  void Xxh3_64Update(void* state, const void* data, size_t size);                    \
  uint64_t Xxh3_64Digest(const void* state);                                         \
  void Xxh3_128Update(void* state, const void* data, size_t size);                   \
  void Xxh3_128Digest(const void* state, uint64_t* high64, uint64_t* low64);         \
  }

CKPTFS_DECLARE_WIDE_XXH3(hash_avx2)
CKPTFS_DECLARE_WIDE_XXH3(hash_avx512)

#undef CKPTFS_DECLARE_WIDE_XXH3
