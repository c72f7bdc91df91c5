// torch.save's zip format: each <prefix>/data/<key> record is one storage
// whose dtype and tensor name come from <prefix>/data.pkl. The archive
// prefix is not fixed (file stem, "archive" for file objects), so it is
// taken from the data.pkl record's name.
#pragma once

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/format/zip_archive.h"

namespace ckptfs {

// Builds the layout of a torch.save zip already parsed as `archive`:
// storage payloads become tensor segments, every other byte is verbatim, and
// zip_crcs lists the CRC locations of each tensor record. Storages whose
// dtype the pickle does not give, or whose record size is not numel times the
// element size, stay verbatim. NotFound when the archive has no
// "<prefix>/data.pkl" record (not a torch file); Corruption or Unsupported
// (message says why) when it is a torch file that cannot be trusted: a
// compressed data.pkl or tensor record, a storage with no record, a pickle
// the bounded machine rejects. Reads only the zip structure and data.pkl.
// Thread-safe.
Result<Layout> ParseTorchZip(ByteSpan file, const ZipArchive& archive, const ParseLimits& limits);

}  // namespace ckptfs
