// The step prediction's element kernels (step_predictor.h), shared by the
// prediction and the fit in step_predictor.cc: the steps u = m / (sqrt(v) +
// eps) of a block of elements, and p = scale * w_base + step * u +
// base_step * u_base rounded to the weights' type. Each has a portable and
// an AVX2 form that write the same bits (a decoder input: this folder is
// compiled without FMA contraction). Internal to codec/tensor/lossy/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/step_predictor.h"

#if defined(__x86_64__)
#define CKPTFS_STEP_AVX2 __attribute__((target("avx2")))
#endif

namespace ckptfs::lossy::step_kernels {

template <typename E>
[[gnu::always_inline]] inline double LoadAs(const std::byte* p, uint64_t i) {
  typename E::Bits bits;
  std::memcpy(&bits, p + i * sizeof bits, sizeof bits);
  return E::ToFloat(bits);
}

// The kernels below work in blocks: the steps u (and u_base) of a block are
// computed first, 4 lanes wide with AVX2 when the state is f32 (the square
// roots and divisions were most of a predicted chunk's time, and the
// element loop did not vectorize), then combined in element order. The
// vector lanes do the same IEEE binary64 operations in the same order as
// the portable code (no FMA), so both write the same bits.
constexpr uint64_t kBlock = 256;

// Which kernels a call uses: the vector ones when the CPU has AVX2.
struct StepKernels {
  bool avx2 = false;
  static StepKernels Best() { return StepKernels{CpuHasSimd(SimdLevel::kAvx2)}; }
};

// u of elements [first, first + count) into u, in binary64 or (f32_steps,
// T = float, eps rounded to binary32) binary32; all 0 without m. S: the
// state's element type (F32Elem, F16Elem, BF16Elem).
template <typename S, typename T>
void Steps(StepKernels kernels, const std::byte* m, const std::byte* v, T eps, uint64_t first, uint64_t count, T* u);

// p of `count` (<= kBlock) elements from their steps (T: double, or float
// for f32_steps, when p is computed in binary32), rounded to the weights'
// type W: wb_p and o point at the block's first element.
template <typename W, typename T>
void CombineBlock(StepKernels kernels, const StepPredictor& pr, const std::byte* wb_p, const T* u, const T* ub,
                  uint64_t count, std::byte* o);

}  // namespace ckptfs::lossy::step_kernels
