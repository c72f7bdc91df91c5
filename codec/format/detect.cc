// Placeholder until the format parsers land: everything is opaque.
#include "codec/format/layout.h"

namespace ckptfs {

Layout DetectLayout(ByteSpan file, const ParseLimits& /*limits*/) { return OpaqueLayout(file.size()); }

}  // namespace ckptfs
