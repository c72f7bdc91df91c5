// The CPU reference of the lossy kernels (the spec of kernels.h). Compiled
// with -ffp-contract=off: reconstruction and error sums must not fuse
// multiply-adds, so that the GPU (-fmad=false) reproduces them bit for bit.
#include <algorithm>
#include <array>
#include <cstring>

#include "codec/tensor/lossy/kernels.h"

namespace ckptfs::lossy {
namespace {

template <typename E>
typename E::Bits LoadBits(const std::byte* p, uint64_t i) {
  typename E::Bits b;
  std::memcpy(&b, p + i * sizeof b, sizeof b);  // little-endian host (checked in lossy.cc)
  return b;
}
template <typename E>
void StoreBits(std::byte* p, uint64_t i, typename E::Bits b) {
  std::memcpy(p + i * sizeof b, &b, sizeof b);
}

// Folds 32 lane sums in the fixed order of element_ops.h.
double FoldLanes(double* lanes) {
  for (uint32_t s = kReduceLanes / 2; s != 0; s >>= 1)
    for (uint32_t l = 0; l < s; ++l) lanes[l] = lanes[l] + lanes[l + s];
  return lanes[0];
}

template <typename E>
void ResidualTyped(const std::byte* values, const std::byte* base, uint64_t n, float* residual,
                   double* norm_partials) {
  for (uint64_t start = 0, blk = 0; start < n; start += kReduceBlock, ++blk) {
    uint64_t end = std::min<uint64_t>(n, start + kReduceBlock);
    double lanes[kReduceLanes] = {};
    for (uint64_t i = start; i < end; ++i) {
      float x = E::ToFloat(LoadBits<E>(values, i));
      residual[i] = base ? x - E::ToFloat(LoadBits<E>(base, i)) : x;
      lanes[i % kReduceLanes] += FiniteSquare(x);
    }
    norm_partials[blk] = FoldLanes(lanes);
  }
}

// Packs 8 symbols per group into `bits` bytes, little-endian.
void PackGroups(const uint8_t* symbols, uint64_t count, uint32_t bits, std::byte* out) {
  for (uint64_t g = 0; g < count; g += kPackGroup) {
    uint64_t word = 0;
    for (uint32_t j = 0; j < kPackGroup; ++j) word |= static_cast<uint64_t>(symbols[g + j]) << (j * bits);
    for (uint32_t k = 0; k < bits; ++k) out[k] = std::byte((word >> (8 * k)) & 0xff);
    out += bits;
  }
}

template <typename E>
void QuantizePackTyped(const QuantizeTable& t, const std::byte* values, const std::byte* base, uint64_t n,
                       const float* residual, std::byte* packed, std::byte* recon, double* error_partials,
                       double* max_abs_error, ClassCounts* counts) {
  alignas(64) uint8_t symbols[kReduceBlock];
  double max_err = 0.0;
  uint64_t by_class[3] = {0, 0, 0};
  for (uint64_t start = 0, blk = 0; start < n; start += kReduceBlock, ++blk) {
    uint64_t end = std::min<uint64_t>(n, start + kReduceBlock);
    double lanes[kReduceLanes] = {};
    for (uint64_t i = start; i < end; ++i) {
      typename E::Bits x = LoadBits<E>(values, i);
      typename E::Bits b = base ? LoadBits<E>(base, i) : typename E::Bits{0};
      ElementResult<E> res = QuantizeElement<E>(t, x, b, base != nullptr, residual[i]);
      symbols[i - start] = static_cast<uint8_t>(res.symbol);
      StoreBits<E>(recon, i, res.recon);
      ++by_class[res.cls];
      double abs_err;
      lanes[i % kReduceLanes] += SquaredError<E>(x, res.recon, &abs_err);
      max_err = std::max(max_err, abs_err);
    }
    error_partials[blk] = FoldLanes(lanes);
    uint64_t count = end - start;
    uint64_t padded = (count + kPackGroup - 1) / kPackGroup * kPackGroup;
    std::memset(symbols + count, 0, padded - count);
    PackGroups(symbols, padded, t.bits, packed + start / kPackGroup * t.bits);
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
void DequantizeTyped(const float* levels, const std::byte* packed, const std::byte* base, uint64_t n,
                     std::byte* out, uint32_t* max_symbol) {
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
void DequantizeDispatch(uint32_t bits, const float* levels, const std::byte* packed, const std::byte* base,
                        uint64_t n, std::byte* out, uint32_t* max_symbol) {
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
  std::string_view name() const override { return "cpu"; }

  Status Residual(ElementType type, ByteSpan values, ByteSpan base, std::span<float> residual,
                  std::span<double> norm_partials) override {
    WithElement(type, [&]<typename E>() {
      ResidualTyped<E>(values.data(), BaseOrNull(base), residual.size(), residual.data(), norm_partials.data());
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
      QuantizePackTyped<E>(table, values.data(), BaseOrNull(base), residual.size(), residual.data(),
                           packed.data(), reconstruction.data(), error_partials.data(), max_abs_error, counts);
    });
    return Status::Ok();
  }

  Status CompactExact(ElementType type, const QuantizeTable& table, ByteSpan values,
                      std::span<const float> residual, std::span<uint32_t> positions, MutableByteSpan raw,
                      uint64_t* count) override {
    WithElement(type, [&]<typename E>() {
      *count = CompactExactTyped<E>(table, values.data(), residual.size(), residual.data(), positions.data(),
                                    raw.data());
    });
    return Status::Ok();
  }

  Status Dequantize(ElementType type, uint32_t bits, std::span<const float> levels, ByteSpan packed,
                    ByteSpan base, MutableByteSpan out, uint32_t* max_symbol) override {
    uint64_t n = out.size() / ElementSize(type);
    WithElement(type, [&]<typename E>() {
      DequantizeDispatch<E>(bits, levels.data(), packed.data(), BaseOrNull(base), n, out.data(), max_symbol);
    });
    return Status::Ok();
  }

 private:
  std::vector<uint32_t> sub_histograms_;
};

}  // namespace

std::unique_ptr<LossyKernels> MakeCpuKernels() { return std::make_unique<CpuKernels>(); }

Result<GpuMode> ParseGpuMode(std::string_view text) {
  if (text == "auto") return GpuMode::kAuto;
  if (text == "on") return GpuMode::kOn;
  if (text == "off") return GpuMode::kOff;
  return Status::InvalidArgument("gpu mode: want auto|on|off have '" + std::string(text) + "'");
}

}  // namespace ckptfs::lossy
