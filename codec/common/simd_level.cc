#include "codec/common/simd_level.h"

namespace ckptfs {

bool CpuHasSimd(SimdLevel level) {
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  switch (level) {
    case SimdLevel::kScalar: return true;
    case SimdLevel::kAvx2: return avx2;
    case SimdLevel::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return level == SimdLevel::kScalar;
#endif
}

SimdLevel BestSimdLevel() {
  // A function-local constant: the CPU does not change while we run.
  static const SimdLevel best = CpuHasSimd(SimdLevel::kAvx512) ? SimdLevel::kAvx512
                                : CpuHasSimd(SimdLevel::kAvx2) ? SimdLevel::kAvx2
                                                               : SimdLevel::kScalar;
  return best;
}

}  // namespace ckptfs
