// numpy .npy: magic "\x93NUMPY", version (1.0, 2.0 or 3.0), a little-endian
// header length (u16 for 1.0, u32 otherwise), a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}, then the array
// data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// The parsed header dict of an .npy file.
struct NpyHeader {
  DType dtype = DType::kUnknown;
  bool big_endian = false;
  bool fortran_order = false;
  std::vector<uint64_t> shape;  // as written (logical order)
  uint64_t data_offset = 0;     // where the array data starts
};

// True if `file` starts with the .npy magic.
bool LooksLikeNpy(ByteSpan file);

// Parses the preamble and header dict. Corruption for a malformed header;
// Unsupported for object, structured, or other dtypes without a DType, and
// for unknown versions. Thread-safe.
Result<NpyHeader> ParseNpyHeader(ByteSpan file);

// The layout of an .npy file: the preamble and header verbatim, the data one
// tensor segment named "array" whose shape is in memory order (a Fortran-order
// array of shape (a, b) is reported as (b, a)). Empty arrays give one
// verbatim segment and no tensor. Corruption when the data length is not
// the shape's byte size. Never reads the data. Thread-safe.
Result<Layout> ParseNpy(ByteSpan file);

}  // namespace ckptfs
