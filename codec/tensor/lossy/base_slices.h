// A delta frame's base that the decoder reads slice by slice instead of
// whole, and a last step on each decoded slice. A base the reader computes
// rather than reads (a row-column base, row_column_base.h; a first
// moment's base in step space) is then computed where it is used, one
// slice at a time while in cache, instead of being written out whole (4 MiB
// for a 4 MiB chunk) and read back: the row-column base's write was 4.7 %
// of a restore of a four-version chain. Likewise a step-space chunk's
// output, m = x * s, is made from each slice while in cache instead of in
// a pass over the whole chunk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::lossy {

// Thread safety: as the implementation says (a decoder calls it from one
// thread).
class BaseSlices {
 public:
  virtual ~BaseSlices() = default;
  // The number of f32 elements of the base.
  virtual uint64_t elements() const = 0;
  // Writes elements [first, first + count) of the base (f32, little-endian)
  // to `out`. REQUIRES: first + count <= elements().
  virtual void Fill(uint64_t first, uint64_t count, std::byte* out) const = 0;
};

// The decoder calls Apply on each slice of the output once its exact
// elements are in, before it hashes it; the stream's values become the
// chunk's bytes.
class SliceFinish {
 public:
  virtual ~SliceFinish() = default;
  // `slice` holds elements [first, first + count) (f32, little-endian) of
  // the output, rewritten in place.
  virtual void Apply(uint64_t first, uint64_t count, std::byte* slice) const = 0;
};

}  // namespace ckptfs::lossy
