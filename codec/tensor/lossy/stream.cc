#include "codec/tensor/lossy/stream.h"

#include <string>

namespace ckptfs::lossy {

void StreamHeader::EncodeTo(std::vector<std::byte>* out) const {
  ByteWriter w(out);
  w.U8(version);
  w.U8(static_cast<uint8_t>(mode));
  w.U8(static_cast<uint8_t>(type));
  w.U8(bits);
  w.U8(flags);
  w.Zeros(3);
  w.U32(num_levels);
  w.U64(element_count);
  w.U64(exact_count);
  w.U64(main_size);
  w.U64(exact_raw_size);
  w.U64(exact_size);
}

Result<StreamHeader> StreamHeader::DecodeFrom(ByteSpan data) {
  ByteReader r(data, "lossy chunk header");
  StreamHeader h;
  h.version = r.U8();
  uint8_t mode = r.U8();
  uint8_t type = r.U8();
  h.bits = r.U8();
  h.flags = r.U8();
  uint8_t reserved[3] = {r.U8(), r.U8(), r.U8()};
  h.num_levels = r.U32();
  h.element_count = r.U64();
  h.exact_count = r.U64();
  h.main_size = r.U64();
  h.exact_raw_size = r.U64();
  h.exact_size = r.U64();
  RETURN_IF_ERROR(r.status());
  auto bad = [](const std::string& what, uint64_t want, uint64_t have) {
    return Status::Corruption("lossy chunk header: " + what + ", want=" + std::to_string(want) +
                              " have=" + std::to_string(have));
  };
  if (h.version != kStreamVersion) {
    return Status::Unsupported("lossy chunk header: unsupported version, want=" + std::to_string(kStreamVersion) +
                               " have=" + std::to_string(h.version));
  }
  if (mode > 1) return bad("mode <= 1", 1, mode);
  h.mode = static_cast<StreamMode>(mode);
  if (type < 1 || type > 3) return bad("element type 1..3", 1, type);
  h.type = static_cast<ElementType>(type);
  if ((h.flags & ~kFlagDelta) != 0) return bad("reserved flag bits zero", 0, h.flags);
  for (uint8_t b : reserved)
    if (b != 0) return bad("reserved bytes zero", 0, b);
  if (h.element_count > UINT32_MAX) return bad("element count < 2^32", UINT32_MAX, h.element_count);
  if (h.mode == StreamMode::kLossless) {
    if (h.bits != 0) return bad("bits in lossless mode", 0, h.bits);
    if (h.num_levels != 0) return bad("levels in lossless mode", 0, h.num_levels);
    if (h.exact_count != 0 || h.exact_raw_size != 0 || h.exact_size != 0)
      return bad("no exact list in lossless mode", 0, h.exact_count);
  } else {
    if (h.bits < 1 || h.bits > 8) return bad("bits 1..8", 8, h.bits);
    if (h.num_levels > (1u << h.bits) - 1) return bad("levels <= 2^bits - 1", (1u << h.bits) - 1, h.num_levels);
    if (h.exact_count > h.element_count) return bad("exact count <= element count", h.element_count, h.exact_count);
    if ((h.exact_count == 0) != (h.exact_raw_size == 0) || (h.exact_raw_size == 0) != (h.exact_size == 0))
      return bad("empty exact list has no bytes", 0, h.exact_size);
  }
  return h;
}

void SplitPlanes(ByteSpan values, ByteSpan base, size_t width, MutableByteSpan out) {
  size_t n = values.size() / width;
  const std::byte* v = values.data();
  const std::byte* b = base.empty() ? nullptr : base.data();
  std::byte* o = out.data();
  if (width == 4) {
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < 4; ++k) o[k * n + i] = b ? (v[4 * i + k] ^ b[4 * i + k]) : v[4 * i + k];
  } else {
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < 2; ++k) o[k * n + i] = b ? (v[2 * i + k] ^ b[2 * i + k]) : v[2 * i + k];
  }
}

void JoinPlanes(ByteSpan planes, ByteSpan base, size_t width, MutableByteSpan out) {
  size_t n = planes.size() / width;
  const std::byte* p = planes.data();
  const std::byte* b = base.empty() ? nullptr : base.data();
  std::byte* o = out.data();
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < width; ++k) o[width * i + k] = b ? (p[k * n + i] ^ b[width * i + k]) : p[k * n + i];
}

}  // namespace ckptfs::lossy
