// libFuzzer target: the safetensors header parser.
#include <cstdint>
#include <cstdlib>

#include "codec/format/layout.h"
#include "codec/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::ByteSpan file(reinterpret_cast<const std::byte*>(data), size);
  auto layout = ckptfs::ParseSafetensors(file, ckptfs::ParseLimits{});
  if (layout.ok() && !ckptfs::ValidateLayout(*layout, size).ok()) std::abort();
  if (!ckptfs::ValidateLayout(ckptfs::DetectLayout(file), size).ok()) std::abort();
  return 0;
}
