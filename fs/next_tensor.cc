#include "fs/next_tensor.h"

namespace ckptfs::fs {

int32_t PredictNextTensorSegment(FileFormat format, const std::vector<SegmentInfo>& segments, int32_t segment) {
  if (segment < 0 || static_cast<size_t>(segment) >= segments.size() || segments[segment].tensor < 0) return -1;
  const auto count = static_cast<int32_t>(segments.size());
  if (format == FileFormat::kTorchZip) {
    // A linear scan: this runs once per tensor a reader starts, beside the
    // decode of megabytes.
    const int32_t want = segments[segment].tensor + 1;
    for (int32_t s = 0; s < count; ++s)
      if (segments[s].tensor == want) return s;
    return -1;
  }
  for (int32_t s = segment + 1; s < count; ++s)
    if (segments[s].tensor >= 0) return s;
  return -1;
}

}  // namespace ckptfs::fs
