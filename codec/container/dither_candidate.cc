#include "codec/container/dither_candidate.h"

#include <bit>
#include <cmath>

#include "codec/common/hash.h"
#include "codec/tensor/lossy/dither.h"
#include "codec/tensor/lossy/step_predictor.h"

namespace ckptfs {

std::optional<DitheredPrediction> PredictDithered(ByteSpan x, ByteSpan base_x, double rel, CodecScratch& scratch) {
  const uint64_t n = x.size() / 4;
  if (base_x.size() != x.size() || n == 0 || !(rel > 0) || !std::isfinite(rel)) return std::nullopt;
  double x2 = 0.0;
  for (uint64_t i = 0; i < n; ++i) {
    const double v = std::bit_cast<float>(LoadLE32(x.data() + 4 * i));
    if (!std::isfinite(v)) return std::nullopt;
    x2 += v * v;
  }
  if (!(x2 > 0) || !std::isfinite(x2)) return std::nullopt;
  // The grid's step as a float, and the dither at exactly that step, so that
  // dither and grid cancel.
  const float grid = static_cast<float>(rel * std::sqrt(12.0 * x2 / static_cast<double>(n)));
  if (!(grid > 0.0f) || !std::isfinite(grid)) return std::nullopt;
  DitheredPrediction out;
  out.grid_step = grid;
  out.dither = DitherTerm{static_cast<double>(grid), Checksum64(x)};
  out.prediction.step.predictor.scale = lossy::FitScale(lossy::ElementType::kF32, x, base_x).value_or(0.0);
  const MutableByteSpan prediction =
      WriteScaledBase(lossy::ElementType::kF32, base_x, out.prediction.step.predictor, scratch);
  if (!lossy::SubtractDither(out.dither.step, out.dither.seed, prediction)) return std::nullopt;
  out.prediction.prediction = prediction;
  const ErrorSums update = MeasureError(DType::kF32, x, base_x);
  out.prediction.update_rel = std::sqrt(update.err2 / x2);
  return out;
}

}  // namespace ckptfs
