#include "codec/optimizer/dither_candidate.h"

#include <cmath>

#include "codec/tensor/lossy/dither.h"

namespace ckptfs {

std::optional<DitheredPrediction> PredictDithered(ByteSpan x, ByteSpan base_x, double rel, uint64_t seed,
                                                  CodecScratch& scratch) {
  const uint64_t n = x.size() / 4;
  if (n == 0 || !(rel > 0) || !std::isfinite(rel)) return std::nullopt;
  std::optional<ScaledBase> scaled = FitScaledBase(x, base_x, scratch);
  if (!scaled) return std::nullopt;
  // The grid's step as a float, and the dither at exactly that step, so that
  // dither and grid cancel.
  const float grid = static_cast<float>(rel * std::sqrt(12.0 * scaled->x2 / static_cast<double>(n)));
  if (!(grid > 0.0f) || !std::isfinite(grid)) return std::nullopt;
  DitheredPrediction out;
  out.grid_step = grid;
  out.dither = DitherTerm{static_cast<double>(grid), seed};
  auto* ids = reinterpret_cast<uint8_t*>(scratch.symbol_contexts.Reserve(n));
  if (!lossy::SubtractDither(out.dither.step, out.dither.seed, scaled->values, ids)) return std::nullopt;
  out.contexts = ByteContexts{ids, lossy::kDitherContexts};
  out.prediction = scaled->prediction;
  return out;
}

}  // namespace ckptfs
