// numpy .npz: a zip archive whose members are .npy files (np.savez). Only
// stored (uncompressed) archives are parsed; np.savez_compressed output is
// opaque.
#pragma once

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/format/zip_archive.h"

namespace ckptfs {

// Builds the layout of an .npz already parsed as `archive`: each member's
// array data is a tensor segment named by the member name without its
// ".npy" suffix (the key np.load gives it); headers and zip structure are
// verbatim; zip_crcs lists each tensor member's CRC locations. NotFound when
// some member is not named *.npy or the archive is empty (not an npz);
// Unsupported for compressed members; errors of the member .npy headers pass
// through. Never reads array data. Thread-safe.
Result<Layout> ParseNpz(ByteSpan file, const ZipArchive& archive);

}  // namespace ckptfs
