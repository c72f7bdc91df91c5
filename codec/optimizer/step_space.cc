#include "codec/optimizer/step_space.h"

#include <bit>
#include <cmath>

namespace ckptfs {
namespace {

[[gnu::always_inline]] inline float Load(const std::byte* p, size_t i) { return std::bit_cast<float>(LoadLE32(p + 4 * i)); }
[[gnu::always_inline]] inline void Store(std::byte* p, size_t i, float f) { StoreLE32(p + 4 * i, std::bit_cast<uint32_t>(f)); }

}  // namespace

// Each loop also has an AVX2 clone, chosen when the process starts (the
// same IEEE operations eight lanes wide: the same bits).
#if defined(__x86_64__)
#define CKPTFS_STEP_SPACE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CKPTFS_STEP_SPACE_CLONES
#endif

CKPTFS_STEP_SPACE_CLONES bool StepScales(ByteSpan v, float eps, std::byte* s) {
  const size_t n = v.size() / 4;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    const float x = Load(v.data(), i);
    const float scale = std::sqrt(x) + eps;  // NaN for x < 0 or NaN
    ok &= std::isfinite(scale) && scale > 0;
    Store(s, i, scale);
  }
  return ok;
}

CKPTFS_STEP_SPACE_CLONES bool DivideByScales(ByteSpan m, const std::byte* s, std::byte* x) {
  const size_t n = m.size() / 4;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    const float q = Load(m.data(), i) / Load(s, i);
    ok &= std::isfinite(q);
    Store(x, i, q);
  }
  return ok;
}

CKPTFS_STEP_SPACE_CLONES void FromStepSpace(MutableByteSpan x, const std::byte* s) {
  const size_t n = x.size() / 4;
  for (size_t i = 0; i < n; ++i) Store(x.data(), i, Load(x.data(), i) * Load(s, i));
}

}  // namespace ckptfs
