#include "codec/common/replacement_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>
#include <vector>

#include "codec/common/io.h"

namespace ckptfs {

Result<ReplacementFile> ReplacementFile::Create(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") return Status::InvalidArgument("not a file name: " + path);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::Io(errno, "open " + path);
    return ReplacementFile(fd, path, std::string());
  }
  std::string temp = dir + "." + name + ".ckptfs-XXXXXX";
  std::vector<char> buf(temp.begin(), temp.end());
  buf.push_back('\0');
  const int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "create a file beside " + path);
  temp.assign(buf.data());
  // mkostemp makes it 0600; an output is an ordinary file (0644 less the
  // umask, as open(O_CREAT, 0644) gives).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0644 & ~mask) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    return Status::Io(err, "chmod " + temp);
  }
  return ReplacementFile(fd, path, std::move(temp));
}

ReplacementFile::ReplacementFile(int fd, std::string path, std::string temp_path)
    : fd_(fd), path_(std::move(path)), temp_path_(std::move(temp_path)) {}

ReplacementFile::ReplacementFile(ReplacementFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
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
  // Only a regular file is unlinked first (one that appeared since Create
  // as something else makes the rename fail with its own error).
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(path_.c_str()) != 0 && errno != ENOENT)
    return Status::Io(errno, "replace " + path_);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return Status::Io(errno, "rename into " + path_);
  committed_ = true;
  return Status::Ok();
}

}  // namespace ckptfs
