// Step-space coding of a first moment (FORMAT.md "Step space"): an f32
// exp_avg chunk is stored as x = m / s with s = sqrt(v) + eps, v the same
// version's reconstructed exp_avg_sq, so that the codec's error budget
// applies to Adam's step m / (sqrt(v) + eps) rather than to m itself. An
// L2 budget on m spends its error on the elements whose m is small, which
// are exactly those whose v is small too and whose step is as large as any:
// measured on the step, the same budget keeps training closer to its
// uninterrupted run (docs/eval.md: charlm +0.10 % against +0.39 % of the
// loss after 10 restores, mean of three seeds, at 1.19x the ratio).
//
// The arithmetic is binary32, round to nearest, no fused operations, so the
// writer and every reader compute the same bits.
#pragma once

#include <cstdint>

#include "codec/common/bytes.h"

namespace ckptfs {

// Adam's default epsilon: the scales only have to be positive and alike in
// writer and reader, which the chunk's parameters ensure by recording it.
inline constexpr float kStepSpaceEps = 1e-8f;
// First moments of tensors below this many elements stay in m: the
// parameters (88 bytes more than a plain chunk's) would outweigh what they
// save.
inline constexpr uint64_t kMinStepSpaceElements = 4096;

// s[i] = sqrtf(v[i]) + eps for the f32 elements of `v` (little-endian);
// false when some s[i] is not finite and > 0 (a negative or non-finite v),
// and the chunk is then not coded in step space. `s` holds v.size() bytes.
bool StepScales(ByteSpan v, float eps, std::byte* s);

// x[i] = m[i] / s[i] (f32). Returns false when some x[i] is not finite (a
// non-finite m, or an overflow, which step space could not give back bit
// for bit); x is written whole either way.
bool DivideByScales(ByteSpan m, const std::byte* s, std::byte* x);

// m[i] = x[i] * s[i] (f32), in place over `x`.
void FromStepSpace(MutableByteSpan x, const std::byte* s);

}  // namespace ckptfs
