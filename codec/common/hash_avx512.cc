// XXH3 with AVX-512 kernels (compiled with -mavx512f, codec/CMakeLists.txt).
#if defined(__x86_64__) && !defined(__AVX512F__)
#error "hash_avx512.cc must be compiled with -mavx512f on x86-64"
#endif
#define CKPTFS_HASH_NS hash_avx512
#include "codec/common/hash_wide.inc"
