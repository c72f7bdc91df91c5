#include "codec/format/layout.h"

#include <fmt/format.h>

namespace ckptfs {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUnknown: return 0;
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kU8: return 1;
    case DType::kI8: return 1;
    case DType::kI16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
    case DType::kU16: return 2;
    case DType::kU32: return 4;
    case DType::kU64: return 8;
    case DType::kC64: return 8;
    case DType::kC128: return 16;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
    case DType::kC32: return 4;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnknown: return "unknown";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
    case DType::kU16: return "u16";
    case DType::kU32: return "u32";
    case DType::kU64: return "u64";
    case DType::kC64: return "c64";
    case DType::kC128: return "c128";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kC32: return "c32";
  }
  return "unknown";
}

bool IsCodecFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

std::string_view FileFormatName(FileFormat format) {
  switch (format) {
    case FileFormat::kOpaque: return "opaque";
    case FileFormat::kTorchZip: return "torch-zip";
    case FileFormat::kSafetensors: return "safetensors";
    case FileFormat::kNpy: return "npy";
    case FileFormat::kNpz: return "npz";
    case FileFormat::kDcp: return "dcp";
  }
  return "unknown";
}

Layout OpaqueLayout(uint64_t size, std::string reason) {
  Layout layout;
  layout.fallback_reason = std::move(reason);
  if (size > 0) layout.segments.push_back(Segment{0, size, -1});
  return layout;
}

Status ValidateLayout(const Layout& layout, uint64_t size) {
  uint64_t at = 0;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const Segment& s = layout.segments[i];
    if (s.offset != at)
      return Status::Internal(fmt::format("layout: segment {} starts at {}, want {}", i, s.offset, at));
    if (s.length == 0) return Status::Internal(fmt::format("layout: segment {} is empty", i));
    if (s.length > size - at)
      return Status::Internal(fmt::format("layout: segment {} ends at {} past the file size {}", i,
                                          s.offset + s.length, size));
    if (s.tensor >= 0) {
      if (static_cast<size_t>(s.tensor) >= layout.tensors.size())
        return Status::Internal(fmt::format("layout: segment {} names tensor {} of {}", i, s.tensor,
                                            layout.tensors.size()));
      size_t elem = DTypeSize(layout.tensors[s.tensor].dtype);
      if (elem == 0 || s.length % elem != 0)
        return Status::Internal(fmt::format("layout: segment {} length {} is not a multiple of {}", i,
                                            s.length, elem));
    }
    at += s.length;
  }
  if (at != size) return Status::Internal(fmt::format("layout: covers {} bytes, want {}", at, size));
  return Status::Ok();
}

}  // namespace ckptfs
