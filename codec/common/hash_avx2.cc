// Built with -mavx2 (codec/CMakeLists.txt): xxhash.h picks its AVX2 kernels
// from __AVX2__. XXH_INLINE_ALL makes every xxHash function static to this
// file, so none of this AVX2 code can be linked in place of the baseline
// copies in hash.cc. Only C headers are included here for the same reason.
#include "codec/common/hash_avx2.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__) && !defined(__AVX2__)
#error "hash_avx2.cc must be compiled with -mavx2 on x86-64"
#endif

namespace ckptfs::hash_avx2 {

uint64_t Xxh3_64(const void* data, size_t size) { return XXH3_64bits(data, size); }

void Xxh3_128(const void* data, size_t size, uint64_t* high64, uint64_t* low64) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  *high64 = h.high64;
  *low64 = h.low64;
}

}  // namespace ckptfs::hash_avx2
