// The CPU reference of the lossy kernels (the spec of kernels.h). Compiled
// with -ffp-contract=off: reconstruction and error sums must not fuse
// multiply-adds, so that the GPU (-fmad=false) reproduces them bit for bit.
#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/kernels_cpu_simd.h"
#include "codec/tensor/lossy/symbol_groups.h"

namespace ckptfs::lossy {
namespace {

template <typename E>
constexpr ElementType TypeOf() {
  if constexpr (std::is_same_v<E, F32Elem>)
    return ElementType::kF32;
  else if constexpr (std::is_same_v<E, F16Elem>)
    return ElementType::kF16;
  else
    return ElementType::kBF16;
}

template <typename E, bool kHasBase>
void ResidualBlock(const std::byte* values, const std::byte* base, uint64_t start, uint64_t end, float* residual,
                   double* lanes) {
  uint64_t i = start;
  // Full rows of 32: lane l takes element i + l (vectorizes; same order).
  for (; i + kReduceLanes <= end; i += kReduceLanes) {
    for (uint32_t l = 0; l < kReduceLanes; ++l) {
      const float x = E::ToFloat(LoadBits<E>(values, i + l));
      residual[i + l] = kHasBase ? x - E::ToFloat(LoadBits<E>(base, i + l)) : x;
      const bool finite = (FloatBits(x) & 0x7fffffffu) < kNonFiniteBits;
      const double d = static_cast<double>(x);
      const double sq = d * d;
      lanes[l] += finite ? sq : 0.0;
    }
  }
  for (; i < end; ++i) {
    const float x = E::ToFloat(LoadBits<E>(values, i));
    residual[i] = kHasBase ? x - E::ToFloat(LoadBits<E>(base, i)) : x;
    lanes[i % kReduceLanes] += FiniteSquare(x);
  }
}

template <typename E>
void ResidualTyped(const std::byte* values, const std::byte* base, uint64_t n, float* residual, double* norm_partials,
                   bool use_simd) {
  for (uint64_t start = 0, blk = 0; start < n; start += kReduceBlock, ++blk) {
    uint64_t end = std::min<uint64_t>(n, start + kReduceBlock);
    double lanes[kReduceLanes] = {};
    if (use_simd) {
      ResidualBlockSimd(TypeOf<E>(), values, base, start, end, residual, lanes);
    } else if (base) {
      ResidualBlock<E, true>(values, base, start, end, residual, lanes);
    } else {
      ResidualBlock<E, false>(values, base, start, end, residual, lanes);
    }
    norm_partials[blk] = FoldLanes(lanes);
  }
}

template <typename E, bool kHasBase>
void QuantizeBlock(const QuantizeTable& t, const LevelLookup& lut, const std::byte* values, const std::byte* base,
                   uint64_t start, uint64_t end, const float* residual, uint8_t* symbols, std::byte* recon,
                   double* lanes, double* max_err, uint64_t* by_class) {
  using Bits = typename E::Bits;
  const bool no_levels = t.num_levels == 0;
  uint64_t pruned = 0, exact = 0;
  double mx = *max_err;
  for (uint64_t i = start; i < end; ++i) {
    const Bits x = LoadBits<E>(values, i);
    const Bits b = kHasBase ? LoadBits<E>(base, i) : Bits{0};
    const float r = residual[i];
    const uint32_t mag = FloatBits(r) & 0x7fffffffu;
    const bool is_exact = mag >= t.exact_from;
    const bool is_pruned = !is_exact && (mag < t.prune_below || no_levels);
    const uint32_t k = lut.probe_ok ? LookupLevel(lut, r) : NearestLevel(t.bounds, r);
    const float bf = kHasBase ? E::ToFloat(b) : 0.0f;
    const Bits q = E::FromFloat(bf + lut.levels[k]);
    const Bits out = is_exact ? x : (is_pruned ? b : q);
    symbols[i - start] = static_cast<uint8_t>((is_exact || is_pruned) ? 0u : k + 1);
    StoreBits<E>(recon, i, out);
    pruned += is_pruned;
    exact += is_exact;
    const float xf = E::ToFloat(x);
    const bool finite = (FloatBits(xf) & 0x7fffffffu) < kNonFiniteBits;
    const double e = static_cast<double>(E::ToFloat(out)) - static_cast<double>(xf);
    const double e2 = e * e;
    lanes[i % kReduceLanes] += finite ? e2 : 0.0;
    const double abs_e = finite ? (e < 0 ? -e : e) : 0.0;
    mx = abs_e > mx ? abs_e : mx;
  }
  *max_err = mx;
  by_class[kPruned] += pruned;
  by_class[kExact] += exact;
  by_class[kQuantized] += (end - start) - pruned - exact;
}

template <typename E>
void QuantizePackTyped(const QuantizeTable& t, const std::byte* values, const std::byte* base, uint64_t n,
                       const float* residual, std::byte* packed, std::byte* recon, double* error_partials,
                       double* max_abs_error, ClassCounts* counts, LevelLookup* lut, bool use_simd, bool use_avx512) {
  alignas(64) uint8_t symbols[kReduceBlock];
  BuildLookup(t, lut);
  const bool simd = use_simd && lut->probe_ok;
  const bool avx512 = simd && use_avx512 && std::is_same_v<E, F32Elem>;
  double max_err = 0.0;
  uint64_t by_class[3] = {0, 0, 0};
  for (uint64_t start = 0, blk = 0; start < n; start += kReduceBlock, ++blk) {
    uint64_t end = std::min<uint64_t>(n, start + kReduceBlock);
    double lanes[kReduceLanes] = {};
    if (simd) {
      uint64_t pruned = 0, exact = 0;
      if (avx512) {
        QuantizeBlockF32Avx512(t, *lut, values, base, start, end, residual, symbols, recon, lanes, &max_err, &pruned,
                               &exact);
      } else {
        QuantizeBlockSimd(TypeOf<E>(), t, *lut, values, base, start, end, residual, symbols, recon, lanes, &max_err,
                          &pruned, &exact);
      }
      by_class[kPruned] += pruned;
      by_class[kExact] += exact;
      by_class[kQuantized] += (end - start) - pruned - exact;
    } else if (base) {
      QuantizeBlock<E, true>(t, *lut, values, base, start, end, residual, symbols, recon, lanes, &max_err, by_class);
    } else {
      QuantizeBlock<E, false>(t, *lut, values, base, start, end, residual, symbols, recon, lanes, &max_err, by_class);
    }
    error_partials[blk] = FoldLanes(lanes);
    uint64_t count = end - start;
    uint64_t padded = (count + kPackGroup - 1) / kPackGroup * kPackGroup;
    std::memset(symbols + count, 0, padded - count);
    PackGroups(symbols, padded, t.bits, packed + start / kPackGroup * t.bits, use_simd);
  }
  *max_abs_error = max_err;
  counts->pruned = by_class[kPruned];
  counts->quantized = by_class[kQuantized];
  counts->exact = by_class[kExact];
}

template <typename E>
uint64_t CompactExactTyped(const QuantizeTable& t, const std::byte* values, uint64_t n, const float* residual,
                           uint32_t* positions, std::byte* raw) {
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if ((FloatBits(residual[i]) & 0x7fffffffu) < t.exact_from) continue;
    positions[k] = static_cast<uint32_t>(i);
    StoreBits<E>(raw, k, LoadBits<E>(values, i));
    ++k;
  }
  return k;
}

template <typename E, uint32_t kBits>
void DequantizeTyped(const float* levels, const std::byte* packed, const std::byte* base, uint64_t n, std::byte* out,
                     uint32_t* max_symbol) {
  constexpr uint64_t kMask = (1u << kBits) - 1;
  uint32_t max_sym = 0;
  uint64_t groups = (n + kPackGroup - 1) / kPackGroup;
  for (uint64_t g = 0; g < groups; ++g) {
    uint64_t word = 0;
    std::memcpy(&word, packed + g * kBits, kBits);  // little-endian host
    uint64_t first = g * kPackGroup;
    uint32_t in_group = static_cast<uint32_t>(std::min<uint64_t>(kPackGroup, n - first));
    for (uint32_t j = 0; j < in_group; ++j) {
      uint32_t sym = static_cast<uint32_t>((word >> (j * kBits)) & kMask);
      max_sym = std::max(max_sym, sym);
      typename E::Bits b = base ? LoadBits<E>(base, first + j) : typename E::Bits{0};
      StoreBits<E>(out, first + j, DequantizeElement<E>(levels, sym, b, base != nullptr));
    }
  }
  *max_symbol = max_sym;
}

template <typename E>
void DequantizeDispatch(uint32_t bits, const float* levels, const std::byte* packed, const std::byte* base, uint64_t n,
                        std::byte* out, uint32_t* max_symbol) {
  switch (bits) {
    case 1: return DequantizeTyped<E, 1>(levels, packed, base, n, out, max_symbol);
    case 2: return DequantizeTyped<E, 2>(levels, packed, base, n, out, max_symbol);
    case 3: return DequantizeTyped<E, 3>(levels, packed, base, n, out, max_symbol);
    case 4: return DequantizeTyped<E, 4>(levels, packed, base, n, out, max_symbol);
    case 5: return DequantizeTyped<E, 5>(levels, packed, base, n, out, max_symbol);
    case 6: return DequantizeTyped<E, 6>(levels, packed, base, n, out, max_symbol);
    case 7: return DequantizeTyped<E, 7>(levels, packed, base, n, out, max_symbol);
    default: return DequantizeTyped<E, 8>(levels, packed, base, n, out, max_symbol);
  }
}

// Calls f.template operator()<E>() with the element traits of `type`.
template <typename F>
void WithElement(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kF32: f.template operator()<F32Elem>(); break;
    case ElementType::kF16: f.template operator()<F16Elem>(); break;
    case ElementType::kBF16: f.template operator()<BF16Elem>(); break;
  }
}

const std::byte* BaseOrNull(ByteSpan base) { return base.empty() ? nullptr : base.data(); }

class CpuKernels final : public LossyKernels {
 public:
  explicit CpuKernels(SimdLevel max_level)
      : use_simd_(max_level != SimdLevel::kScalar && SimdAvailable()),
        use_avx512_(use_simd_ && max_level == SimdLevel::kAvx512 && QuantizeAvx512Available()) {}

  std::string_view name() const override { return use_simd_ ? "cpu" : "cpu-scalar"; }

  Status Residual(ElementType type, ByteSpan values, ByteSpan base, std::span<float> residual,
                  std::span<double> norm_partials) override {
    WithElement(type, [&]<typename E>() {
      ResidualTyped<E>(values.data(), BaseOrNull(base), residual.size(), residual.data(), norm_partials.data(),
                       use_simd_);
    });
    return Status::Ok();
  }

  Status Histogram(std::span<const float> residual, std::span<uint32_t> counts) override {
    // Four sub-histograms hide the store-to-load latency of repeated bins.
    std::vector<uint32_t>& sub = sub_histograms_;
    sub.assign(4 * kHistogramBins, 0);
    uint64_t n = residual.size();
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (uint32_t j = 0; j < 4; ++j) ++sub[j * kHistogramBins + (FloatBits(residual[i + j]) >> kHistogramShift)];
    for (; i < n; ++i) ++sub[FloatBits(residual[i]) >> kHistogramShift];
    for (uint32_t b = 0; b < kHistogramBins; ++b)
      counts[b] = sub[b] + sub[kHistogramBins + b] + sub[2 * kHistogramBins + b] + sub[3 * kHistogramBins + b];
    return Status::Ok();
  }

  Status QuantizePack(ElementType type, const QuantizeTable& table, ByteSpan values, ByteSpan base,
                      std::span<const float> residual, MutableByteSpan packed, MutableByteSpan reconstruction,
                      std::span<double> error_partials, double* max_abs_error, ClassCounts* counts) override {
    WithElement(type, [&]<typename E>() {
      QuantizePackTyped<E>(table, values.data(), BaseOrNull(base), residual.size(), residual.data(), packed.data(),
                           reconstruction.data(), error_partials.data(), max_abs_error, counts, lookup_.get(),
                           use_simd_, use_avx512_);
    });
    return Status::Ok();
  }

  Status Relevel(ElementType type, const QuantizeTable& table, ByteSpan values, ByteSpan base,
                 std::span<const float> residual, MutableByteSpan packed, MutableByteSpan reconstruction,
                 std::span<double> error_partials, double* max_abs_error, ClassCounts* counts) override {
    if (!use_simd_ || !use_avx512_ || type != ElementType::kF32 || table.bits == 0 || table.bits > 8)
      return QuantizePack(type, table, values, base, residual, packed, reconstruction, error_partials, max_abs_error,
                          counts);
    // The symbols' values as DequantizeF32Avx512 reads them.
    SetSymbolValues(table.levels);
    const uint64_t n = residual.size();
    double max_err = 0.0;
    for (uint64_t start = 0, blk = 0; start < n; start += kReduceBlock, ++blk) {
      double lanes[kReduceLanes] = {};
      RelevelBlockF32Avx512(*lookup_, table.bits, reinterpret_cast<const uint8_t*>(packed.data()), packed.size(),
                            values.data(), BaseOrNull(base), start, std::min<uint64_t>(n, start + kReduceBlock),
                            reconstruction.data(), lanes, &max_err);
      error_partials[blk] = FoldLanes(lanes);
    }
    *max_abs_error = max_err;
    return Status::Ok();
  }

  Status CompactExact(ElementType type, const QuantizeTable& table, ByteSpan values, std::span<const float> residual,
                      std::span<uint32_t> positions, MutableByteSpan raw, uint64_t* count) override {
    if (use_simd_) {
      *count = CompactExactSimd(type, table.exact_from, values.data(), residual.data(), residual.size(),
                                positions.data(), raw.data());
      return Status::Ok();
    }
    WithElement(type, [&]<typename E>() {
      *count =
          CompactExactTyped<E>(table, values.data(), residual.size(), residual.data(), positions.data(), raw.data());
    });
    return Status::Ok();
  }

  Status Dequantize(ElementType type, uint32_t bits, std::span<const float> levels, ByteSpan packed, ByteSpan base,
                    MutableByteSpan out, uint32_t* max_symbol) override {
    const uint64_t n = out.size() / ElementSize(type);
    uint64_t done_groups = 0;
    uint32_t simd_max = 0;
    if (use_simd_ && n >= kPackGroup && packed.size() >= 8) {
      // Full groups whose 8-byte load stays inside `packed`.
      done_groups = std::min<uint64_t>(n / kPackGroup, (packed.size() - 8) / bits + 1);
      SetSymbolValues(levels.data());
      if (use_avx512_ && type == ElementType::kF32) {
        DequantizeF32Avx512(*lookup_, bits, reinterpret_cast<const uint8_t*>(packed.data()), BaseOrNull(base),
                            done_groups, out.data(), &simd_max);
      } else {
        DequantizeSimd(type, *lookup_, bits, reinterpret_cast<const uint8_t*>(packed.data()), BaseOrNull(base), 0,
                       done_groups, out.data(), &simd_max);
      }
    }
    const uint64_t first = done_groups * kPackGroup;
    WithElement(type, [&]<typename E>() {
      DequantizeDispatch<E>(bits, levels.data(), packed.data() + done_groups * bits,
                            base.empty() ? nullptr : base.data() + first * ElementSize(type), n - first,
                            out.data() + first * ElementSize(type), max_symbol);
    });
    *max_symbol = std::max(*max_symbol, simd_max);
    return Status::Ok();
  }

 private:
  // LevelLookup::symbol_values from a table's levels: [0] = 0 (pruned and
  // exact elements), [s] = levels[s - 1].
  void SetSymbolValues(const float* levels) {
    lookup_->symbol_values[0] = 0.0f;
    for (uint32_t s = 1; s < 256; ++s) lookup_->symbol_values[s] = levels[s - 1];
  }
  std::vector<uint32_t> sub_histograms_;
  bool use_simd_;
  bool use_avx512_;  // the f32 quantize pass
  std::unique_ptr<LevelLookup> lookup_ = std::make_unique<LevelLookup>();
};

}  // namespace

std::unique_ptr<LossyKernels> MakeCpuKernels(bool use_simd) {
  return std::make_unique<CpuKernels>(use_simd ? SimdLevel::kAvx512 : SimdLevel::kScalar);
}

std::unique_ptr<LossyKernels> MakeCpuKernels(SimdLevel max_level) { return std::make_unique<CpuKernels>(max_level); }

Result<GpuMode> ParseGpuMode(std::string_view text) {
  if (text == "auto") return GpuMode::kAuto;
  if (text == "on") return GpuMode::kOn;
  if (text == "off") return GpuMode::kOff;
  return Status::InvalidArgument("gpu mode: want auto|on|off have '" + std::string(text) + "'");
}

}  // namespace ckptfs::lossy
