// Chooses the kernel backend of the lossy tensor codec (codec/tensor/lossy/
// kernels.h): the CUDA kernels of gpu/lossy_kernels.cu or the CPU reference.
// Plain C++: included by non-CUDA code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "codec/common/status.h"
#include "codec/tensor/lossy/kernels.h"

namespace ckptfs::gpu {

// kOff: the CPU reference. kOn: the CUDA backend, or an error saying why
// there is none. kAuto: CUDA when ProbeDevice() finds a device, else CPU.
// `max_chunk_elements` sizes the device workspace up front (it grows if a
// larger chunk comes, outside any kernel call).
// Thread safety: the returned object is used by one thread at a time.
Result<std::unique_ptr<lossy::LossyKernels>> SelectLossyKernels(lossy::GpuMode mode,
                                                                uint64_t max_chunk_elements = 1u << 20);

// The CUDA backend itself (nullptr-free: an error when no device or no CUDA).
Result<std::unique_ptr<lossy::LossyKernels>> MakeCudaLossyKernels(uint64_t max_chunk_elements);

}  // namespace ckptfs::gpu

namespace ckptfs::gpu {

// Times every CUDA kernel of the lossy codec on `values` (and `base` when
// not empty) with `table`, `reps` launches each, with CUDA events, and
// returns a JSON object {"kernel": {"ms": .., "gb_per_s": ..}, ...} where
// GB/s counts the input element bytes per launch. Device memory is
// allocated before the timed launches. Unsupported without a device.
Result<std::string> BenchmarkLossyKernels(lossy::ElementType type, ByteSpan values, ByteSpan base,
                                          const lossy::QuantizeTable& table, int reps);

}  // namespace ckptfs::gpu
