// Format detection by content: each parser is tried only when the file's
// first bytes look like its format, so a file is never parsed twice and a
// malformed file of a recognised format says why it fell back to opaque.
#include <fmt/format.h>

#include "codec/format/dcp.h"
#include "codec/format/layout.h"
#include "codec/format/npy.h"
#include "codec/format/npz.h"
#include "codec/format/safetensors.h"
#include "codec/format/torch_zip.h"
#include "codec/format/zip_archive.h"

namespace ckptfs {
namespace {

Layout OrOpaque(Result<Layout> parsed, uint64_t size, std::string_view format) {
  if (!parsed.ok()) return OpaqueLayout(size, fmt::format("{}: {}", format, parsed.status().ToString()));
  // A parser that breaks the layout invariants is a bug; stay lossless.
  Status valid = ValidateLayout(*parsed, size);
  if (!valid.ok()) return OpaqueLayout(size, fmt::format("{}: {}", format, valid.ToString()));
  return std::move(parsed).value();
}

Layout DetectZip(ByteSpan file, const ParseLimits& limits) {
  Result<ZipArchive> archive = ParseZipArchive(file, limits);
  if (!archive.ok()) {
    // Not one archive: a DCP shard is several torch.save archives back to
    // back (dcp.h).
    Result<Layout> dcp = ParseTorchZipSequence(file, limits);
    if (dcp.ok() || dcp.status().code() != StatusCode::kNotFound) return OrOpaque(std::move(dcp), file.size(), "dcp");
    return OpaqueLayout(file.size(), fmt::format("zip: {}", archive.status().ToString()));
  }
  Result<Layout> torch = ParseTorchZip(file, *archive, limits);
  if (torch.ok() || torch.status().code() != StatusCode::kNotFound)
    return OrOpaque(std::move(torch), file.size(), "torch zip");
  Result<Layout> npz = ParseNpz(file, *archive);
  if (npz.ok() || npz.status().code() != StatusCode::kNotFound) return OrOpaque(std::move(npz), file.size(), "npz");
  // A well-formed zip that is neither is simply not a known format.
  return OpaqueLayout(file.size());
}

}  // namespace

Layout DetectLayout(ByteSpan file, const ParseLimits& limits) {
  if (LooksLikeZip(file)) return DetectZip(file, limits);
  if (LooksLikeNpy(file)) return OrOpaque(ParseNpy(file), file.size(), "npy");
  if (LooksLikeSafetensors(file)) return OrOpaque(ParseSafetensors(file, limits), file.size(), "safetensors");
  return OpaqueLayout(file.size());
}

}  // namespace ckptfs
