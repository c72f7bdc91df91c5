// The unbiasing gain of a quantized chunk's levels. A quantizer that
// minimizes the squared error shrinks what it codes: with levels at the
// centroids of their cells the reconstruction's projection on the residual
// is |r|^2 (1 - rel_l2^2), and pruned elements come back as the base's.
// For Adam's first moment that made every step after a restore shorter
// (0.80-0.98 of the original's at the default budget on the eval's runs,
// docs/eval.md "What one restore does"), and training fell behind its
// uninterrupted run. Scaling the levels by
//
//   g = sum r_i^2 / sum (x_hat_i - b_i) r_i   over the elements not stored exactly
//
// makes <x_hat - b, r> = <r, r>: unbiased on average. The decision bounds
// stay (the same symbols); the stream carries its levels, so the decoder is
// unchanged. The error grows, about from rel_l2 to rel_l2 / sqrt(1 -
// rel_l2^2) for centroid levels (0.5 -> 0.58).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "codec/common/bytes.h"
#include "codec/common/simd_level.h"
#include "codec/tensor/lossy/element_ops.h"

namespace ckptfs::lossy {

// Sums over the elements of a quantized f32 chunk that are not stored
// exactly (|r| bit pattern below exact_from), in double: r = x - b the
// residual, d = x_hat - b the reconstruction's (b = 0 for a key frame).
// They run in a fixed order (eight partial sums by element index mod 8,
// then added in lane order; an exact element adds +0): every machine and
// every SIMD level (max_simd caps it; kScalar the reference) gets the same
// sums bit for bit.
struct GainSums {
  double rr = 0;  // sum r^2
  double dr = 0;  // sum d r
  double dd = 0;  // sum d^2
  // REQUIRES: recon (and base, unless empty) as many f32 elements as residual.
  static GainSums Of(std::span<const float> residual, ByteSpan recon, ByteSpan base, uint32_t exact_from,
                     SimdLevel max_simd = SimdLevel::kAvx512);
};

// The gain g = rr / dr, lowered so that the error of the scaled
// reconstruction, g^2 dd - 2 g dr + rr (the exact elements add none), stays
// within cap_sq; 1 when dr <= 0, when not even g = 1 keeps it, or when the
// result is not finite. At most rr / dr: never past unbiased.
double UnbiasingGain(const GainSums& sums, double cap_sq);

// `table` with every level multiplied by g (rounded to f32), bounds and
// thresholds unchanged; nullopt when a scaled level is not finite.
std::optional<QuantizeTable> ScaledLevels(const QuantizeTable& table, double g);

}  // namespace ckptfs::lossy
