// A strict, read-only zip (and zip64) directory parser for stored archives
// such as torch.save files. It reads the end-of-central-directory records and
// the central directory, cross-checks each local header and data descriptor,
// and never reads entry payloads. Also rewrites entry CRC-32s in place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// The fields a local and a central header share, in the same order (from
// "general purpose flags" to "extra field length").
struct ZipHeaderFields {
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc32 = 0;
  uint32_t compressed_size = 0;
  uint32_t uncompressed_size = 0;
  uint16_t name_length = 0;
  uint16_t extra_length = 0;
};

// Fixed part of a local file header (signature PK\3\4). Read-only: ckptfs
// never writes zip structures, it only patches CRC fields.
struct ZipLocalHeader : ZipHeaderFields {
  static constexpr uint32_t kSignature = 0x04034b50;
  static constexpr size_t kEncodedSize = 30;
  static constexpr size_t kCrcOffset = 14;
  static Result<ZipLocalHeader> DecodeFrom(ByteSpan bytes);
};

// Fixed part of a central directory file header (PK\1\2).
struct ZipCentralHeader : ZipHeaderFields {
  static constexpr uint32_t kSignature = 0x02014b50;
  static constexpr size_t kEncodedSize = 46;
  static constexpr size_t kCrcOffset = 16;
  uint16_t comment_length = 0;
  uint16_t disk_start = 0;
  uint32_t local_header_offset = 0;
  static Result<ZipCentralHeader> DecodeFrom(ByteSpan bytes);
};

// End of central directory record (PK\5\6), without its comment.
struct ZipEndOfCentralDirectory {
  static constexpr uint32_t kSignature = 0x06054b50;
  static constexpr size_t kEncodedSize = 22;
  uint16_t disk = 0;
  uint16_t central_directory_disk = 0;
  uint16_t entries_on_disk = 0;
  uint16_t entries = 0;
  uint32_t central_directory_size = 0;
  uint32_t central_directory_offset = 0;
  uint16_t comment_length = 0;
  static Result<ZipEndOfCentralDirectory> DecodeFrom(ByteSpan bytes);
};

// Zip64 end of central directory locator (PK\6\7).
struct Zip64EndLocator {
  static constexpr uint32_t kSignature = 0x07064b50;
  static constexpr size_t kEncodedSize = 20;
  uint32_t end_disk = 0;
  uint64_t end_offset = 0;
  uint32_t disks = 0;
  static Result<Zip64EndLocator> DecodeFrom(ByteSpan bytes);
};

// Zip64 end of central directory record (PK\6\6), fixed part.
struct Zip64EndOfCentralDirectory {
  static constexpr uint32_t kSignature = 0x06064b50;
  static constexpr size_t kEncodedSize = 56;
  uint32_t disk = 0;
  uint32_t central_directory_disk = 0;
  uint64_t entries_on_disk = 0;
  uint64_t entries = 0;
  uint64_t central_directory_size = 0;
  uint64_t central_directory_offset = 0;
  static Result<Zip64EndOfCentralDirectory> DecodeFrom(ByteSpan bytes);
};

// One checked entry. Offsets are absolute in the file.
struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 = stored
  uint32_t crc32 = 0;   // as the central directory records it
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
  uint64_t payload_offset = 0;
  uint64_t end_offset = 0;  // past the payload and its data descriptor
  // Every place the entry's CRC-32 is stored: the central directory record,
  // the data descriptor when there is one, and the local header unless the
  // data-descriptor flag left it zero.
  std::vector<uint64_t> crc_offsets;
};

struct ZipArchive {
  std::vector<ZipEntry> entries;  // central directory order
  uint64_t central_directory_offset = 0;
  uint64_t central_directory_size = 0;
};

// True if `file` starts like a zip archive (a local header or an empty
// archive's end record).
bool LooksLikeZip(ByteSpan file);

// Parses and cross-checks the archive's directory. Corruption (message says
// what disagreed, want/have) for a truncated or lying structure, entries that
// overlap each other or the central directory, offsets past the end, or a
// local header that disagrees with the central directory; Unsupported for
// multi-disk archives or encrypted entries; InvalidArgument past
// limits.max_zip_entries. Never reads payload bytes. Thread-safe.
Result<ZipArchive> ParseZipArchive(ByteSpan file, const ParseLimits& limits);

// Recomputes every entry's CRC-32 from its current payload and stores it in
// the central directory, the data descriptor and (when it holds one) the
// local header. Sizes are unchanged. REQUIRES: entries are stored
// (uncompressed); Unsupported otherwise. Errors of ParseZipArchive pass
// through, and the file is not modified then. Not thread-safe on `file`.
Status RewriteZipCrc32(MutableByteSpan file);

}  // namespace ckptfs
