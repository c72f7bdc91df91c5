#include "codec/format/segments.h"

#include <fmt/format.h>

#include <algorithm>

namespace ckptfs {

Result<std::vector<Segment>> CoverWithVerbatim(std::vector<Segment> tensor_segments, uint64_t file_size) {
  std::erase_if(tensor_segments, [](const Segment& s) { return s.length == 0; });
  std::sort(tensor_segments.begin(), tensor_segments.end(),
            [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  std::vector<Segment> out;
  out.reserve(2 * tensor_segments.size() + 1);
  uint64_t at = 0;
  for (const Segment& s : tensor_segments) {
    if (s.offset < at)
      return Status::Corruption(
          fmt::format("tensor data at {} overlaps the previous range ending at {}", s.offset, at));
    if (s.offset > file_size || s.length > file_size - s.offset)
      return Status::Corruption(
          fmt::format("tensor data [{}, +{}) ends past the file size {}", s.offset, s.length, file_size));
    if (s.offset > at) out.push_back(Segment{at, s.offset - at, -1});
    out.push_back(s);
    at = s.offset + s.length;
  }
  if (at < file_size) out.push_back(Segment{at, file_size - at, -1});
  return out;
}

}  // namespace ckptfs
