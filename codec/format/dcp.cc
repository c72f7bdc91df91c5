#include "codec/format/dcp.h"

#include <fmt/format.h>

#include <cstring>

#include "codec/format/torch_zip.h"
#include "codec/format/zip_archive.h"

namespace ckptfs {

namespace {

constexpr std::byte kEndSignature[4] = {std::byte{'P'}, std::byte{'K'}, std::byte{5}, std::byte{6}};
constexpr size_t kEndSize = 22;  // end of central directory record, without its comment
constexpr int kMaxTries = 64;    // end records tried per archive

// The archive that starts at `begin`: the first end-of-central-directory
// record after it whose archive parses (a signature inside a payload is
// skipped: the archive it would close does not parse). NotFound when none.
Result<std::pair<uint64_t, ZipArchive>> ArchiveAt(ByteSpan file, uint64_t begin, const ParseLimits& limits) {
  const std::byte* base = file.data();
  // A payload may hold the signature by chance; a file full of it must not
  // cost a directory parse per byte.
  int tries = 0;
  for (uint64_t from = begin; from + kEndSize <= file.size() && tries < kMaxTries; ++tries) {
    const void* hit = ::memmem(base + from, file.size() - from, kEndSignature, sizeof kEndSignature);
    if (hit == nullptr) break;
    const uint64_t at = static_cast<uint64_t>(static_cast<const std::byte*>(hit) - base);
    if (at + kEndSize > file.size()) break;
    const uint64_t end = at + kEndSize + LoadLE16(base + at + 20);
    if (end <= file.size()) {
      Result<ZipArchive> archive = ParseZipArchive(file.subspan(begin, end - begin), limits);
      if (archive.ok()) return std::make_pair(end, std::move(*archive));
    }
    from = at + 1;
  }
  return Status::NotFound(fmt::format("no zip archive ends after offset {}", begin));
}

}  // namespace

Result<Layout> ParseTorchZipSequence(ByteSpan file, const ParseLimits& limits) {
  Layout out;
  out.format = FileFormat::kDcp;
  uint32_t index = 0;
  for (uint64_t begin = 0; begin < file.size(); ++index) {
    if (index >= limits.max_zip_entries)
      return Status::InvalidArgument(fmt::format("dcp: more than {} archives", limits.max_zip_entries));
    if (!LooksLikeZip(file.subspan(begin)))
      return Status::NotFound(fmt::format("dcp: no zip archive at offset {}", begin));
    ASSIGN_OR_RETURN(auto found, ArchiveAt(file, begin, limits));
    const uint64_t end = found.first;
    ByteSpan part = file.subspan(begin, end - begin);
    Result<Layout> layout = ParseTorchZip(part, found.second, limits);
    if (!layout.ok())
      return layout.status().WithContext(fmt::format("dcp: archive {} at offset {}", index, begin));
    if (out.tensors.size() + layout->tensors.size() > limits.max_tensors)
      return Status::InvalidArgument(fmt::format("dcp: more than {} tensors", limits.max_tensors));
    const int32_t first_tensor = static_cast<int32_t>(out.tensors.size());
    for (TensorInfo& t : layout->tensors) {
      t.name = fmt::format("{}/{}", index, t.name);
      out.tensors.push_back(std::move(t));
    }
    for (Segment s : layout->segments) {
      s.offset += begin;
      if (s.is_tensor()) s.tensor += first_tensor;
      out.segments.push_back(s);
    }
    for (ZipCrcField f : layout->zip_crcs) {
      f.payload_offset += begin;
      for (uint64_t& at : f.crc_offsets) at += begin;
      out.zip_crcs.push_back(std::move(f));
    }
    out.archives.emplace_back(begin, end - begin);
    begin = end;
  }
  if (index < 2) return Status::NotFound("dcp: a single archive is a torch zip");
  // Adjacent verbatim segments of two archives stay apart: a layout needs
  // coverage, not the fewest segments.
  return out;
}

}  // namespace ckptfs
