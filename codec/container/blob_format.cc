#include "codec/container/blob_format.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include <zstd.h>

#include "codec/tensor/chunk_codec.h"

namespace ckptfs {
namespace {

constexpr uint8_t kMaxKnownDType = static_cast<uint8_t>(DType::kC32);
constexpr uint8_t kMaxKnownFormat = static_cast<uint8_t>(FileFormat::kDcp);
constexpr int kIndexZstdLevel = 3;

void WriteMagic(ByteWriter& w, const std::array<uint8_t, 8>& magic) {
  for (uint8_t b : magic) w.U8(b);
}

bool MagicMatches(ByteSpan bytes, const std::array<uint8_t, 8>& magic) {
  return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
}

Status CheckVersion(std::string_view what, uint16_t version, uint16_t flags, uint32_t reserved) {
  if (version != kBlobVersion && version != kBlobVersionRawIndex)
    return Status::Unsupported(fmt::format("{}: unsupported version, want<={} have={}", what, kBlobVersion, version));
  if (flags != 0) return Status::Corruption(fmt::format("{}: reserved flags set, want=0 have={:#x}", what, flags));
  if (reserved != 0)
    return Status::Corruption(fmt::format("{}: reserved field set, want=0 have={:#x}", what, reserved));
  return Status::Ok();
}

}  // namespace

std::string_view ChunkCodecName(ChunkCodec codec) {
  switch (codec) {
    case ChunkCodec::kRaw: return "raw";
    case ChunkCodec::kZstd: return "zstd";
    case ChunkCodec::kBytePlaneZstd: return "byte-plane";
    case ChunkCodec::kBytePlaneXorZstd: return "byte-plane-xor";
    case ChunkCodec::kZeros: return "zeros";
    case ChunkCodec::kZstdWithBase: return "zstd-base";
    case ChunkCodec::kLossy: return "lossy";
  }
  return "unknown";
}

void BlobHeader::EncodeTo(ByteWriter& w) const {
  WriteMagic(w, kBlobHeaderMagic);
  w.U16(version);
  w.U16(0);  // flags: none defined
  w.U32(0);  // reserved
}

Result<BlobHeader> BlobHeader::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "blob header");
  ByteSpan magic = r.Bytes(8);
  BlobHeader h;
  h.version = r.U16();
  uint16_t flags = r.U16();
  uint32_t reserved = r.U32();
  RETURN_IF_ERROR(r.status());
  if (!MagicMatches(magic, kBlobHeaderMagic)) return Status::Corruption("blob header: bad magic, not a ckptfs blob");
  RETURN_IF_ERROR(CheckVersion("blob header", h.version, flags, reserved));
  return h;
}

void BlobFooter::EncodeTo(ByteWriter& w) const {
  w.U64(index_offset);
  w.U64(index_length);
  w.U64(index_checksum);
  w.U16(version);
  w.U16(0);
  w.U32(0);
  WriteMagic(w, kBlobFooterMagic);
}

Result<BlobFooter> BlobFooter::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "blob footer");
  BlobFooter f;
  f.index_offset = r.U64();
  f.index_length = r.U64();
  f.index_checksum = r.U64();
  f.version = r.U16();
  uint16_t flags = r.U16();
  uint32_t reserved = r.U32();
  ByteSpan magic = r.Bytes(8);
  RETURN_IF_ERROR(r.status());
  if (!MagicMatches(magic, kBlobFooterMagic))
    return Status::Corruption("blob footer: bad magic, not a ckptfs blob or truncated");
  RETURN_IF_ERROR(CheckVersion("blob footer", f.version, flags, reserved));
  return f;
}

Status AppendIndexAndFooter(ByteSpan index, uint64_t index_offset, uint16_t version, std::vector<std::byte>* out) {
  const size_t start = out->size();
  if (version == kBlobVersionRawIndex) {
    out->insert(out->end(), index.begin(), index.end());
  } else {
    // The records repeat their layout and hold mostly small numbers and
    // zero parameters: zstd stores a lossy blob's index at about a third
    // (a charlm delta checkpoint: 80 kB of index, 10 % of the blob).
    out->resize(start + ZSTD_compressBound(index.size()));
    const size_t got =
        ZSTD_compress(out->data() + start, out->size() - start, index.data(), index.size(), kIndexZstdLevel);
    if (ZSTD_isError(got)) return Status::Internal(std::string("blob index: zstd: ") + ZSTD_getErrorName(got));
    out->resize(start + got);
  }
  ByteSpan stored(out->data() + start, out->size() - start);
  BlobFooter footer{index_offset, stored.size(), Checksum64(stored), version};
  ByteWriter w(out);
  footer.EncodeTo(w);
  return Status::Ok();
}

Result<std::vector<std::byte>> IndexFromStored(const BlobFooter& footer, ByteSpan stored, uint64_t max_index_bytes) {
  if (footer.version == kBlobVersionRawIndex) return std::vector<std::byte>(stored.begin(), stored.end());
  const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN)
    return Status::Corruption("blob index: not a zstd frame with a content size");
  if (declared > max_index_bytes)
    return Status::Corruption(fmt::format("blob index: {} bytes exceeds the limit {}", declared, max_index_bytes));
  std::vector<std::byte> index(declared);
  const size_t got = ZSTD_decompress(index.data(), index.size(), stored.data(), stored.size());
  if (ZSTD_isError(got) || got != declared)
    return Status::Corruption(fmt::format("blob index: zstd frame does not decode to its {} bytes", declared));
  return index;
}

void IndexHeader::EncodeTo(ByteWriter& w) const {
  w.U64(logical_size);
  w.U64(file_checksum);
  w.U8(static_cast<uint8_t>(format));
  w.U8((base ? kFlagHasBase : 0) | (ref ? kFlagHasRef : 0));
  w.U16(0);
  w.U32(tensor_count);
  w.U32(segment_count);
  w.U32(chunk_count);
  ObjectId id = base.value_or(ObjectId{});
  for (uint8_t b : id.bytes) w.U8(b);
  if (ref)
    for (uint8_t b : ref->bytes) w.U8(b);
}

Result<IndexHeader> IndexHeader::DecodeFrom(ByteReader& r) {
  IndexHeader h;
  h.logical_size = r.U64();
  h.file_checksum = r.U64();
  uint8_t format = r.U8();
  uint8_t flags = r.U8();
  uint16_t reserved = r.U16();
  h.tensor_count = r.U32();
  h.segment_count = r.U32();
  h.chunk_count = r.U32();
  ObjectId id;
  for (uint8_t& b : id.bytes) b = r.U8();
  RETURN_IF_ERROR(r.status());
  if (format > kMaxKnownFormat) return Status::Corruption(fmt::format("blob index: unknown file format {}", format));
  h.format = static_cast<FileFormat>(format);
  if ((flags & ~(kFlagHasBase | kFlagHasRef)) != 0 || reserved != 0)
    return Status::Corruption(fmt::format("blob index: reserved bits set, flags={:#x} reserved={:#x}", flags, reserved));
  if (flags & kFlagHasBase) {
    if (id.IsZero()) return Status::Corruption("blob index: base flag set but base id is zero");
    h.base = id;
  } else if (!id.IsZero()) {
    return Status::Corruption("blob index: base id present without the base flag");
  }
  if (flags & kFlagHasRef) {
    ObjectId ref;
    for (uint8_t& b : ref.bytes) b = r.U8();
    RETURN_IF_ERROR(r.status());
    if (ref.IsZero()) return Status::Corruption("blob index: ref flag set but ref id is zero");
    h.ref = ref;
  }
  return h;
}

void TensorRecord::EncodeTo(const TensorInfo& tensor, ByteWriter& w) {
  w.U16(static_cast<uint16_t>(tensor.name.size()));
  w.U8(static_cast<uint8_t>(tensor.dtype));
  w.U8(tensor.big_endian ? kFlagBigEndian : 0);
  w.U8(static_cast<uint8_t>(tensor.shape.size()));
  w.U8(0);
  w.Bytes(AsBytes(tensor.name));
  for (uint64_t d : tensor.shape) w.U64(d);
}

Result<TensorInfo> TensorRecord::DecodeFrom(ByteReader& r) {
  TensorInfo t;
  uint16_t name_length = r.U16();
  uint8_t dtype = r.U8();
  uint8_t flags = r.U8();
  uint8_t rank = r.U8();
  uint8_t reserved = r.U8();
  RETURN_IF_ERROR(r.status());
  if (dtype == 0 || dtype > kMaxKnownDType)
    return Status::Corruption(fmt::format("blob index: tensor has unknown dtype {}", dtype));
  if ((flags & ~kFlagBigEndian) != 0 || reserved != 0)
    return Status::Corruption(fmt::format("blob index: tensor reserved bits set, flags={:#x}", flags));
  if (rank > kMaxTensorRank)
    return Status::Corruption(fmt::format("blob index: tensor rank {} exceeds {}", rank, kMaxTensorRank));
  t.dtype = static_cast<DType>(dtype);
  t.big_endian = (flags & kFlagBigEndian) != 0;
  t.name = std::string(AsChars(r.Bytes(name_length)));
  t.shape.resize(r.ok() ? rank : 0);
  for (uint64_t& d : t.shape) d = r.U64();
  RETURN_IF_ERROR(r.status());
  return t;
}

void SegmentRecord::EncodeTo(const SegmentInfo& s, ByteWriter& w) {
  w.U64(s.offset);
  w.U64(s.length);
  w.U32(static_cast<uint32_t>(s.tensor));
  w.U32(s.first_chunk);
  w.U32(s.chunk_count);
  w.U32(0);
}

Result<SegmentInfo> SegmentRecord::DecodeFrom(ByteReader& r) {
  SegmentInfo s;
  s.offset = r.U64();
  s.length = r.U64();
  s.tensor = static_cast<int32_t>(r.U32());
  s.first_chunk = r.U32();
  s.chunk_count = r.U32();
  uint32_t reserved = r.U32();
  RETURN_IF_ERROR(r.status());
  if (reserved != 0) return Status::Corruption("blob index: segment reserved field set");
  return s;
}

void ChunkRecord::EncodeTo(ByteWriter& w) const {
  w.U64(info.logical_offset);
  w.U64(info.logical_length);
  w.U64(info.stored_offset);
  w.U64(info.stored_length);
  w.U64(stored_checksum);
  w.U64(info.checksum);
  w.U64(base_offset);
  w.U8(static_cast<uint8_t>(info.codec));
  w.U8(0);
  w.U16(0);
  w.U32(static_cast<uint32_t>(params.size()));
  w.Bytes(params);
}

Result<ChunkRecord> ChunkRecord::DecodeFrom(ByteReader& r) {
  ChunkRecord c;
  c.info.logical_offset = r.U64();
  c.info.logical_length = r.U64();
  c.info.stored_offset = r.U64();
  c.info.stored_length = r.U64();
  c.stored_checksum = r.U64();
  c.info.checksum = r.U64();
  c.base_offset = r.U64();
  uint8_t codec = r.U8();
  uint8_t flags = r.U8();
  uint16_t reserved = r.U16();
  uint32_t params_length = r.U32();
  RETURN_IF_ERROR(r.status());
  if (flags != 0 || reserved != 0) return Status::Corruption("blob index: chunk reserved bits set");
  if (!IsKnownChunkCodec(codec)) return Status::Unsupported(fmt::format("blob index: unknown chunk codec {}", codec));
  if (params_length > kMaxChunkParamsBytes)
    return Status::Corruption(
        fmt::format("blob index: chunk parameters {} bytes exceed {}", params_length, kMaxChunkParamsBytes));
  c.info.codec = static_cast<ChunkCodec>(codec);
  ByteSpan params = r.Bytes(params_length);
  RETURN_IF_ERROR(r.status());
  c.params.assign(params.begin(), params.end());
  return c;
}

void BlobIndex::EncodeTo(ByteWriter& w) const {
  header.EncodeTo(w);
  for (const TensorInfo& t : tensors) TensorRecord::EncodeTo(t, w);
  for (const SegmentInfo& s : segments) SegmentRecord::EncodeTo(s, w);
  for (size_t i = 0; i < chunks.size(); ++i) {
    ChunkRecord c{chunks[i], stored_checksums[i], base_offsets[i], params[i]};
    c.EncodeTo(w);
  }
}

}  // namespace ckptfs
