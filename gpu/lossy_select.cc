// Backend selection; compiled with and without CUDA (CKPTFS_HAVE_CUDA).
#include <string>

#include "gpu/device.h"
#include "gpu/lossy_backend.h"

namespace ckptfs::gpu {

#if !CKPTFS_HAVE_CUDA
Result<std::unique_ptr<lossy::LossyKernels>> MakeCudaLossyKernels(uint64_t) {
  return Status::Unsupported("lossy kernels: " + ProbeDevice().why_absent);
}
Result<std::string> BenchmarkLossyKernels(lossy::ElementType, ByteSpan, ByteSpan, const lossy::QuantizeTable&, int) {
  return Status::Unsupported("lossy kernel benchmark: " + ProbeDevice().why_absent);
}
#endif

Result<std::unique_ptr<lossy::LossyKernels>> SelectLossyKernels(lossy::GpuMode mode, uint64_t max_chunk_elements) {
  if (mode == lossy::GpuMode::kOff) return lossy::MakeCpuKernels();
  DeviceInfo device = ProbeDevice();
  if (!device.present) {
    if (mode == lossy::GpuMode::kOn) return Status::Unsupported("gpu=on but " + device.why_absent);
    return lossy::MakeCpuKernels();
  }
  return MakeCudaLossyKernels(max_chunk_elements);
}

}  // namespace ckptfs::gpu
