#include "codec/common/bytes.h"

#include <fmt/format.h>

namespace ckptfs {

Status ByteReader::status() const {
  if (ok_) return Status::Ok();
  return Status::Corruption(fmt::format("{}: truncated at offset {}, want {} more bytes have {}", what_,
                                        failed_at_, failed_need_, data_.size() - failed_at_));
}

}  // namespace ckptfs
