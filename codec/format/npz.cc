#include "codec/format/npz.h"

#include <fmt/format.h>

#include "codec/format/npy.h"
#include "codec/format/segments.h"

namespace ckptfs {

Result<Layout> ParseNpz(ByteSpan file, const ZipArchive& archive) {
  constexpr std::string_view kSuffix = ".npy";
  if (archive.entries.empty()) return Status::NotFound("empty zip");
  for (const ZipEntry& e : archive.entries)
    if (!std::string_view(e.name).ends_with(kSuffix)) return Status::NotFound("zip member is not a .npy file");
  Layout layout;
  layout.format = FileFormat::kNpz;
  std::vector<Segment> tensor_segments;
  for (const ZipEntry& e : archive.entries) {
    if (e.method != 0)
      return Status::Unsupported(
          fmt::format("npz: member {} is compressed (method {}), want stored", e.name, e.method));
    ByteSpan member = file.subspan(e.payload_offset, e.compressed_size);
    Result<Layout> inner = ParseNpy(member);
    if (!inner.ok()) return inner.status().WithContext(fmt::format("npz member {}", e.name));
    for (const Segment& s : inner->segments) {
      if (!s.is_tensor()) continue;
      TensorInfo info = inner->tensors[s.tensor];
      info.name = e.name.substr(0, e.name.size() - kSuffix.size());
      tensor_segments.push_back(
          Segment{e.payload_offset + s.offset, s.length, static_cast<int32_t>(layout.tensors.size())});
      layout.tensors.push_back(std::move(info));
      layout.zip_crcs.push_back(ZipCrcField{e.payload_offset, e.compressed_size, e.crc_offsets});
    }
  }
  ASSIGN_OR_RETURN(layout.segments, CoverWithVerbatim(std::move(tensor_segments), file.size()));
  return layout;
}

}  // namespace ckptfs
