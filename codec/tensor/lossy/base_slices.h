// A delta frame's base that the decoder reads slice by slice instead of
// whole. A base the reader computes rather than reads (a row-column base,
// row_column_base.h) is then computed where it is used, one slice at a time
// while in cache, instead of being written out whole (4 MiB for a 4 MiB
// chunk) and read back: that write was 5 % of a chain decode's time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::lossy {

// Thread safety: Fill may be called concurrently (it writes only `out`).
class BaseSlices {
 public:
  virtual ~BaseSlices() = default;
  // The number of f32 elements of the base.
  virtual uint64_t elements() const = 0;
  // Writes elements [first, first + count) of the base (f32, little-endian)
  // to `out`. REQUIRES: first + count <= elements().
  virtual void Fill(uint64_t first, uint64_t count, std::byte* out) const = 0;
};

}  // namespace ckptfs::lossy
