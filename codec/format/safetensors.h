// safetensors: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, optional
// "__metadata__"}), then the data buffer the offsets are relative to.
#pragma once

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// True if `file` starts like a safetensors file: a header length that fits
// in the file and a header whose first byte is '{'.
bool LooksLikeSafetensors(ByteSpan file);

// The dtype of a safetensors dtype string ("F32", "BF16", "F8_E4M3", ...);
// kUnknown for anything else.
DType SafetensorsDType(std::string_view name);

// Parses the header into a layout: the length prefix and JSON header are one
// verbatim segment, each tensor's range a tensor segment (named by its JSON
// key), gaps and trailing bytes verbatim. Tensors of an unknown dtype stay
// verbatim. Corruption (message says why) for a header that is not a JSON
// object, bad entries, shape*dtype size != range length, overlapping or
// out-of-range ranges; InvalidArgument when N exceeds
// limits.max_json_header. Never reads the data buffer. Thread-safe.
Result<Layout> ParseSafetensors(ByteSpan file, const ParseLimits& limits);

}  // namespace ckptfs
