// libFuzzer target: zip directory parsing, torch zip layouts, CRC rewriting.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/format/layout.h"
#include "codec/format/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::ByteSpan file(reinterpret_cast<const std::byte*>(data), size);
  ckptfs::ParseLimits limits;
  limits.max_pickle_ops = 1'000'000;
  ckptfs::Layout layout = ckptfs::DetectLayout(file, limits);
  if (!ckptfs::ValidateLayout(layout, size).ok()) std::abort();
  for (const auto& crc : layout.zip_crcs)
    for (uint64_t at : crc.crc_offsets)
      if (at > size || size - at < 4) std::abort();
  auto archive = ckptfs::ParseZipArchive(file, limits);
  if (archive.ok()) {
    for (const auto& e : archive->entries)
      if (e.end_offset > archive->central_directory_offset || e.payload_offset + e.compressed_size > e.end_offset)
        std::abort();
    std::vector<std::byte> copy(file.begin(), file.end());
    (void)ckptfs::RewriteZipCrc32(copy);
  }
  return 0;
}
