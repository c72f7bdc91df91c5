#include "gpu/device.h"

namespace ckptfs::gpu {

DeviceInfo ProbeDevice() {
  DeviceInfo info;
  info.why_absent = "ckptfs was built without CUDA (nvcc not found at build time)";
  return info;
}

}  // namespace ckptfs::gpu
