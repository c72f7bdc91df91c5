// EncodeChunk: residual -> histogram -> configuration search -> quantize,
// measure, (retry finer) -> exact list -> zstd. See LOSSY.md.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "codec/common/hash.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/level_gain.h"
#include "codec/tensor/lossy/log_codec.h"
#include "codec/tensor/lossy/lossy.h"
#include "codec/tensor/lossy/schedule.h"
#include "codec/tensor/lossy/scratch.h"
#include "codec/tensor/lossy/search.h"
#include "codec/tensor/lossy/stream.h"
#include "codec/tensor/lossy/symbol_stream.h"
#include "codec/tensor/lossy/trellis.h"

namespace ckptfs::lossy {

static_assert(std::endian::native == std::endian::little, "the lossy codec assumes a little-endian host");

namespace {

// The search aims at this share of the budget: its histogram estimate is
// within a few percent, and every unused share of the budget costs bits
// (0.85 left 15-27 % of it unused on the eval's checkpoints). A measured
// miss searches again with a tighter target; after kMaxAttempts, lossless.
constexpr double kEstimateSafety = 0.95;
constexpr int kMaxAttempts = 4;
// Unbiased levels: a gain within a thousandth of 1 is not worth the second
// pass; one is at most kMaxGain (far above 1 the levels are not what shrank
// the chunk, as when almost all of it is pruned).
constexpr double kMinGain = 1.001;
constexpr double kMaxGain = 2.0;
// A gain held by an allowance above the budget (first moments) is aimed
// this far inside it: the closed form's error and the quantized one differ
// by the rounding of the scaled levels (3e-8 to 5e-7 of the cap, measured
// on `mlp-init` v1's capped weights; 9 of 30 first moments of the unit
// test landed past it), and a gain that lands past the cap is dropped,
// costing a third quantization pass and the unbiasing.
// Weights (allowance 1: the gain takes the room the search left under the
// budget) keep the cap itself: aimed inside it, every held gain put their
// reconstruction at the budget where a rounding past it had left some
// below, and bf16 copies predicted from those fp32 masters then needed
// more bits (`mixed` v1 5 % larger, its copies at 2 bits instead of 1).
constexpr double kGainCapMargin = 1e-5;
// A miss scales the target by this times allowed / measured.
constexpr double kRetryScale = 0.9;
// A delta frame is tried as unchanged when its residual's estimated energy
// is at most this share of the allowed error (the estimate is within about
// 2 %; the measurement decides).
constexpr double kUnchangedGate = 1.03;
// A delta frame whose residual carries at least this share of the values'
// energy may be cheaper as a key frame (e.g. Adam's exp_avg, which forgets
// its past within tens of steps): then both are searched and the smaller
// estimate wins.
constexpr double kTryKeyFrameEnergyShare = 0.25;

double SumInOrder(std::span<const double> partials) {
  double s = 0.0;
  for (double p : partials) s += p;
  return s;
}

Result<EncodedChunk> EncodeLossless(ElementType type, ByteSpan values, ByteSpan base, Scratch::Buffers& s, int level,
                                    MutableByteSpan reconstruction_out) {
  EncodedChunk chunk;
  size_t width = ElementSize(type);
  StreamHeader h;
  h.mode = StreamMode::kLossless;
  h.type = type;
  h.flags = (base.empty() ? 0 : kFlagDelta) | kFlagCompactHeader;
  h.element_count = values.size() / width;
  EnsureSize(&s.planes, values.size());
  MutableByteSpan planes(s.planes.data(), values.size());
  SplitPlanes(values, base, width, planes);
  ASSIGN_OR_RETURN(ByteSpan main, CompressZstd(s.cctx.get(), level, planes, &s.zstd_main));
  h.main_size = main.size();
  chunk.bytes.reserve(StreamHeader::kEncodedSize + main.size() + kTrailerSize);
  h.EncodeTo(&chunk.bytes);
  ByteWriter(&chunk.bytes).Bytes(main);
  AppendChecksum(&chunk.bytes);
  if (reconstruction_out.empty()) {
    chunk.reconstruction.assign(values.begin(), values.end());
  } else if (!values.empty()) {
    std::memcpy(reconstruction_out.data(), values.data(), values.size());
  }
  chunk.stats.bits = 0;
  chunk.stats.exact = h.element_count;
  return chunk;
}

}  // namespace

size_t ElementSize(ElementType type) { return type == ElementType::kF32 ? 4 : 2; }

Result<ElementType> ElementTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ElementType::kF32;
    case DType::kF16: return ElementType::kF16;
    case DType::kBF16: return ElementType::kBF16;
    default:
      return Status::InvalidArgument("lossy codec: want an f32/f16/bf16 tensor, have dtype " +
                                     std::string(DTypeName(dtype)));
  }
}

Scratch::Scratch() : buffers_(std::make_unique<Buffers>()) {}
Scratch::~Scratch() = default;

Result<EncodedChunk> EncodeChunk(ElementType type, ByteSpan values, ByteSpan base, const Budget& configured,
                                 Scratch* scratch, const EncodeOptions& options) {
  Budget budget = configured;
  if (type != ElementType::kF32 && type != ElementType::kF16 && type != ElementType::kBF16)
    return Status::InvalidArgument("lossy encode: element type, want 1..3 have " +
                                   std::to_string(static_cast<int>(type)));
  const size_t width = ElementSize(type);
  if (values.size() % width != 0)
    return Status::InvalidArgument("lossy encode: byte size " + std::to_string(values.size()) +
                                   " is not a multiple of the element size " + std::to_string(width));
  if (!base.empty() && base.size() != values.size())
    return Status::InvalidArgument("lossy encode: base size, want=" + std::to_string(values.size()) +
                                   " have=" + std::to_string(base.size()));
  const uint64_t n = values.size() / width;
  if (n > UINT32_MAX) return Status::InvalidArgument("lossy encode: chunk over 2^32 - 1 elements");
  if (!(budget.rel_l2 >= 0) || !(budget.max_abs >= 0) || !(budget.max_rel >= 0))
    return Status::InvalidArgument("lossy encode: budget fields must be >= 0");
  if (budget.max_rel > 0 && (budget.rel_l2 > 0 || budget.max_abs > 0))
    return Status::InvalidArgument("lossy encode: max_rel (log mode) is used alone, without rel_l2 or max_abs");
  if (!options.reconstruction_out.empty() && options.reconstruction_out.size() != values.size())
    return Status::InvalidArgument("lossy encode: reconstruction_out size, want=" + std::to_string(values.size()) +
                                   " have=" + std::to_string(options.reconstruction_out.size()));
  Scratch::Buffers& s = scratch->buffers();
  if (!s.cctx) s.cctx.reset(ZSTD_createCCtx());
  if (!s.cctx) return Status::NoMemory("lossy encode: zstd context");
  if (!s.cpu_kernels) s.cpu_kernels = MakeCpuKernels();
  LossyKernels& k = options.kernels ? *options.kernels : *s.cpu_kernels;

  if (n == 0 || !budget.lossy()) {
    ASSIGN_OR_RETURN(EncodedChunk chunk,
                     EncodeLossless(type, values, base, s, options.zstd_level, options.reconstruction_out));
    chunk.stats.budget = budget;
    return chunk;
  }
  if (budget.max_rel > 0) {
    // Log mode runs on the host for either backend (one pass per element);
    // the budget schedule does not apply to it (its bound is per element).
    ASSIGN_OR_RETURN(std::optional<EncodedChunk> log, EncodeLogChunk(type, values, base, budget.max_rel, s,
                                                                     options.zstd_level, options.reconstruction_out));
    EncodedChunk chunk;
    if (log) {
      chunk = std::move(*log);
    } else {
      ASSIGN_OR_RETURN(chunk, EncodeLossless(type, values, base, s, options.zstd_level, options.reconstruction_out));
    }
    chunk.stats.budget = budget;
    return chunk;
  }

  // 1. Residual and the squared norm of the finite values.
  const uint64_t blocks = ReduceBlocks(n);
  EnsureSize(&s.residual, n);
  EnsureSize(&s.norm_partials, blocks);
  EnsureSize(&s.error_partials, blocks);
  std::span<float> residual(s.residual.data(), n);
  std::span<double> norm_partials(s.norm_partials.data(), blocks);
  std::span<double> error_partials(s.error_partials.data(), blocks);
  RETURN_IF_ERROR(k.Residual(type, values, base, residual, norm_partials));
  const double norm_sq = SumInOrder(norm_partials);

  // 2. Histogram and search targets.
  s.histogram.resize(kHistogramBins);
  RETURN_IF_ERROR(k.Histogram(residual, s.histogram));
  // 2a. Dynamic precision: the update's size comes from the residual
  // histogram (integer counts: deterministic, and no extra pass).
  double update_rel = 0.0;
  if (options.schedule != nullptr && options.schedule->enabled() && !options.source_unchanged && !base.empty() &&
      norm_sq > 0) {
    update_rel = options.measured_update ? *options.measured_update : std::sqrt(EstimateEnergy(s.histogram) / norm_sq);
    budget = EffectiveBudget(*options.schedule, configured, update_rel);
  }
  const double inf = std::numeric_limits<double>::infinity();
  const double allowed_sq = budget.rel_l2 > 0 ? budget.rel_l2 * budget.rel_l2 * norm_sq : inf;
  const double allowed_abs = budget.max_abs > 0 ? budget.max_abs : inf;
  SearchTarget target{allowed_sq * kEstimateSafety, allowed_abs * kEstimateSafety};

  const uint32_t width32 = static_cast<uint32_t>(width);
  const bool uniform = options.uniform_step > 0.0f && !base.empty();
  const bool unbiased = options.unbiased_levels && type == ElementType::kF32 && !uniform && !(allowed_abs < inf) &&
                        budget.rel_l2 > 0;
  const double allowance = std::max(1.0, options.unbias_allowance);
  float uniform_step = options.uniform_step;
  std::optional<SearchResult> found = uniform ? UniformGridConfig(s.histogram, uniform_step)
                                              : SearchConfig(s.histogram, n, width32, target);

  // 2c. Unchanged within the budget: a delta frame whose whole residual
  // fits is first tried with every element pruned (the base's values, a
  // few bytes). It is tried and measured, not searched, so the estimate's
  // safety margin does not apply: a version equal to its base costs nothing
  // whenever the base met the budget, however close to it.
  std::optional<SearchResult> unchanged;
  if (!uniform && !base.empty() && EstimateEnergy(s.histogram) <= allowed_sq * kUnchangedGate)
    unchanged = AllPrunedConfig(s.histogram, allowed_abs);

  // 2a'. The caller's alternative base: is its residual cheaper?
  bool on_alternative = false;
  if (!uniform && !unchanged && !base.empty() && options.alternative_base.size() == base.size()) {
    EnsureSize(&s.residual_alt, n);
    s.histogram_alt.resize(kHistogramBins);
    std::span<float> alt_residual(s.residual_alt.data(), n);
    RETURN_IF_ERROR(k.Residual(type, values, options.alternative_base, alt_residual, norm_partials));
    RETURN_IF_ERROR(k.Histogram(alt_residual, s.histogram_alt));
    std::optional<SearchResult> alt = SearchConfig(s.histogram_alt, n, width32, target);
    if (alt && (!found || alt->est_bytes < found->est_bytes)) {
      base = options.alternative_base;
      residual = alt_residual;
      std::swap(s.histogram, s.histogram_alt);
      std::swap(s.residual, s.residual_alt);  // `residual` keeps pointing at the winner's data
      found = alt;
      on_alternative = true;
    }
  }

  // 2b. A delta frame with a large residual: is a key frame cheaper?
  if (!uniform && !unchanged && !base.empty() && EstimateEnergy(s.histogram) >= kTryKeyFrameEnergyShare * norm_sq) {
    EnsureSize(&s.residual_alt, n);
    s.histogram_alt.resize(kHistogramBins);
    std::span<float> key_residual(s.residual_alt.data(), n);
    RETURN_IF_ERROR(k.Residual(type, values, {}, key_residual, norm_partials));  // same norm: it is of the values
    RETURN_IF_ERROR(k.Histogram(key_residual, s.histogram_alt));
    std::optional<SearchResult> key = SearchConfig(s.histogram_alt, n, width32, target);
    if (key && (!found || key->est_bytes < found->est_bytes)) {
      base = {};
      residual = key_residual;
      std::swap(s.histogram, s.histogram_alt);
      std::swap(s.residual, s.residual_alt);  // `residual` keeps pointing at the key frame's data
      found = key;
      on_alternative = false;
    }
  }

  EncodedChunk chunk;
  MutableByteSpan recon = options.reconstruction_out;
  if (recon.empty()) {
    chunk.reconstruction.resize(values.size());
    recon = chunk.reconstruction;
  }
  // Attempt -1 is the unchanged candidate; then the search's choice, and
  // searches at tightened targets.
  for (int attempt = unchanged ? -1 : 0; attempt < kMaxAttempts; ++attempt) {
    if (attempt > 0)
      found = uniform ? UniformGridConfig(s.histogram, uniform_step) : SearchConfig(s.histogram, n, width32, target);
    if (attempt >= 0 && !found) break;
    const QuantizeTable& table = attempt < 0 ? unchanged->table : found->table;

    // 3. Quantize, reconstruct and measure.
    uint64_t packed_bytes = PackedBytes(n, table.bits);
    EnsureSize(&s.packed, packed_bytes);
    MutableByteSpan packed(s.packed.data(), packed_bytes);
    double max_abs = 0.0;
    ClassCounts counts;
    RETURN_IF_ERROR(
        k.QuantizePack(type, table, values, base, residual, packed, recon, error_partials, &max_abs, &counts));
    double error_sq = SumInOrder(error_partials);
    const bool fits = error_sq <= allowed_sq && max_abs <= allowed_abs;
    // 3b. Unbiased levels: the configuration that fits gets its levels
    // scaled by the gain (level_gain.h), the same symbols, as far as the
    // error stays within the allowance times the budget: its quantized
    // elements are reconstructed again from their symbols (Relevel; a
    // rounding that misses the allowance keeps the levels as they were).
    std::optional<QuantizeTable> gained;
    if (unbiased && fits && attempt >= 0 && table.num_levels > 0) {
      const double cap_sq = allowance * allowance * allowed_sq;
      const double g =
          UnbiasingGain(GainSums::Of(residual, recon, base, table.exact_from),
                        allowance > 1 ? cap_sq * (1 - kGainCapMargin) : cap_sq);
      if (g > kMinGain) gained = ScaledLevels(table, std::min(g, kMaxGain));
      if (gained) {
        RETURN_IF_ERROR(
            k.Relevel(type, *gained, values, base, residual, packed, recon, error_partials, &max_abs, &counts));
        const double gained_sq = SumInOrder(error_partials);
        if (gained_sq <= cap_sq) {
          error_sq = gained_sq;
        } else {
          gained.reset();
          RETURN_IF_ERROR(
              k.Relevel(type, table, values, base, residual, packed, recon, error_partials, &max_abs, &counts));
        }
      }
    }
    const QuantizeTable& coded = gained ? *gained : table;
    if (!fits && attempt < 0) continue;
    if (!fits) {
      // Step finer: tighten the estimate's target by the measured overshoot.
      // The estimate is close (a miss is mostly the rounding of 16-bit
      // outputs, about 5 % of a 1e-2 budget for bf16), so the step is
      // gentle: halving the target could leave nothing that fits it.
      double scale_sq =
          error_sq > 0 && std::isfinite(error_sq) ? std::min(kRetryScale, allowed_sq / error_sq * kRetryScale) : 0.5;
      double scale_abs =
          max_abs > 0 && std::isfinite(max_abs) ? std::min(kRetryScale, allowed_abs / max_abs * kRetryScale) : 0.5;
      if (error_sq > allowed_sq) target.max_error_sq *= scale_sq;
      if (max_abs > allowed_abs) target.max_abs *= scale_abs;
      // A grid's error scales with its step squared.
      if (uniform) uniform_step *= static_cast<float>(std::sqrt(std::min(scale_sq, scale_abs * scale_abs)));
      continue;
    }

    // 4. Exact list.
    EnsureSize(&s.exact_positions, counts.exact);
    EnsureSize(&s.exact_raw, counts.exact * width);
    uint64_t exact = 0;
    if (counts.exact > 0) {
      RETURN_IF_ERROR(k.CompactExact(type, coded, values, residual, s.exact_positions, s.exact_raw, &exact));
    }
    if (exact != counts.exact)
      return Status::Internal("lossy encode: exact count, want=" + std::to_string(counts.exact) +
                              " have=" + std::to_string(exact));
    BuildExactList(std::span<const uint32_t>(s.exact_positions.data(), exact),
                   ByteSpan(s.exact_raw.data(), exact * width), &s.exact_list);

    // 5. Stream.
    StreamHeader h;
    h.mode = StreamMode::kQuantized;
    h.type = type;
    h.bits = static_cast<uint8_t>(table.bits);
    h.flags = (base.empty() ? 0 : kFlagDelta) | kFlagCompactHeader;
    h.num_levels = table.num_levels;
    h.element_count = n;
    h.exact_count = exact;
    h.exact_raw_size = exact == 0 ? 0 : s.exact_list.size();
    ASSIGN_OR_RETURN(SymbolStream symbols,
                     CompressSymbols(s, options.zstd_level, packed, table.bits, n, options.symbol_contexts));
    const ByteSpan main = symbols.bytes;
    h.version = StreamHeader::VersionFor(h.mode, symbols.rans, symbols.contexts);
    ByteSpan exact_z;
    if (exact > 0) {
      ASSIGN_OR_RETURN(exact_z, CompressZstd(s.cctx.get(), options.zstd_level, s.exact_list, &s.zstd_exact));
    }
    h.main_size = main.size();
    h.exact_size = exact_z.size();
    chunk.bytes.clear();
    chunk.bytes.reserve(StreamHeader::kEncodedSize + 4 * table.num_levels + main.size() + exact_z.size() +
                        kTrailerSize);
    h.EncodeTo(&chunk.bytes);
    ByteWriter w(&chunk.bytes);
    for (uint32_t j = 0; j < coded.num_levels; ++j) w.U32(FloatBits(coded.levels[j]));
    w.Bytes(main);
    w.Bytes(exact_z);
    AppendChecksum(&chunk.bytes);
    // A lossy stream larger than the raw values is pointless: store exactly.
    if (chunk.bytes.size() >= values.size()) break;

    chunk.stats.bits = h.bits;
    chunk.stats.mode = static_cast<uint8_t>(StreamMode::kQuantized);
    chunk.stats.pruned = counts.pruned;
    chunk.stats.quantized = counts.quantized;
    chunk.stats.exact = counts.exact;
    chunk.stats.max_abs = max_abs;
    chunk.stats.rel_l2 = norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : (error_sq > 0 ? inf : 0.0);
    chunk.stats.budget = budget;
    chunk.stats.update_rel = update_rel;
    chunk.stats.err2_sum = error_sq;
    chunk.stats.ref2_sum = norm_sq;
    chunk.stats.used_alternative_base = on_alternative;
    // 6. Trellis-coded quantization: the same residual, kept when smaller.
    if (options.trellis && attempt >= 0 && !uniform && !(allowed_abs < inf)) {
      EnsureSize(&s.trellis_recon, values.size());
      MutableByteSpan trellis_recon(s.trellis_recon.data(), values.size());
      ASSIGN_OR_RETURN(std::optional<EncodedChunk> t,
                       EncodeTrellisChunk(type, values, base, residual, norm_sq, allowed_sq, chunk.bytes.size(), s,
                                          options.zstd_level, trellis_recon));
      if (t) {
        std::memcpy(recon.data(), trellis_recon.data(), values.size());
        chunk.bytes = std::move(t->bytes);
        t->stats.budget = budget;
        t->stats.update_rel = update_rel;
        t->stats.used_alternative_base = on_alternative;
        chunk.stats = t->stats;
      }
    }
    return chunk;
  }
  ASSIGN_OR_RETURN(EncodedChunk lossless,
                   EncodeLossless(type, values, base, s, options.zstd_level, options.reconstruction_out));
  lossless.stats.budget = budget;
  lossless.stats.update_rel = update_rel;
  lossless.stats.ref2_sum = norm_sq;
  lossless.stats.used_alternative_base = on_alternative && !base.empty();
  return lossless;
}

}  // namespace ckptfs::lossy
