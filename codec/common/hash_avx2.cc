// XXH3 with AVX2 kernels (compiled with -mavx2, codec/CMakeLists.txt).
#if defined(__x86_64__) && !defined(__AVX2__)
#error "hash_avx2.cc must be compiled with -mavx2 on x86-64"
#endif
#define CKPTFS_HASH_NS hash_avx2
#include "codec/common/hash_wide.inc"
