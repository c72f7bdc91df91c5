#include "codec/format/zip_archive.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "codec/common/hash.h"

namespace ckptfs {
namespace {

constexpr uint32_t kDataDescriptorSignature = 0x08074b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kFlagEncrypted = 1u << 0;
constexpr uint16_t kFlagDataDescriptor = 1u << 3;
constexpr uint32_t kSaturated32 = 0xffffffffu;
constexpr uint16_t kSaturated16 = 0xffffu;
constexpr size_t kMaxCommentLength = 0xffff;

Status CheckSignature(ByteReader& r, uint32_t want, std::string_view what) {
  uint32_t have = r.U32();
  RETURN_IF_ERROR(r.status());
  if (have != want)
    return Status::Corruption(fmt::format("zip {}: bad signature, want=0x{:08x} have=0x{:08x}", what, want, have));
  return Status::Ok();
}

// The body of the zip64 extended-information extra field, if `extra` has one.
std::optional<ByteSpan> FindZip64Extra(ByteSpan extra) {
  ByteReader r(extra, "zip extra field");
  while (r.remaining() >= 4) {
    uint16_t id = r.U16();
    uint16_t size = r.U16();
    ByteSpan body = r.Bytes(size);
    if (!r.ok()) return std::nullopt;
    if (id == kZip64ExtraId) return body;
  }
  return std::nullopt;
}

// Replaces each saturated 32-bit field with the next 64-bit value of the
// zip64 extra field, in the order the format fixes: uncompressed size,
// compressed size, local header offset.
Status ResolveZip64(ByteSpan extra, uint64_t* uncompressed, uint64_t* compressed, uint64_t* offset,
                    std::string_view name) {
  bool need = *uncompressed == kSaturated32 || *compressed == kSaturated32 ||
              (offset != nullptr && *offset == kSaturated32);
  if (!need) return Status::Ok();
  std::optional<ByteSpan> body = FindZip64Extra(extra);
  if (!body) return Status::Corruption(fmt::format("zip entry {}: saturated field without a zip64 extra", name));
  ByteReader r(*body, "zip64 extra field");
  if (*uncompressed == kSaturated32) *uncompressed = r.U64();
  if (*compressed == kSaturated32) *compressed = r.U64();
  if (offset != nullptr && *offset == kSaturated32) *offset = r.U64();
  return r.status();
}

bool FitsIn(uint64_t offset, uint64_t length, uint64_t end) { return offset <= end && length <= end - offset; }

// Finds the data descriptor after a payload and checks it against the
// central directory. Returns the offset past it and sets *crc_at.
Result<uint64_t> CheckDataDescriptor(ByteSpan file, const ZipEntry& e, bool zip64_first, uint64_t limit,
                                     uint64_t* crc_at) {
  uint64_t at = e.payload_offset + e.compressed_size;
  bool signed_start = FitsIn(at, 4, limit) && LoadLE32(file.data() + at) == kDataDescriptorSignature;
  uint64_t fields = at + (signed_start ? 4 : 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool wide = (attempt == 0) == zip64_first;
    uint64_t width = wide ? 8 : 4;
    if (!FitsIn(fields, 4 + 2 * width, limit)) continue;
    const std::byte* p = file.data() + fields;
    uint32_t crc = LoadLE32(p);
    uint64_t compressed = wide ? LoadLE64(p + 4) : LoadLE32(p + 4);
    uint64_t uncompressed = wide ? LoadLE64(p + 12) : LoadLE32(p + 8);
    if (crc == e.crc32 && compressed == e.compressed_size && uncompressed == e.uncompressed_size) {
      *crc_at = fields;
      return fields + 4 + 2 * width;
    }
  }
  return Status::Corruption(
      fmt::format("zip entry {}: data descriptor at {} disagrees with the central directory", e.name, at));
}

// Decodes and cross-checks the local header of `e` (whose central fields are
// filled), setting its payload and end offsets and CRC locations.
Status CheckLocalHeader(ByteSpan file, ZipEntry& e, uint16_t central_flags, uint64_t central_record_offset,
                        uint64_t limit) {
  if (!FitsIn(e.local_header_offset, ZipLocalHeader::kEncodedSize, limit))
    return Status::Corruption(fmt::format("zip entry {}: local header offset {} out of range", e.name,
                                          e.local_header_offset));
  ByteSpan rest = file.subspan(e.local_header_offset, limit - e.local_header_offset);
  ASSIGN_OR_RETURN(ZipLocalHeader lh, ZipLocalHeader::DecodeFrom(rest));
  ByteReader r(rest.subspan(ZipLocalHeader::kEncodedSize), "zip local header");
  std::string_view name = AsChars(r.Bytes(lh.name_length));
  ByteSpan extra = r.Bytes(lh.extra_length);
  RETURN_IF_ERROR(r.status());
  if (name != e.name)
    return Status::Corruption(fmt::format("zip entry {}: local header names {}", e.name, name));
  if (lh.method != e.method)
    return Status::Corruption(
        fmt::format("zip entry {}: method, want={} have={} in the local header", e.name, e.method, lh.method));
  if ((lh.flags & kFlagDataDescriptor) != (central_flags & kFlagDataDescriptor))
    return Status::Corruption(fmt::format("zip entry {}: data-descriptor flag differs", e.name));
  uint64_t compressed = lh.compressed_size;
  uint64_t uncompressed = lh.uncompressed_size;
  bool local_zip64 = FindZip64Extra(extra).has_value();
  RETURN_IF_ERROR(ResolveZip64(extra, &uncompressed, &compressed, nullptr, e.name));
  e.payload_offset = e.local_header_offset + ZipLocalHeader::kEncodedSize + lh.name_length + lh.extra_length;
  if (!FitsIn(e.payload_offset, e.compressed_size, limit))
    return Status::Corruption(fmt::format("zip entry {}: payload [{}, +{}) past the end of the entries at {}",
                                          e.name, e.payload_offset, e.compressed_size, limit));
  bool has_descriptor = (lh.flags & kFlagDataDescriptor) != 0;
  // With a data descriptor the local fields may be zero; otherwise they must
  // match the central directory exactly.
  auto agrees = [&](uint64_t local, uint64_t central) {
    return local == central || (has_descriptor && local == 0);
  };
  if (!agrees(lh.crc32, e.crc32) || !agrees(compressed, e.compressed_size) ||
      !agrees(uncompressed, e.uncompressed_size))
    return Status::Corruption(fmt::format(
        "zip entry {}: local header (crc {:08x}, sizes {}/{}) disagrees with the central directory "
        "(crc {:08x}, sizes {}/{})",
        e.name, lh.crc32, compressed, uncompressed, e.crc32, e.compressed_size, e.uncompressed_size));
  e.crc_offsets.push_back(central_record_offset + ZipCentralHeader::kCrcOffset);
  if (lh.crc32 == e.crc32 && (!has_descriptor || lh.crc32 != 0))
    e.crc_offsets.push_back(e.local_header_offset + ZipLocalHeader::kCrcOffset);
  e.end_offset = e.payload_offset + e.compressed_size;
  if (has_descriptor) {
    uint64_t crc_at = 0;
    ASSIGN_OR_RETURN(e.end_offset, CheckDataDescriptor(file, e, local_zip64, limit, &crc_at));
    e.crc_offsets.push_back(crc_at);
  }
  std::sort(e.crc_offsets.begin(), e.crc_offsets.end());
  return Status::Ok();
}

struct Directory {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t entries = 0;
  uint64_t end = 0;  // where the end records start
};

Result<Directory> FindDirectory(ByteSpan file) {
  if (file.size() < ZipEndOfCentralDirectory::kEncodedSize)
    return Status::Corruption(fmt::format("zip: {} bytes, shorter than an end record", file.size()));
  uint64_t last = file.size() - ZipEndOfCentralDirectory::kEncodedSize;
  uint64_t first = last > kMaxCommentLength ? last - kMaxCommentLength : 0;
  std::optional<uint64_t> eocd_at;
  for (uint64_t at = last + 1; at-- > first;) {
    const std::byte* p = file.data() + at;
    if (LoadLE32(p) == ZipEndOfCentralDirectory::kSignature && at + 22 + LoadLE16(p + 20) == file.size()) {
      eocd_at = at;
      break;
    }
  }
  if (!eocd_at) return Status::Corruption("zip: no end of central directory record");
  ASSIGN_OR_RETURN(ZipEndOfCentralDirectory eocd, ZipEndOfCentralDirectory::DecodeFrom(file.subspan(*eocd_at)));
  Directory dir{eocd.central_directory_offset, eocd.central_directory_size, eocd.entries, *eocd_at};
  if (*eocd_at >= Zip64EndLocator::kEncodedSize &&
      LoadLE32(file.data() + *eocd_at - Zip64EndLocator::kEncodedSize) == Zip64EndLocator::kSignature) {
    uint64_t locator_at = *eocd_at - Zip64EndLocator::kEncodedSize;
    ASSIGN_OR_RETURN(Zip64EndLocator locator, Zip64EndLocator::DecodeFrom(file.subspan(locator_at)));
    if (locator.end_disk != 0 || locator.disks > 1) return Status::Unsupported("zip: multi-disk archive");
    if (!FitsIn(locator.end_offset, Zip64EndOfCentralDirectory::kEncodedSize, locator_at))
      return Status::Corruption(
          fmt::format("zip64: end record offset {} out of range (locator at {})", locator.end_offset, locator_at));
    ASSIGN_OR_RETURN(Zip64EndOfCentralDirectory end64,
                     Zip64EndOfCentralDirectory::DecodeFrom(file.subspan(locator.end_offset)));
    if (end64.disk != 0 || end64.central_directory_disk != 0) return Status::Unsupported("zip: multi-disk archive");
    dir = Directory{end64.central_directory_offset, end64.central_directory_size, end64.entries,
                    locator.end_offset};
  } else if (eocd.disk != 0 || eocd.central_directory_disk != 0) {
    return Status::Unsupported("zip: multi-disk archive");
  }
  if (!FitsIn(dir.offset, dir.size, dir.end))
    return Status::Corruption(fmt::format("zip: central directory [{}, +{}) past its end records at {}", dir.offset,
                                          dir.size, dir.end));
  return dir;
}

// Reads the fields shared by local and central headers, from flags on.
void ReadHeaderFields(ByteReader& r, ZipHeaderFields* h) {
  h->flags = r.U16();
  h->method = r.U16();
  r.Skip(4);  // time, date
  h->crc32 = r.U32();
  h->compressed_size = r.U32();
  h->uncompressed_size = r.U32();
  h->name_length = r.U16();
  h->extra_length = r.U16();
}
}  // namespace

Result<ZipLocalHeader> ZipLocalHeader::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "zip local header");
  RETURN_IF_ERROR(CheckSignature(r, kSignature, "local header"));
  ZipLocalHeader h;
  r.Skip(2);  // version needed
  ReadHeaderFields(r, &h);
  RETURN_IF_ERROR(r.status());
  return h;
}

Result<ZipCentralHeader> ZipCentralHeader::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "zip central directory record");
  RETURN_IF_ERROR(CheckSignature(r, kSignature, "central directory record"));
  ZipCentralHeader h;
  r.Skip(4);  // version made by, version needed
  ReadHeaderFields(r, &h);
  h.comment_length = r.U16();
  h.disk_start = r.U16();
  r.Skip(6);  // internal and external attributes
  h.local_header_offset = r.U32();
  RETURN_IF_ERROR(r.status());
  return h;
}

Result<ZipEndOfCentralDirectory> ZipEndOfCentralDirectory::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "zip end of central directory");
  RETURN_IF_ERROR(CheckSignature(r, kSignature, "end of central directory"));
  ZipEndOfCentralDirectory e;
  e.disk = r.U16();
  e.central_directory_disk = r.U16();
  e.entries_on_disk = r.U16();
  e.entries = r.U16();
  e.central_directory_size = r.U32();
  e.central_directory_offset = r.U32();
  e.comment_length = r.U16();
  RETURN_IF_ERROR(r.status());
  return e;
}

Result<Zip64EndLocator> Zip64EndLocator::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "zip64 end locator");
  RETURN_IF_ERROR(CheckSignature(r, kSignature, "zip64 end locator"));
  Zip64EndLocator l;
  l.end_disk = r.U32();
  l.end_offset = r.U64();
  l.disks = r.U32();
  RETURN_IF_ERROR(r.status());
  return l;
}

Result<Zip64EndOfCentralDirectory> Zip64EndOfCentralDirectory::DecodeFrom(ByteSpan bytes) {
  ByteReader r(bytes, "zip64 end of central directory");
  RETURN_IF_ERROR(CheckSignature(r, kSignature, "zip64 end of central directory"));
  Zip64EndOfCentralDirectory e;
  r.Skip(8 + 4);  // record size, versions
  e.disk = r.U32();
  e.central_directory_disk = r.U32();
  e.entries_on_disk = r.U64();
  e.entries = r.U64();
  e.central_directory_size = r.U64();
  e.central_directory_offset = r.U64();
  RETURN_IF_ERROR(r.status());
  return e;
}

bool LooksLikeZip(ByteSpan file) {
  if (file.size() < 4) return false;
  uint32_t magic = LoadLE32(file.data());
  return magic == ZipLocalHeader::kSignature || magic == ZipEndOfCentralDirectory::kSignature;
}

Result<ZipArchive> ParseZipArchive(ByteSpan file, const ParseLimits& limits) {
  ASSIGN_OR_RETURN(Directory dir, FindDirectory(file));
  if (dir.entries > limits.max_zip_entries)
    return Status::InvalidArgument(
        fmt::format("zip: {} entries, over the limit {}", dir.entries, limits.max_zip_entries));
  if (dir.entries > dir.size / ZipCentralHeader::kEncodedSize)
    return Status::Corruption(
        fmt::format("zip: {} entries cannot fit in a {}-byte central directory", dir.entries, dir.size));
  ZipArchive archive;
  archive.central_directory_offset = dir.offset;
  archive.central_directory_size = dir.size;
  archive.entries.reserve(dir.entries);
  ByteSpan cd = file.subspan(dir.offset, dir.size);
  ByteReader r(cd, "zip central directory");
  for (uint64_t i = 0; i < dir.entries; ++i) {
    uint64_t record_offset = dir.offset + r.position();
    ASSIGN_OR_RETURN(ZipCentralHeader ch, ZipCentralHeader::DecodeFrom(cd.subspan(r.position())));
    r.Skip(ZipCentralHeader::kEncodedSize);
    ZipEntry e;
    e.name.assign(AsChars(r.Bytes(ch.name_length)));
    ByteSpan extra = r.Bytes(ch.extra_length);
    r.Skip(ch.comment_length);
    RETURN_IF_ERROR(r.status());
    if ((ch.flags & kFlagEncrypted) != 0) return Status::Unsupported(fmt::format("zip entry {}: encrypted", e.name));
    e.method = ch.method;
    e.crc32 = ch.crc32;
    e.compressed_size = ch.compressed_size;
    e.uncompressed_size = ch.uncompressed_size;
    e.local_header_offset = ch.local_header_offset;
    RETURN_IF_ERROR(ResolveZip64(extra, &e.uncompressed_size, &e.compressed_size, &e.local_header_offset, e.name));
    if (ch.disk_start != 0 && ch.disk_start != kSaturated16)
      return Status::Unsupported(fmt::format("zip entry {}: on disk {}", e.name, ch.disk_start));
    if (e.method == 0 && e.compressed_size != e.uncompressed_size)
      return Status::Corruption(fmt::format("zip entry {}: stored but sizes differ, compressed={} uncompressed={}",
                                            e.name, e.compressed_size, e.uncompressed_size));
    RETURN_IF_ERROR(CheckLocalHeader(file, e, ch.flags, record_offset, dir.offset));
    archive.entries.push_back(std::move(e));
  }
  // Entries must be disjoint: sort their extents and compare neighbours.
  std::vector<const ZipEntry*> by_offset;
  for (const ZipEntry& e : archive.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipEntry* a, const ZipEntry* b) { return a->local_header_offset < b->local_header_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->end_offset > by_offset[i]->local_header_offset)
      return Status::Corruption(fmt::format("zip: entries {} and {} overlap (end {} > start {})",
                                            by_offset[i - 1]->name, by_offset[i]->name, by_offset[i - 1]->end_offset,
                                            by_offset[i]->local_header_offset));
  return archive;
}

Status RewriteZipCrc32(MutableByteSpan file) {
  ASSIGN_OR_RETURN(ZipArchive archive, ParseZipArchive(file, ParseLimits{}));
  for (const ZipEntry& e : archive.entries)
    if (e.method != 0)
      return Status::Unsupported(fmt::format("zip entry {}: compressed (method {}), want stored", e.name, e.method));
  for (const ZipEntry& e : archive.entries) {
    uint32_t crc = Crc32(ByteSpan(file).subspan(e.payload_offset, e.compressed_size));
    for (uint64_t at : e.crc_offsets) StoreLE32(file.data() + at, crc);
  }
  return Status::Ok();
}

}  // namespace ckptfs
