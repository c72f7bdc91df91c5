// The vector instruction sets that the kernels (byte planes, zero
// elements, rANS, the XXH3 checksums) have paths for. Every kernel family
// also has a portable path, and all paths of a family write the same bytes;
// tests run each level the CPU has against the portable one.
#pragma once

namespace ckptfs {

enum class SimdLevel {
  kScalar,
  kAvx2,    // AVX2 and POPCNT
  kAvx512,  // AVX-512 F, BW and VL, and POPCNT (with AVX2)
};

// Whether this CPU runs `level`.
bool CpuHasSimd(SimdLevel level);

// The widest level the CPU runs, found once per process.
SimdLevel BestSimdLevel();

}  // namespace ckptfs

// Code that uses AVX-512 intrinsics sits between these two: GCC 12's
// intrinsics start from self-initialised "undefined" vectors, which
// -Wuninitialized and -Wmaybe-uninitialized report once they are inlined
// (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#define CKPTFS_BEGIN_AVX512_CODE                                \
  _Pragma("GCC diagnostic push")                                \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")       \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define CKPTFS_END_AVX512_CODE _Pragma("GCC diagnostic pop")
#else
#define CKPTFS_BEGIN_AVX512_CODE
#define CKPTFS_END_AVX512_CODE
#endif
