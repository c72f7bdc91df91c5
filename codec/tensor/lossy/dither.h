// Subtractive dither of a chunk's prediction (FORMAT.md "Dither").
//
// A quantizer that prunes small residuals and rounds the rest to a few
// levels leaves an error that follows the values: it drops what it cannot
// afford, and what an optimizer's first moment cannot afford to lose is its
// structure (docs/eval.md: the same error energy, made white, no longer
// moves the character LM's loss after its restores). With a subtractive
// dither the decoder subtracts step * d_i from the prediction, d_i a
// pseudo-random offset in [-1/2, 1/2) that writer and reader both derive
// from a seed, and the stream rounds the residual to multiples of the step:
// the reconstruction is then the value plus an error uniform on
// [-step/2, step/2), independent of the value and of its neighbours.
#pragma once

#include <cstdint>

#include "codec/common/bytes.h"

namespace ckptfs::lossy {

// The offset of element i: ((z >> 11) * 2^-53) - 1/2 for z the SplitMix64
// output of seed + (i + 1) * 0x9E3779B97F4A7C15, exact in binary64.
double DitherOffset(uint64_t seed, uint64_t i);

// The symbols of a dithered stream are coded in the context of their
// element's offset (codec/tensor/rans_context.h): given d_i the residual's
// symbol is mostly one of two neighbours with odds that follow d_i, so a
// frequency table per bucket of d_i codes it in fewer bits than one table.
// Element i's context is floor((d_i + 1/2) * kDitherContexts), the top four
// bits of its SplitMix64 output.
inline constexpr uint32_t kDitherContexts = 16;

// p[i] = f32(double(p[i]) - step * DitherOffset(seed, i)) for the f32
// prediction `p`, in place; an element whose result is not finite keeps its
// value. Binary64, round to nearest, no fused operations: writer and reader
// compute the same bits. With `contexts`, element i's context goes to
// contexts[i] in the same pass (p.size() / 4 of them). false when step is
// not finite and > 0.
bool SubtractDither(double step, uint64_t seed, MutableByteSpan p, uint8_t* contexts = nullptr);

}  // namespace ckptfs::lossy
