// A description of one blob for people and scripts: format, sizes, ratio,
// every tensor with its dtype, shape, stored bytes and codecs, and (on
// request) every chunk with its checksum. Shared by `ckptfs inspect` on a
// store file and on a bare blob.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "codec/container/blob.h"

namespace ckptfs::tools {

// REQUIRES: `reader` opened successfully. Reads only the index.
nlohmann::json DescribeBlob(const BlobReader& reader, bool with_chunks);

// Prints DescribeBlob's result as a table (header line, one line per tensor,
// the verbatim bytes, then chunks if present).
void PrintBlobReport(const std::string& title, const nlohmann::json& report);

// True if `path` starts with the blob header magic.
bool LooksLikeBlob(const std::string& path);

}  // namespace ckptfs::tools
