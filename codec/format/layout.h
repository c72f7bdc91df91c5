// A layout describes a file as a sequence of segments that cover every byte
// exactly once: verbatim byte runs (headers, pickles, zip structure) and
// tensor payloads. Parsers (torch zip, safetensors, npy) produce layouts;
// the container encodes each segment with a fitting codec.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/common/bytes.h"

namespace ckptfs {

// Element types. Stored in blobs: never renumber, only append.
enum class DType : uint8_t {
  kUnknown = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF64 = 4,
  kU8 = 5,
  kI8 = 6,
  kI16 = 7,
  kI32 = 8,
  kI64 = 9,
  kBool = 10,
  kU16 = 11,
  kU32 = 12,
  kU64 = 13,
  kC64 = 14,   // complex64
  kC128 = 15,  // complex128
  kF8E4M3 = 16,
  kF8E5M2 = 17,
  kC32 = 18,   // complex32 (two f16)
};

// Bytes per element (0 for kUnknown).
size_t DTypeSize(DType dtype);
// Short lowercase name, e.g. "f32", "bf16", "i64".
std::string_view DTypeName(DType dtype);
// True for the float types the tensor codecs transform: f32, f16, bf16.
bool IsCodecFloat(DType dtype);

// Detected file formats. Stored in blobs: never renumber, only append.
enum class FileFormat : uint8_t {
  kOpaque = 0,
  kTorchZip = 1,
  kSafetensors = 2,
  kNpy = 3,
  kNpz = 4,
  kDcp = 5,
};
std::string_view FileFormatName(FileFormat format);

struct TensorInfo {
  std::string name;            // key path, e.g. "model.fc1.weight"
  DType dtype = DType::kUnknown;
  std::vector<uint64_t> shape; // logical shape when known (may be empty)
  bool big_endian = false;     // elements stored big-endian (npy '>f4')
};

struct Segment {
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  int32_t tensor = -1;  // index into Layout::tensors, or -1 for verbatim bytes
  bool is_tensor() const { return tensor >= 0; }
};

// Where a zip entry's CRC-32 is recorded, so that a writer that changes the
// entry's payload (lossy reconstruction) can rewrite every copy of it: the
// local header, the data descriptor and the central directory record.
struct ZipCrcField {
  uint64_t payload_offset = 0;
  uint64_t payload_length = 0;
  std::vector<uint64_t> crc_offsets;  // each a 4-byte little-endian CRC-32
};

struct Layout {
  FileFormat format = FileFormat::kOpaque;
  std::vector<TensorInfo> tensors;
  // Sorted by offset, contiguous, covering [0, file size) exactly once.
  // Zero-length segments are not allowed. An empty file has no segments.
  std::vector<Segment> segments;
  // Zip formats only (torch zip, npz): the CRC-32 locations of entries that
  // hold tensors.
  std::vector<ZipCrcField> zip_crcs;
  // DCP shards only: [offset, length) of each torch.save archive, in order
  // (what the save's .metadata describes; dcp_metadata.h).
  std::vector<std::pair<uint64_t, uint64_t>> archives;
  // Why the file is opaque when a parser recognised the format but gave up
  // (empty otherwise); logged by callers.
  std::string fallback_reason;
};

// A layout with one verbatim segment covering `size` bytes.
Layout OpaqueLayout(uint64_t size, std::string reason = {});

// OK if `layout` covers [0, size) exactly once with sorted, non-empty,
// contiguous segments whose tensor indices are valid and whose lengths are
// multiples of their dtype size; Internal otherwise (parsers must not emit
// such layouts).
Status ValidateLayout(const Layout& layout, uint64_t size);

// Bounds that keep hostile input from costing unbounded memory or time.
struct ParseLimits {
  uint64_t max_pickle_bytes = 256ull << 20;
  uint32_t max_pickle_depth = 1000;
  uint32_t max_pickle_memo = 1u << 20;
  uint64_t max_pickle_ops = 50'000'000;
  uint64_t max_json_header = 100ull << 20;  // safetensors' own limit
  uint32_t max_zip_entries = 1u << 20;
  uint32_t max_tensors = 1u << 20;
};

// Detects the format by content (never by name) and parses it. Never fails:
// anything unrecognised or malformed gives an opaque layout whose
// fallback_reason says why when a known format was malformed.
Layout DetectLayout(ByteSpan file, const ParseLimits& limits = {});

}  // namespace ckptfs
