// kBytePlaneZstd and kBytePlaneXorZstd. Payload (FORMAT.md, "Byte-plane
// payload"): u8 width, then per plane {u8 mode, u32 LE stored length}, then
// the planes' stored bytes in plane order.
#include <fmt/format.h>
#include <zstd.h>

#include <array>
#include <cmath>
#include <cstring>

#include "codec/tensor/byte_planes.h"
#include "codec/tensor/codecs.h"

namespace ckptfs {
namespace {

// How one plane is stored. Stored in blobs: never renumber.
enum class PlaneMode : uint8_t {
  kRaw = 0,       // the plane's bytes as they are
  kZstd = 1,      // one zstd frame
  kConstant = 2,  // one byte, repeated for every element
};

constexpr size_t kMaxWidth = 4;
constexpr size_t kPlaneEntrySize = 5;
size_t HeaderSize(size_t width) { return 1 + kPlaneEntrySize * width; }

// A plane whose sampled byte entropy is above this many bits per byte is
// stored raw: zstd would save under 1.5% and cost most of the encode time
// (the low mantissa bytes of trained floats sit at 7.97-8.0).
constexpr double kRawEntropyBits = 7.88;
// Sampling every kSampleStride-th byte estimates the entropy within a few
// hundredths of a bit for 1 MiB planes at a sixteenth of the cost.
constexpr size_t kSampleStride = 16;
// Planes below this entropy (long zero runs: XOR residuals of barely
// changed tensors) get zstd at the caller's level, where LZ matches pay;
// the others are order-0 data and get the literal-only settings.
constexpr double kMatchingEntropyBits = 1.0;

struct PlaneStats {
  double entropy_bits = 0;
  bool constant = false;
};

PlaneStats SamplePlane(const uint8_t* p, size_t n) {
  std::array<uint32_t, 256> hist{};
  size_t samples = 0;
  for (size_t i = 0; i < n; i += kSampleStride, ++samples) ++hist[p[i]];
  PlaneStats stats;
  double h = 0;
  int distinct = 0;
  for (uint32_t c : hist) {
    if (c == 0) continue;
    ++distinct;
    double q = static_cast<double>(c) / static_cast<double>(samples);
    h -= q * std::log2(q);
  }
  stats.entropy_bits = h;
  if (distinct == 1) {
    // The sample says constant; confirm on every byte.
    stats.constant = true;
    for (size_t i = 0; i < n; ++i)
      if (p[i] != p[0]) {
        stats.constant = false;
        break;
      }
  }
  return stats;
}

// Encodes the `width` planes (each `count` bytes) into `out`; returns the
// stored size. REQUIRES: out holds HeaderSize(width) + width * count bytes.
Result<size_t> EncodePlanes(const std::byte* const* planes, size_t count, size_t width, int level,
                            CodecScratch& scratch, std::byte* out) {
  out[0] = std::byte(width);
  size_t at = HeaderSize(width);
  for (size_t k = 0; k < width; ++k) {
    const auto* plane = reinterpret_cast<const uint8_t*>(planes[k]);
    PlaneStats stats = SamplePlane(plane, count);
    PlaneMode mode = PlaneMode::kRaw;
    size_t stored = count;
    if (count > 0 && stats.constant) {
      mode = PlaneMode::kConstant;
      stored = 1;
      out[at] = planes[k][0];
    } else if (count > 0 && stats.entropy_bits < kRawEntropyBits) {
      // Capacity one byte short of raw: zstd fails unless it saves space.
      ByteSpan plane_bytes(planes[k], count);
      Result<size_t> z = stats.entropy_bits < kMatchingEntropyBits
                             ? ZstdCompressFrame(scratch, level, plane_bytes, out + at, count - 1)
                             : ZstdCompressLiterals(scratch, plane_bytes, out + at, count - 1);
      if (z.ok()) {
        mode = PlaneMode::kZstd;
        stored = *z;
      }
    }
    if (mode == PlaneMode::kRaw && count > 0) std::memcpy(out + at, planes[k], count);
    std::byte* entry = out + 1 + kPlaneEntrySize * k;
    entry[0] = std::byte(static_cast<uint8_t>(mode));
    StoreLE32(entry + 1, static_cast<uint32_t>(stored));
    at += stored;
  }
  return at;
}

// Decodes the planes of `stored` and interleaves them into `out`.
Status DecodePlanes(ByteSpan stored, DType dtype, CodecScratch& scratch, MutableByteSpan out,
                    std::string_view what) {
  const size_t width = DTypeSize(dtype);
  if (!IsCodecFloat(dtype) || (width != 2 && width != 4))
    return Status::Corruption(fmt::format("{}: dtype {} is not a byte-plane float", what, DTypeName(dtype)));
  if (out.size() % width != 0)
    return Status::Corruption(fmt::format("{}: {} bytes is not a whole number of {}-byte elements", what,
                                          out.size(), width));
  const size_t count = out.size() / width;
  ByteReader header(stored, what);
  uint8_t stored_width = header.U8();
  if (header.ok() && stored_width != width)
    return Status::Corruption(fmt::format("{}: plane count want={} have={}", what, width, stored_width));
  std::array<PlaneMode, kMaxWidth> modes{};
  std::array<uint32_t, kMaxWidth> lengths{};
  for (size_t k = 0; k < width; ++k) {
    uint8_t mode = header.U8();
    lengths[k] = header.U32();
    if (mode > static_cast<uint8_t>(PlaneMode::kConstant))
      return Status::Corruption(fmt::format("{}: plane {} has unknown mode {}", what, k, mode));
    modes[k] = static_cast<PlaneMode>(mode);
  }
  RETURN_IF_ERROR(header.status());

  std::byte* buffer = scratch.planes.Reserve(width * count);
  std::array<const std::byte*, kMaxWidth> planes{};
  for (size_t k = 0; k < width; ++k) {
    ByteSpan data = header.Bytes(lengths[k]);
    if (!header.ok())
      return Status::Corruption(fmt::format("{}: plane {} declares {} bytes, {} remain", what, k, lengths[k],
                                            header.remaining()));
    std::byte* target = buffer + k * count;
    switch (modes[k]) {
      case PlaneMode::kRaw:
        if (data.size() != count)
          return Status::Corruption(fmt::format("{}: raw plane {} is {} bytes, want {}", what, k, data.size(), count));
        planes[k] = data.data();
        break;
      case PlaneMode::kConstant:
        if (data.size() != 1)
          return Status::Corruption(fmt::format("{}: constant plane {} is {} bytes, want 1", what, k, data.size()));
        std::memset(target, static_cast<int>(data[0]), count);
        planes[k] = target;
        break;
      case PlaneMode::kZstd:
        RETURN_IF_ERROR(ZstdDecompressFrame(scratch, data, MutableByteSpan(target, count),
                                            fmt::format("{}: plane {}", what, k)));
        planes[k] = target;
        break;
    }
  }
  if (header.remaining() != 0)
    return Status::Corruption(fmt::format("{}: {} bytes after the last plane", what, header.remaining()));
  MergeBytePlanes(planes.data(), count, width, out.data());
  return Status::Ok();
}

Result<size_t> SplitAndEncode(ByteSpan data, DType dtype, int level, CodecScratch& scratch, std::byte* out) {
  const size_t width = DTypeSize(dtype);
  const size_t count = data.size() / width;
  std::byte* buffer = scratch.planes.Reserve(width * count);
  std::array<std::byte*, kMaxWidth> planes{};
  for (size_t k = 0; k < width; ++k) planes[k] = buffer + k * count;
  SplitBytePlanes(data.data(), count, width, planes.data());
  return EncodePlanes(planes.data(), count, width, level, scratch, out);
}

}  // namespace

size_t BytePlaneCodec::MaxEncodedSize(size_t raw_size, const ChunkContext& ctx) const {
  return HeaderSize(DTypeSize(ctx.dtype)) + raw_size;
}

Result<size_t> BytePlaneCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                        std::byte* out) const {
  return SplitAndEncode(data, ctx.dtype, ctx.zstd_level, scratch, out);
}

Status BytePlaneCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                MutableByteSpan out) const {
  return DecodePlanes(stored, ctx.dtype, scratch, out, "byte-plane");
}

Result<size_t> BytePlaneXorCodec::DoEncode(ByteSpan data, const ChunkContext& ctx, CodecScratch& scratch,
                                           std::byte* out) const {
  std::byte* residual = scratch.xored.Reserve(data.size());
  XorBytes(data.data(), ctx.base.data(), data.size(), residual);
  return SplitAndEncode(ByteSpan(residual, data.size()), ctx.dtype, ctx.zstd_level, scratch, out);
}

Status BytePlaneXorCodec::DoDecode(ByteSpan stored, const ChunkContext& ctx, CodecScratch& scratch,
                                   MutableByteSpan out) const {
  if (ctx.base.size() != out.size())
    return Status::Internal(fmt::format("byte-plane-xor: base is {} bytes, want {}", ctx.base.size(), out.size()));
  RETURN_IF_ERROR(DecodePlanes(stored, ctx.dtype, scratch, out, "byte-plane-xor"));
  XorBytes(out.data(), ctx.base.data(), out.size(), out.data());
  return Status::Ok();
}

}  // namespace ckptfs
