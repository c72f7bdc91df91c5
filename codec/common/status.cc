#include "codec/common/status.h"

#include <cerrno>
#include <cstring>

namespace ckptfs {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kChecksumMismatch: return "ChecksumMismatch";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kNoSpace: return "NoSpace";
    case StatusCode::kIo: return "IoError";
    case StatusCode::kNoMemory: return "NoMemory";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::Io(int err, std::string msg) {
  msg += ": ";
  msg += std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status(StatusCode::kNoSpace, std::move(msg), err);
  if (err == ENOMEM) return Status(StatusCode::kNoMemory, std::move(msg), err);
  if (err == ENOENT) return Status(StatusCode::kNotFound, std::move(msg), err);
  return Status(StatusCode::kIo, std::move(msg), err);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg), errno_);
}

}  // namespace ckptfs
