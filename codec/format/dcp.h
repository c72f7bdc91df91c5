// torch.distributed.checkpoint (DCP) shard files, `__R_k.distcp`: PyTorch's
// FileSystemWriter writes every item of a rank's plan as a complete
// torch.save archive (non-tensor objects first, then tensor chunks), one
// after another at the stream's position, so a shard is a sequence of
// torch.save zips; where each one starts is recorded only in the separate
// `.metadata` file. The layout here finds the archives from the bytes alone:
// each begins with a zip local header right where the previous one ended
// and ends with its end-of-central-directory record (offsets inside an
// archive count from its own start).
#pragma once

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// The layout of a file made of two or more torch.save archives back to
// back: each archive's layout (ParseTorchZip) moved to its offset, its
// tensors named "<index>/<name>" (the archive's position in the file, then
// the key path inside it: "3/tensor" for a chunk saved as a bare tensor), its
// zip_crcs moved with it. NotFound when the file is not such a sequence (a
// single archive, or bytes that are no archive); errors of a torch archive
// that cannot be trusted pass through. Bounded by `limits` per archive and
// by limits.max_zip_entries archives. Thread-safe.
Result<Layout> ParseTorchZipSequence(ByteSpan file, const ParseLimits& limits);

}  // namespace ckptfs
