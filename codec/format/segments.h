// Shared by the format parsers: turns a set of tensor byte ranges into the
// full segment list of a Layout (verbatim segments fill every gap).
#pragma once

#include <cstdint>
#include <vector>

#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// Sorts `tensor_segments` by offset and returns them with verbatim segments
// filling the gaps so that [0, file_size) is covered exactly once. Empty
// tensor ranges are dropped. Corruption when two ranges overlap or one ends
// past file_size. Thread-safe.
Result<std::vector<Segment>> CoverWithVerbatim(std::vector<Segment> tensor_segments, uint64_t file_size);

}  // namespace ckptfs
