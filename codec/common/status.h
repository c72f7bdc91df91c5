// The one error type of ckptfs: Status (a code plus a message) and
// Result<T> (a value or a Status). No exception crosses a layer boundary;
// fs/ maps a Status to an errno in exactly one place (ToErrno).
//
// Messages say what was wanted and what was found, e.g.
//   "blob header: unsupported version, want=1 have=7".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace ckptfs {

// Never renumber: codes are reported in JSON and exit codes.
enum class StatusCode : uint8_t {
  kOk = 0,
  kCorruption = 1,        // structurally invalid stored data
  kChecksumMismatch = 2,  // a checksum did not match its data
  kUnsupported = 3,       // valid but not handled (e.g. newer format version)
  kInvalidArgument = 4,   // caller error or bad user input
  kNotFound = 5,
  kNoSpace = 6,
  kIo = 7,                // an OS call failed; sys_errno() says which
  kNoMemory = 8,
  kInternal = 9,          // a bug: an invariant of our own code broke
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status Ok() { return Status(); }
  static Status Corruption(std::string msg) { return Status(StatusCode::kCorruption, std::move(msg)); }
  static Status ChecksumMismatch(std::string msg) {
    return Status(StatusCode::kChecksumMismatch, std::move(msg));
  }
  static Status Unsupported(std::string msg) { return Status(StatusCode::kUnsupported, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status NoSpace(std::string msg) { return Status(StatusCode::kNoSpace, std::move(msg)); }
  static Status NoMemory(std::string msg) { return Status(StatusCode::kNoMemory, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  // An OS call failed with `err` (an errno value). ENOSPC maps to kNoSpace.
  static Status Io(int err, std::string msg);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  // The errno of a kIo/kNoSpace status, else 0.
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }
  // "Corruption: <message>" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;

 private:
  Status(StatusCode code, std::string msg, int err = 0)
      : code_(code), errno_(err), message_(std::move(msg)) {}

  StatusCode code_ = StatusCode::kOk;
  int errno_ = 0;
  std::string message_;
};

// A value or an error. REQUIRES for value(): ok().
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is meaningless");

 public:
  Result(const T& value) : v_(value) {}             // NOLINT: implicit by design
  Result(T&& value) : v_(std::move(value)) {}       // NOLINT
  Result(Status status) : v_(std::move(status)) {}  // NOLINT; REQUIRES: !status.ok()

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error, or OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace ckptfs

#define CKPTFS_CONCAT_INNER(a, b) a##b
#define CKPTFS_CONCAT(a, b) CKPTFS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is an error.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::ckptfs::Status ckptfs_status_ = (expr);        \
    if (!ckptfs_status_.ok()) return ckptfs_status_; \
  } while (0)

// `lhs = value of expr`, or returns its error. `lhs` may declare a variable:
//   ASSIGN_OR_RETURN(auto reader, BlobReader::Open(...));
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(CKPTFS_CONCAT(ckptfs_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
