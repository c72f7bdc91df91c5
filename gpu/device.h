// Runtime discovery of a CUDA device. Plain C++: included by non-CUDA code.
#pragma once

#include <string>

namespace ckptfs::gpu {

struct DeviceInfo {
  bool present = false;
  std::string name;         // e.g. "NVIDIA H200"
  std::string why_absent;   // when !present: "built without CUDA", "no device", ...
};

// Probes for a usable device (cheap after the first call).
DeviceInfo ProbeDevice();

}  // namespace ckptfs::gpu
