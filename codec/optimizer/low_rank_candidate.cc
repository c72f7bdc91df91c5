#include "codec/optimizer/low_rank_candidate.h"

#include <bit>
#include <cmath>

#include "codec/tensor/lossy/low_rank.h"
#include "codec/tensor/lossy_chunk_codec.h"

namespace ckptfs {
namespace {

// Bits per element the quantizer spends on a residual of `ratio` times the
// error energy it may leave (the search aims at 0.85 of the budget): about
// nothing at or below 1, then about 0.75 bits per doubling of the energy,
// fitted to the codec's first moments on the eval's workloads
// (docs/eval.md: 1.1-1.3 bits at a ratio of 2.5-3).
double StreamBitsPerElement(double ratio) { return ratio <= 1 ? 0.03 : 0.03 + 0.75 * std::log2(ratio); }

}  // namespace

std::optional<uint64_t> ChunkColumns(const TensorInfo& tensor, uint64_t first, uint64_t n) {
  if (tensor.shape.size() < 2) return std::nullopt;
  uint64_t columns = 1;
  for (size_t d = 1; d < tensor.shape.size(); ++d) {
    if (tensor.shape[d] == 0 || columns > UINT64_MAX / tensor.shape[d]) return std::nullopt;
    columns *= tensor.shape[d];
  }
  if (columns < 8 || first % columns != 0 || n % columns != 0 || n / columns < 8) return std::nullopt;
  if (columns > UINT32_MAX) return std::nullopt;
  return columns;
}

std::optional<LowRankCandidate> PredictLowRank(ByteSpan x, ByteSpan base_x, uint64_t columns, double budget_rel_l2,
                                               CodecScratch& scratch) {
  const uint64_t n = x.size() / 4;
  if (base_x.size() != x.size() || n == 0 || columns == 0 || n % columns != 0 || !(budget_rel_l2 > 0)) return std::nullopt;
  const uint64_t rows = n / columns;
  // The present prediction (a fitted fraction of the base) and what it leaves.
  std::optional<ScaledBase> scaled = FitScaledBase(x, base_x, scratch);
  if (!scaled) return std::nullopt;
  const MutableByteSpan prediction = scaled->values;
  auto* residual = reinterpret_cast<double*>(scratch.low_rank.Reserve(8 * n));
  for (uint64_t i = 0; i < n; ++i) {
    const double v = std::bit_cast<float>(LoadLE32(x.data() + 4 * i));
    const double p = std::bit_cast<float>(LoadLE32(prediction.data() + 4 * i));
    if (!std::isfinite(v) || !std::isfinite(p)) return std::nullopt;
    residual[i] = v - p;
  }
  const double x2 = scaled->x2;
  const lossy::LowRankFit fit = lossy::FitLowRank(residual, rows, columns, lossy::kMaxLowRank);
  // The rank whose factors plus modelled stream cost least, if any beats none.
  const double target = 0.85 * budget_rel_l2 * budget_rel_l2 * x2;
  auto cost = [&](uint32_t k) {
    const double factor_bits = k == 0 ? 0.0 : 8.0 * static_cast<double>(lossy::LowRankBlockSize(rows, columns, k));
    return factor_bits + static_cast<double>(n) * StreamBitsPerElement(fit.energy_left[k] / target);
  };
  uint32_t best = 0;
  for (uint32_t k = 1; k <= fit.rank; ++k)
    if (cost(k) < cost(best)) best = k;
  if (best == 0) return std::nullopt;
  LowRankCandidate out;
  out.prediction = scaled->prediction;
  out.block = lossy::TruncateLowRank(fit, rows, columns, best);
  if (!lossy::AddLowRank(out.block, rows, columns, best, prediction)) return std::nullopt;
  out.term = LowRankTerm{static_cast<uint32_t>(columns), best, out.block.size()};
  return out;
}

}  // namespace ckptfs
