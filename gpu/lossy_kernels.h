// CUDA implementations of the lossy codec kernels (the CPU reference and spec
// is codec/tensor/lossy/kernels_cpu.cc). CUB-style: every function takes
// device pointers (d_ prefix) and a stream, allocates nothing (the compaction
// scratch size is queried first) and returns the launch's cudaError_t.
// Per-element arithmetic comes from codec/tensor/lossy/element_ops.h, the
// same code the CPU runs; gpu/ is compiled with -fmad=false; histograms and
// counters are integers; reductions follow the fixed order of element_ops.h.
// CUDA-only header: include it from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::gpu {

// Indices into the counters array of LaunchQuantizePack / LaunchErrorPartials.
enum LossyCounter : int { kCounterPruned = 0, kCounterQuantized = 1, kCounterExact = 2, kCounterMaxError = 3 };
inline constexpr int kLossyCounters = 4;

// d_residual[i] = ToFloat(d_values[i]) - ToFloat(d_base[i]) (d_base may be
// null: key frame); d_norm_partials[blk] as in kernels.h.
cudaError_t LaunchResidual(lossy::ElementType type, const void* d_values, const void* d_base, uint64_t n,
                           float* d_residual, double* d_norm_partials, cudaStream_t stream);

// Zeroes d_counts (kHistogramBins) and counts the residual's bins.
cudaError_t LaunchHistogram(const float* d_residual, uint64_t n, uint32_t* d_counts, cudaStream_t stream);

// Classifies, quantizes and packs; writes the reconstruction and adds the
// class counts to d_counters[0..2] (the caller zeroes them).
cudaError_t LaunchQuantizePack(lossy::ElementType type, const lossy::QuantizeTable* d_table, const void* d_values,
                               const void* d_base, const float* d_residual, uint64_t n, uint8_t* d_packed,
                               void* d_recon, unsigned long long* d_counters, cudaStream_t stream);

// Squared-error partials of the reconstruction and the max abs error (as the
// bits of a non-negative double, atomically maxed into d_counters[3]).
cudaError_t LaunchErrorPartials(lossy::ElementType type, const void* d_values, const void* d_recon, uint64_t n,
                                double* d_error_partials, unsigned long long* d_counters, cudaStream_t stream);

// Bytes of scratch LaunchCompactExact needs for n elements.
size_t CompactExactScratchBytes(uint64_t n);
// Lists the exact elements in increasing position; *d_count gets their number.
cudaError_t LaunchCompactExact(lossy::ElementType type, const lossy::QuantizeTable* d_table, const void* d_values,
                               const float* d_residual, uint64_t n, void* d_scratch, size_t scratch_bytes,
                               uint32_t* d_positions, void* d_raw, unsigned long long* d_count, cudaStream_t stream);

// Unpacks, dequantizes, adds the base; atomically maxes the largest symbol
// into *d_max_symbol (the caller zeroes it). d_levels: kMaxLevels floats.
cudaError_t LaunchDequantize(lossy::ElementType type, uint32_t bits, const float* d_levels, const uint8_t* d_packed,
                             const void* d_base, uint64_t n, void* d_out, unsigned int* d_max_symbol,
                             cudaStream_t stream);

}  // namespace ckptfs::gpu
