// The heavy, data-parallel steps of the lossy codec behind one interface, so
// that the CUDA implementation (gpu/lossy_kernels.cu) can replace the CPU
// reference (kernels_cpu.cc, the spec). Codebook fitting and the
// configuration search stay on the host and are shared by both.
//
// Every output is defined bit for bit (integer histograms, fixed reduction
// order, the per-element arithmetic of element_ops.h), so the backends agree
// exactly; tests/unit/gpu/ checks it. Plain C++: no CUDA types here.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "codec/common/bytes.h"
#include "codec/common/simd_level.h"
#include "codec/common/status.h"
#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

// Element counts by class from one QuantizePack call.
struct ClassCounts {
  uint64_t pruned = 0;
  uint64_t quantized = 0;
  uint64_t exact = 0;
};

// Number of reduction blocks (partials) for n elements.
inline uint64_t ReduceBlocks(uint64_t n) { return (n + kReduceBlock - 1) / kReduceBlock; }
// Bytes of the packed symbol stream for n symbols of `bits` bits.
inline uint64_t PackedBytes(uint64_t n, uint32_t bits) { return (n + kPackGroup - 1) / kPackGroup * bits; }

// Thread safety: an instance is used by one thread at a time.
// All spans are host memory; n = values.size() / ElementSize(type).
class LossyKernels {
 public:
  virtual ~LossyKernels() = default;
  // "cpu" or "cuda:<device name>".
  virtual std::string_view name() const = 0;

  // residual[i] = ToFloat(values[i]) - ToFloat(base[i]) (just ToFloat(values[i])
  // when base is empty); norm_partials[blk] = sum of squares of the finite
  // ToFloat(values[i]) of block blk (see element_ops.h for the order).
  // REQUIRES: residual.size() == n, norm_partials.size() == ReduceBlocks(n),
  //           base empty or the size of values.
  virtual Status Residual(ElementType type, ByteSpan values, ByteSpan base, std::span<float> residual,
                          std::span<double> norm_partials) = 0;

  // counts[FloatBits(r) >> kHistogramShift] += 1 for every residual r.
  // REQUIRES: counts.size() == kHistogramBins (overwritten).
  virtual Status Histogram(std::span<const float> residual, std::span<uint32_t> counts) = 0;

  // Classifies and quantizes every element (QuantizeElement), packs the
  // symbols (`table.bits` bits each, 8 per group, little-endian), writes the
  // reconstruction (exact elements included) and the per-block squared-error
  // partials and the max abs error over finite elements.
  // REQUIRES: packed.size() == PackedBytes(n, table.bits),
  //           reconstruction.size() == values.size(),
  //           error_partials.size() == ReduceBlocks(n).
  virtual Status QuantizePack(ElementType type, const QuantizeTable& table, ByteSpan values, ByteSpan base,
                              std::span<const float> residual, MutableByteSpan packed, MutableByteSpan reconstruction,
                              std::span<double> error_partials, double* max_abs_error, ClassCounts* counts) = 0;

  // QuantizePack with `table` again, after a QuantizePack of the same
  // values, base and residual with a table that differs from `table` in
  // its levels only (ScaledLevels: the same bounds, thresholds and bits,
  // so the same symbols and classes): `packed` holds that call's symbols
  // and `reconstruction` its output. Writes what QuantizePack(table) would:
  // the reconstruction of the quantized elements, the error partials and
  // the max abs error (packed and *counts stay: they would not change).
  // The default calls QuantizePack; the CPU's AVX-512 path reads the
  // symbols instead of finding them again (the level search was most of
  // a second pass's time).
  // REQUIRES: as QuantizePack, and the earlier call as above.
  virtual Status Relevel(ElementType type, const QuantizeTable& table, ByteSpan values, ByteSpan base,
                         std::span<const float> residual, MutableByteSpan packed, MutableByteSpan reconstruction,
                         std::span<double> error_partials, double* max_abs_error, ClassCounts* counts) {
    return QuantizePack(type, table, values, base, residual, packed, reconstruction, error_partials, max_abs_error,
                        counts);
  }

  // Lists the exact elements in increasing position: positions[k] and the
  // raw value bits (ElementSize bytes each, little-endian) in raw.
  // REQUIRES: positions.size() >= the exact count of QuantizePack with the
  //           same table, raw.size() >= that count * ElementSize(type).
  virtual Status CompactExact(ElementType type, const QuantizeTable& table, ByteSpan values,
                              std::span<const float> residual, std::span<uint32_t> positions, MutableByteSpan raw,
                              uint64_t* count) = 0;

  // out[i] = DequantizeElement(levels, symbol i, base[i]): unpacks the
  // symbols, maps them to levels and adds the base. Exact elements are
  // patched by the caller afterwards.
  // *max_symbol receives the largest symbol seen, so the caller can reject
  // symbols above the codebook (their output is then unspecified but the
  // call stays in bounds: levels has kMaxLevels entries).
  // REQUIRES: packed.size() == PackedBytes(n, bits), levels.size() == kMaxLevels.
  virtual Status Dequantize(ElementType type, uint32_t bits, std::span<const float> levels, ByteSpan packed,
                            ByteSpan base, MutableByteSpan out, uint32_t* max_symbol) = 0;
};

// The CPU reference implementation. With use_simd (and an AVX2 CPU) the
// hot loops run vectorized, with AVX-512 where the CPU has it; the results
// are identical either way.
std::unique_ptr<LossyKernels> MakeCpuKernels(bool use_simd = true);
// The same with the vector paths capped at `max_level` (tests compare each
// level the CPU has with the scalar reference).
std::unique_ptr<LossyKernels> MakeCpuKernels(SimdLevel max_level);

// Backend selection (the choice itself is made in gpu/lossy_backend.h, which
// can see the device). kAuto = the GPU when a device is present.
enum class GpuMode : uint8_t { kAuto = 0, kOn = 1, kOff = 2 };
// Parses "auto", "on", "off".
Result<GpuMode> ParseGpuMode(std::string_view text);

}  // namespace ckptfs::lossy
