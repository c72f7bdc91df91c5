#include "codec/tensor/lossy/stream.h"

#include <cstring>
#include <string>

#include "codec/common/hash.h"

namespace ckptfs::lossy {

namespace {

void PutVarint64(ByteWriter& w, uint64_t v) {
  while (v >= 0x80) {
    w.U8(static_cast<uint8_t>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  w.U8(static_cast<uint8_t>(v));
}

// A minimal LEB128 varint of at most 10 bytes (a longer or padded one does
// not come from the encoder: Corruption through the reader's status).
uint64_t GetVarint64(ByteReader& r, bool* bad) {
  uint64_t v = 0;
  for (uint32_t shift = 0; shift < 64; shift += 7) {
    const uint8_t b = r.U8();
    if (!r.ok()) return 0;
    if (shift == 63 && b > 1) break;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      if (b == 0 && shift > 0) break;  // padded
      return v;
    }
  }
  *bad = true;
  return 0;
}

}  // namespace

void StreamHeader::EncodeTo(std::vector<std::byte>* out) const {
  ByteWriter w(out);
  w.U8(version);
  w.U8(static_cast<uint8_t>(mode));
  w.U8(static_cast<uint8_t>(type));
  w.U8(bits);
  w.U8(flags);
  w.Zeros(3);
  if ((flags & kFlagCompactHeader) != 0) {
    for (uint64_t v : {uint64_t{num_levels}, element_count, exact_count, main_size, exact_raw_size, exact_size})
      PutVarint64(w, v);
  } else {
    w.U32(num_levels);
    w.U64(element_count);
    w.U64(exact_count);
    w.U64(main_size);
    w.U64(exact_raw_size);
    w.U64(exact_size);
  }
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
  if ((h.flags & kFlagCompactHeader) != 0) {
    bool bad_varint = false;
    const uint64_t levels = GetVarint64(r, &bad_varint);
    h.element_count = GetVarint64(r, &bad_varint);
    h.exact_count = GetVarint64(r, &bad_varint);
    h.main_size = GetVarint64(r, &bad_varint);
    h.exact_raw_size = GetVarint64(r, &bad_varint);
    h.exact_size = GetVarint64(r, &bad_varint);
    if (bad_varint || levels > UINT32_MAX)
      return Status::Corruption("lossy chunk header: a compact field is not a minimal varint below its limit");
    h.num_levels = static_cast<uint32_t>(levels);
  } else {
    h.num_levels = r.U32();
    h.element_count = r.U64();
    h.exact_count = r.U64();
    h.main_size = r.U64();
    h.exact_raw_size = r.U64();
    h.exact_size = r.U64();
  }
  h.size = data.size() - r.remaining();
  RETURN_IF_ERROR(r.status());
  auto bad = [](const std::string& what, uint64_t want, uint64_t have) {
    return Status::Corruption("lossy chunk header: " + what + ", want=" + std::to_string(want) +
                              " have=" + std::to_string(have));
  };
  if (h.version < kStreamVersion || h.version > kStreamVersionTrellis) {
    return Status::Unsupported("lossy chunk header: unsupported version, want<=" +
                               std::to_string(kStreamVersionTrellis) +
                               " have=" + std::to_string(h.version));
  }
  if (mode > 3) return bad("mode <= 3", 3, mode);
  if ((mode == 3) != (h.version == kStreamVersionTrellis)) return bad("trellis mode in version 5", 5, h.version);
  if (h.version == kStreamVersionTrellis) {
    if (h.bits != 8) return bad("trellis symbol bits", 8, h.bits);
    if (h.num_levels != 8) return bad("trellis states", 8, h.num_levels);
  } else if (h.version == kStreamVersionRans) {
    if (mode == 0) return bad("rANS symbols only in modes 1 and 2", 1, mode);
    if (h.bits > kMaxRansBits) return bad("rANS symbol bits", kMaxRansBits, h.bits);
  } else if (h.version == kStreamVersionRansContexts) {
    if (mode != 1) return bad("context rANS symbols only in mode 1", 1, mode);
    if (h.bits > kMaxRansBits) return bad("rANS symbol bits", kMaxRansBits, h.bits);
  } else if ((mode == 2) != (h.version == kStreamVersionLog)) {
    return bad("version of mode", mode == 2 ? 2 : 1, h.version);
  }
  h.mode = static_cast<StreamMode>(mode);
  if (type < 1 || type > 3) return bad("element type 1..3", 1, type);
  h.type = static_cast<ElementType>(type);
  if ((h.flags & ~(kFlagDelta | kFlagZeroCarry | kFlagCompactHeader)) != 0)
    return bad("reserved flag bits zero", 0, h.flags);
  if ((h.flags & kFlagZeroCarry) != 0 && (h.mode != StreamMode::kLog || (h.flags & kFlagDelta) == 0))
    return bad("zero carry only in a log delta frame", 0, h.flags);
  for (uint8_t b : reserved)
    if (b != 0) return bad("reserved bytes zero", 0, b);
  if (h.element_count > UINT32_MAX) return bad("element count < 2^32", UINT32_MAX, h.element_count);
  if (h.mode == StreamMode::kLossless) {
    if (h.bits != 0) return bad("bits in lossless mode", 0, h.bits);
    if (h.num_levels != 0) return bad("levels in lossless mode", 0, h.num_levels);
    if (h.exact_count != 0 || h.exact_raw_size != 0 || h.exact_size != 0)
      return bad("no exact list in lossless mode", 0, h.exact_count);
  } else {
    if (h.mode == StreamMode::kLog) {
      if (h.bits < 1 || h.bits > kMaxLogBits) return bad("log bits 1..24", kMaxLogBits, h.bits);
      if (h.num_levels < 1 || h.num_levels > kMaxLogLevels)
        return bad("log levels per octave 1..2^16", kMaxLogLevels, h.num_levels);
    } else if (h.mode == StreamMode::kQuantized) {
      if (h.bits < 1 || h.bits > 8) return bad("bits 1..8", 8, h.bits);
      if (h.num_levels > (1u << h.bits) - 1) return bad("levels <= 2^bits - 1", (1u << h.bits) - 1, h.num_levels);
    }
    if (h.exact_count > h.element_count) return bad("exact count <= element count", h.element_count, h.exact_count);
    if ((h.exact_count == 0) != (h.exact_raw_size == 0) || (h.exact_raw_size == 0) != (h.exact_size == 0))
      return bad("empty exact list has no bytes", 0, h.exact_size);
  }
  return h;
}

Result<ByteSpan> CompressZstd(ZSTD_CCtx* cctx, int level, ByteSpan src, std::vector<std::byte>* staging) {
  // Sizing the output vector to the worst case instead would zero-fill and
  // fault in fresh memory on every chunk, and leave it oversized.
  if (staging->size() < ZSTD_compressBound(src.size())) staging->resize(ZSTD_compressBound(src.size()));
  size_t got = ZSTD_compressCCtx(cctx, staging->data(), staging->size(), src.data(), src.size(), level);
  if (ZSTD_isError(got)) return Status::Internal(std::string("zstd compress: ") + ZSTD_getErrorName(got));
  return ByteSpan(staging->data(), got);
}

Status Unzstd(ZSTD_DCtx* dctx, ByteSpan src, std::byte* dst, size_t want, const char* what) {
  auto corrupt = [what](const char* field, uint64_t w, uint64_t have) {
    return Status::Corruption(std::string("lossy chunk: ") + what + " " + field + ", want=" + std::to_string(w) +
                              " have=" + std::to_string(have));
  };
  unsigned long long declared = ZSTD_getFrameContentSize(src.data(), src.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN)
    return Status::Corruption(std::string("lossy chunk: ") + what + ": not a zstd frame with a content size");
  if (declared != want) return corrupt("size", want, declared);
  size_t got = ZSTD_decompressDCtx(dctx, dst, want, src.data(), src.size());
  if (ZSTD_isError(got)) return Status::Corruption(std::string("lossy chunk: ") + what + ": " + ZSTD_getErrorName(got));
  if (got != want) return corrupt("size", want, got);
  return Status::Ok();
}

void AppendChecksum(std::vector<std::byte>* out) {
  uint64_t sum = Checksum64(*out);
  ByteWriter(out).U64(sum);
}

// The varint gaps are position - previous - 1, the first relative to -1.
void BuildExactList(std::span<const uint32_t> positions, ByteSpan raw, std::vector<std::byte>* out) {
  out->resize(positions.size() * 5 + raw.size());
  size_t at = 0;
  uint64_t next = 0;
  for (uint32_t p : positions) {
    at += PutVarint32(out->data() + at, static_cast<uint32_t>(p - next));
    next = uint64_t{p} + 1;
  }
  if (!raw.empty()) std::memcpy(out->data() + at, raw.data(), raw.size());
  out->resize(at + raw.size());
}

Result<ExactPatcher> ExactPatcher::Open(ZSTD_DCtx* dctx, ByteSpan exact_z, const StreamHeader& h, size_t width,
                                        std::vector<std::byte>* list) {
  if (h.exact_count == 0) return ExactPatcher();
  // The list holds at least 1 byte of varint and `width` raw bytes per entry.
  if (h.exact_raw_size < h.exact_count * (1 + width) || h.exact_raw_size > h.exact_count * (5 + width))
    return Status::Corruption("lossy chunk: exact list size, want=" + std::to_string(h.exact_count * (1 + width)) +
                              " have=" + std::to_string(h.exact_raw_size));
  if (list->size() < h.exact_raw_size) list->resize(h.exact_raw_size);
  RETURN_IF_ERROR(Unzstd(dctx, exact_z, list->data(), h.exact_raw_size, "exact list"));
  return ExactPatcher(ByteSpan(list->data(), h.exact_raw_size), h.exact_count, width);
}

Status ExactPatcher::PatchBelow(uint64_t end, MutableByteSpan out) {
  // The varint gaps are position - previous - 1, the first relative to -1.
  while (done_ < count_) {
    if (!have_position_) {
      uint32_t gap = 0;
      if (!GetVarint32(list_.first(raw_at_), &pos_, &gap))
        return Status::Corruption("lossy chunk: exact list position " + std::to_string(done_));
      position_ = next_ + gap;
      have_position_ = true;
    }
    if (position_ >= end || position_ >= out.size() / width_) break;  // a later slice's, or out of range (Finish)
    std::memcpy(out.data() + position_ * width_, list_.data() + raw_at_ + done_ * width_, width_);
    next_ = position_ + 1;
    ++done_;
    have_position_ = false;
  }
  return Status::Ok();
}

Status ExactPatcher::Finish(uint64_t n) const {
  if (done_ < count_)
    return Status::Corruption("lossy chunk: exact position < element count, want=" + std::to_string(n) +
                              " have=" + std::to_string(position_));
  if (pos_ != raw_at_)
    return Status::Corruption("lossy chunk: exact list gap bytes, want=" + std::to_string(raw_at_) +
                              " have=" + std::to_string(pos_));
  return Status::Ok();
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
