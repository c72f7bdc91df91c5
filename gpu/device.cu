#include <cuda_runtime.h>

#include "gpu/device.h"

namespace ckptfs::gpu {

DeviceInfo ProbeDevice() {
  DeviceInfo info;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.why_absent = std::string("no CUDA device: ") + cudaGetErrorString(err);
    return info;
  }
  if (count == 0) {
    info.why_absent = "no CUDA device: the driver reports 0 devices";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.why_absent = "no CUDA device: cudaGetDeviceProperties failed";
    return info;
  }
  info.present = true;
  info.name = prop.name;
  return info;
}

}  // namespace ckptfs::gpu
