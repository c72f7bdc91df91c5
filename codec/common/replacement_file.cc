#include "codec/common/replacement_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <utility>

#include "codec/common/io.h"

namespace ckptfs {

namespace {


// The file a replacement replaces: `path`, or for a symbolic link the
// path it resolves to; nullopt when the bytes must go into `path` itself.
struct Target {
  std::string path;
  bool exists = false;
  struct stat st {};
};
std::optional<Target> ReplaceableTarget(const std::string& path) {
  Target t;
  t.path = path;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return t;  // a new file
  if (S_ISLNK(st.st_mode)) {
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) return std::nullopt;  // dangling: written through
    t.path = resolved;
    if (::lstat(t.path.c_str(), &st) != 0) return std::nullopt;
  }
  if (!S_ISREG(st.st_mode) || st.st_nlink > 1) return std::nullopt;
  t.exists = true;
  t.st = st;
  return t;
}

// A new file beside `target` with a name no other file has; -1 (errno
// set) when none can be made.
int CreateBeside(const std::string& target, std::string* temp) {
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : target.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  std::random_device seed;
  std::mt19937_64 rng(seed());
  for (int attempt = 0; attempt < 100; ++attempt) {
    *temp = fmt::format("{}.{}.ckptfs-{:06x}", dir, name, rng() & 0xffffff);
    // 0644 with the umask (and a default ACL) applied by the kernel.
    const int fd = ::open(temp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}


}  // namespace

Result<ReplacementFile> ReplacementFile::Create(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") return Status::InvalidArgument("not a file name: " + path);
  std::optional<Target> target = ReplaceableTarget(path);
  std::string temp;
  const int fd = target ? CreateBeside(target->path, &temp) : -1;
  if (fd >= 0 && target->exists) {
    // The old file's owner (where it differs and may be given) and mode.
    const bool owner_kept = (target->st.st_uid == ::geteuid() && target->st.st_gid == ::getegid()) ||
                            ::fchown(fd, target->st.st_uid, target->st.st_gid) == 0;
    if (!owner_kept || ::fchmod(fd, target->st.st_mode & 07777) != 0) {
      ::close(fd);
      ::unlink(temp.c_str());
      target.reset();
    }
  }
  if (fd < 0 || !target) {
    // Into `path` itself (see the header for when).
    const int direct = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (direct < 0) return Status::Io(errno, "open " + path);
    return ReplacementFile(direct, path, path, std::string());
  }
  return ReplacementFile(fd, path, target->path, std::move(temp));
}

ReplacementFile::ReplacementFile(int fd, std::string path, std::string target, std::string temp_path)
    : fd_(fd), path_(std::move(path)), target_(std::move(target)), temp_path_(std::move(temp_path)) {}

ReplacementFile::ReplacementFile(ReplacementFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      temp_path_(std::move(other.temp_path_)),
      committed_(std::exchange(other.committed_, true)) {}

ReplacementFile::~ReplacementFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

Status ReplacementFile::Append(ByteSpan data) {
  if (fd_ < 0) return Status::Internal("append to " + path_ + " after its commit");
  return WriteAll(fd_, data, path_);
}

Status ReplacementFile::Commit() {
  if (fd_ < 0) return Status::Internal("second commit of " + path_);
  if (::close(std::exchange(fd_, -1)) != 0) return Status::Io(errno, "close " + path_);
  if (temp_path_.empty()) {
    committed_ = true;
    return Status::Ok();
  }
  // Swap the names, then remove the old file (now under the temporary
  // name); without an old file, or where the filesystem cannot swap, the
  // plain rename (atomic as well). Either fails or is done: on a failure
  // the old file is untouched and the new one is removed.
  if (::renameat2(AT_FDCWD, temp_path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;
    ::unlink(temp_path_.c_str());  // the old bytes; a failure leaves only a stray hidden file
    return Status::Ok();
  }
  if (::rename(temp_path_.c_str(), target_.c_str()) != 0) return Status::Io(errno, "rename into " + path_);
  committed_ = true;
  return Status::Ok();
}

}  // namespace ckptfs
