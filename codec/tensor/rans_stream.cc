#include "codec/tensor/rans_stream.h"

#include <fmt/format.h>

namespace ckptfs {

Status RansStreamDecoder::Open(ByteSpan stored, size_t n, std::string_view what, SimdLevel level) {
  what_ = what;
  n_ = n;
  done_ = 0;
  level_ = level;
  rans::Freqs freqs;
  size_t used = 0;
  RETURN_IF_ERROR(rans::ReadFreqs(stored, &freqs, &used, what_));
  rans::BuildDecodeTable(freqs, &table_);
  return rans::ReadStreamStart(stored.subspan(used), &stream_, what_);
}

Status RansStreamDecoder::Next(uint8_t* out, size_t count) {
  if (count > n_ - done_)
    return Status::Internal(fmt::format("{}: rANS piece of {} bytes past the plane's end", what_, count));
  size_t i = 0;
  // The group decoders give symbol j of a group to state j: only a piece
  // that starts on a group boundary can use them.
  if (done_ % rans::kStates == 0) {
    const size_t groups = count / rans::kStates * rans::kStates;
    switch (level_) {
      case SimdLevel::kAvx512: i = rans::DecodeGroupsAvx512(table_, stream_, out, groups); break;
      case SimdLevel::kAvx2: i = rans::DecodeGroupsAvx2(table_, stream_, out, groups); break;
      case SimdLevel::kScalar: i = rans::DecodeGroupsScalar(table_, stream_, out, groups); break;
    }
  }
  RETURN_IF_ERROR(rans::DecodeChecked(table_, stream_, done_, i, out, count, what_));
  done_ += count;
  return Status::Ok();
}

Status RansStreamDecoder::Finish() const {
  if (done_ != n_)
    return Status::Internal(fmt::format("{}: {} of {} rANS bytes decoded", what_, done_, n_));
  return rans::CheckStreamEnd(stream_, what_);
}

}  // namespace ckptfs
