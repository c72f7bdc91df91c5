#include "fs/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <vector>

#include "fs/object_file.h"
#include "fs/staging_placement.h"

namespace ckptfs::fs {

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

void TempFile::Release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  path_.clear();
}

StagingFile::~StagingFile() {
  ::close(fd_);
  if (!keep_ && !removed_) ::unlink(path_.c_str());
}

Status StagingFile::Remove() {
  if (removed_.exchange(true)) return Status::Ok();
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return Status::Io(errno, "unlink staging " + path_);
  return Status::Ok();
}

Status SyncDir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "open dir " + path);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::Io(err, "fsync dir " + path);
  return Status::Ok();
}

namespace {
// Everything under .ckptfs/ is private to the daemon's user: objects and
// staging files hold the bytes of every file, whatever its mode in the
// mount, so other users must not reach them through the backing tree.
Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return Status::Io(errno, "mkdir " + path);
  return Status::Ok();
}

// Stores made before .ckptfs/ was private (or by hand) get its mode
// tightened at mount; one private top directory covers everything below.
Status MakePrivate(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::Io(errno, "stat " + path);
  if ((st.st_mode & 077) != 0 && ::chmod(path.c_str(), 0700) != 0) return Status::Io(errno, "chmod 0700 " + path);
  return Status::Ok();
}

// Objects are opened without following symlinks: an object replaced by a
// link to a file elsewhere is refused, never served. A missing or linked
// object is a damaged store (EIO for readers), not a missing file. `file`
// is the result of opening `path`.
template <typename File>
Result<std::unique_ptr<File>> ObjectOpened(const std::string& path, Result<std::unique_ptr<File>> file) {
  if (!file.ok() && file.status().sys_errno() == ELOOP)
    return Status::Corruption(path + " is a symbolic link, not an object");
  if (!file.ok() && file.status().sys_errno() == ENOENT) return Status::Corruption(path + ": object missing");
  return file;
}

constexpr std::string_view kFormatPrefix = "ckptfs-store ";
}  // namespace

Store::Store(std::string backing, int backing_fd, const StoreOptions& options)
    : backing_(std::move(backing)), backing_fd_(backing_fd), options_(options), cache_(options.chunk_cache_bytes, options.chunk_cache_idle_reserve, options.chunk_cache_awaited_bytes) {}

Store::~Store() {
  cache_.SetSpill(nullptr);
  spill_.reset();  // its unnamed files go with it
  ReleaseStagingArea();
  if (area_lock_fd_ >= 0) ::close(area_lock_fd_);
  if (tmp_lock_fd_ >= 0) ::close(tmp_lock_fd_);
  ::close(backing_fd_);
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& backing, const StoreOptions& options) {
  int fd = ::open(backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "open backing directory " + backing);
  std::unique_ptr<Store> store(new Store(backing, fd, options));
  std::string meta = store->MetaPath("");
  std::string format_path = store->MetaPath("format");
  struct stat st;
  if (::stat(format_path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::Io(errno, "stat " + format_path);
    if (!options.create) return Status::NotFound(backing + " is not a ckptfs store (no .ckptfs/format)");
    RETURN_IF_ERROR(MakeDir(meta));
    for (const char* sub : {"objects", "staging", "tmp"}) RETURN_IF_ERROR(MakeDir(store->MetaPath(sub)));
    std::string text = fmt::format("{}{}\n", kFormatPrefix, kStoreFormatVersion);
    std::string tmp = store->MetaPath("tmp/format.new");
    RETURN_IF_ERROR(WriteWholeFile(tmp, AsBytes(text)));
    if (::rename(tmp.c_str(), format_path.c_str()) != 0) return Status::Io(errno, "rename " + tmp);
    RETURN_IF_ERROR(SyncDir(meta));
    RETURN_IF_ERROR(SyncDir(backing));
  }
  ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(format_path));
  std::string_view text = AsChars(bytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::string want = fmt::format("{}{}", kFormatPrefix, kStoreFormatVersion);
  if (text != want)
    return Status::Unsupported(fmt::format("{}: unknown store format, want='{}' have='{}'", format_path, want, text));
  if (options.create) {
    RETURN_IF_ERROR(MakePrivate(meta));
    for (const char* sub : {"objects", "staging", "tmp"}) RETURN_IF_ERROR(MakeDir(store->MetaPath(sub)));
  }
  return store;
}

std::string Store::MetaPath(std::string_view rel) const {
  return fmt::format("{}/{}/{}", backing_, kMetaDirName, rel);
}

std::string Store::ObjectPath(const ObjectId& id) const {
  std::string hex = id.Hex();
  return MetaPath(fmt::format("objects/{}/{}", hex.substr(0, 2), hex));
}

std::string Store::NewRandomHex16() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint64_t>(::getpid()) << 32 ^ counter_.fetch_add(1);
  return fmt::format("{:016x}", v);
}

namespace {
// Creates `path` and holds flock(LOCK_EX) on it: the area is live while the
// returned fd stays open (the kernel, or the shared filesystem's lock
// server, drops the lock when the process dies).
Result<int> LockAreaFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(errno, "create " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Io(err, "lock " + path);
  }
  return fd;
}
}  // namespace

Status Store::ClaimStagingArea() {
  if (!area_.empty()) return Status::Internal("staging area claimed twice");
  std::string hex = NewRandomHex16();
  if (!staging_in_store()) {
    std::error_code ec;
    std::filesystem::create_directories(StagingRoot(), ec);
    if (ec) return Status::Io(ec.value(), "create staging directory " + StagingRoot());
  }
  RETURN_IF_ERROR(MakeDir(StagingRoot() + "/" + hex));
  RETURN_IF_ERROR(MakeDir(MetaPath("tmp/" + hex)));
  ASSIGN_OR_RETURN(area_lock_fd_, LockAreaFile(StagingRoot() + "/" + hex + "/.lock"));
  if (!staging_in_store()) {
    // Other nodes cannot see a local staging area: the store-side twin
    // carries the lock that tells them this daemon lives (its temp files
    // are objects being written).
    ASSIGN_OR_RETURN(tmp_lock_fd_, LockAreaFile(MetaPath("tmp/" + hex + "/.lock")));
  }
  area_ = hex;
  const std::string area_dir = StagingRoot() + "/" + hex;
  // Only on this node's own disk: not in a shared filesystem (the files
  // would cross the network), not in memory (tmpfs: DefaultCapacity 0).
  if (options_.reconstruction_spill && !IsSharedFilesystem(area_dir)) {
    const uint64_t capacity = options_.reconstruction_spill_bytes != 0 ? options_.reconstruction_spill_bytes
                                                                       : ReconstructionSpill::DefaultCapacity(area_dir);
    if (capacity > 0) {
      spill_ = std::make_unique<ReconstructionSpill>(area_dir, capacity, ReconstructionSpill::SpaceProbe{},
                                                     options_.reconstruction_memory_bytes);
      cache_.SetSpill(spill_.get());
    }
  }
  return Status::Ok();
}

void Store::ReleaseStagingArea() {
  if (area_.empty()) return;
  std::string sdir = StagingRoot() + "/" + area_;
  std::string tdir = MetaPath("tmp/" + area_);
  std::error_code ec;
  size_t left = 0;
  for (auto& e : std::filesystem::directory_iterator(sdir, ec))
    if (e.path().filename() != ".lock") ++left;
  if (ec || left > 0) return;
  // Still holding the locks: a recovering daemon sees a live area until
  // the directories are gone.
  ::unlink((sdir + "/.lock").c_str());
  ::rmdir(sdir.c_str());
  ::unlink((tdir + "/.lock").c_str());
  ::rmdir(tdir.c_str());
  ::close(area_lock_fd_);
  area_lock_fd_ = -1;
  if (tmp_lock_fd_ >= 0) ::close(tmp_lock_fd_);
  tmp_lock_fd_ = -1;
  area_.clear();
}

Result<std::unique_ptr<StagingFile>> Store::CreateStaging() {
  if (area_.empty()) return Status::Internal("CreateStaging before ClaimStagingArea");
  std::string file_hex = fmt::format("{:08x}{}", counter_.fetch_add(1) & 0xffffffffu, NewRandomHex16().substr(8));
  ASSIGN_OR_RETURN(ObjectId raw, ObjectId::FromHex(area_ + file_hex));
  StagingId id{raw};
  std::string path = StagingRoot() + "/" + id.DirHex() + "/" + id.FileHex();
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(errno, "create staging " + path);
  auto staging = std::make_unique<StagingFile>(id, fd, path, options_.hash_staged_writes);
  staging->digest().Reset();  // empty, and O_EXCL: nobody else wrote to it
  return staging;
}

Result<TempFile> Store::CreateTemp() {
  std::string dir = area_.empty() ? MetaPath("tmp") : MetaPath("tmp/" + area_);
  std::string path = fmt::format("{}/{}.{}", dir, NewRandomHex16(), counter_.fetch_add(1));
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Io(errno, "create temp " + path);
  return TempFile(fd, path);
}

Result<ObjectId> Store::PublishObject(TempFile tmp) {
  if (::fsync(tmp.fd()) != 0) return Status::Io(errno, "fsync " + tmp.path());
  // Hashed through a small buffer rather than a mapping of the whole
  // object: a mapping would add the object's size to the daemon's RSS.
  ObjectIdStream hash;
  {
    std::vector<std::byte> buf(1 << 20);
    for (off_t off = 0;;) {
      ssize_t n = ::pread(tmp.fd(), buf.data(), buf.size(), off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Io(errno, "read " + tmp.path());
      if (n == 0) break;
      hash.Update(ByteSpan(buf.data(), static_cast<size_t>(n)));
      off += n;
    }
  }
  ObjectId id = hash.Digest();
  if (::fchmod(tmp.fd(), 0400) != 0) return Status::Io(errno, "chmod " + tmp.path());
  std::string hex = id.Hex();
  std::string dir = MetaPath("objects/" + hex.substr(0, 2));
  RETURN_IF_ERROR(MakeDir(dir));
  std::string final_path = dir + "/" + hex;
  // Same content already stored: refresh its age for GC's grace period.
  // If GC took it away meanwhile (ENOENT), ours takes its place.
  if (::utimensat(AT_FDCWD, final_path.c_str(), nullptr, 0) == 0 || errno == EROFS)
    return id;  // tmp is unlinked by its destructor
  if (errno != ENOENT) return Status::Io(errno, "touch " + final_path);
  if (::rename(tmp.path().c_str(), final_path.c_str()) != 0) return Status::Io(errno, "rename to " + final_path);
  tmp.Release();
  RETURN_IF_ERROR(SyncDir(dir));
  return id;
}

Status Store::TouchObject(const ObjectId& id) {
  std::string path = ObjectPath(id);
  if (::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) == 0) return Status::Ok();
  if (errno == ENOENT) return Status::NotFound("object " + id.Hex() + " was removed");
  return Status::Io(errno, "touch " + path);
}

Result<std::shared_ptr<const BlobReader>> Store::OpenBlob(const ObjectId& id) {
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    auto it = readers_.find(id);
    if (it != readers_.end()) return it->second;
  }
  // Blobs are read in place through a mapping (fs/object_file.h).
  const std::string path = ObjectPath(id);
  ASSIGN_OR_RETURN(auto file, ObjectOpened(path, ObjectFile::Open(path)));
  std::shared_ptr<const RandomAccessFile> shared(std::move(file));
  auto reader = BlobReader::Open(shared, id, this, &cache_);
  if (!reader.ok()) return reader.status().WithContext("object " + id.Hex());
  std::lock_guard<std::mutex> lock(readers_mu_);
  auto [it, inserted] = readers_.emplace(id, *reader);
  if (inserted) {
    reader_order_.push_front(id);
    while (readers_.size() > options_.max_open_readers) {
      readers_.erase(reader_order_.back());
      reader_order_.pop_back();
    }
  }
  return it->second;
}

size_t Store::DropRemovedObjects() {
  auto removed = [&](const ObjectId& id) { return ::access(ObjectPath(id).c_str(), F_OK) != 0 && errno == ENOENT; };
  size_t dropped = 0;
  if (spill_) {
    for (const ObjectId& id : spill_->Blobs()) {
      if (removed(id)) {
        spill_->Drop(id);
        ++dropped;
      }
    }
  }
  std::vector<ObjectId> cached;
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    cached.assign(reader_order_.begin(), reader_order_.end());
  }
  std::unordered_set<ObjectId, ObjectIdHash> gone;
  for (const ObjectId& id : cached)
    if (removed(id)) gone.insert(id);
  if (gone.empty()) return dropped;
  std::lock_guard<std::mutex> lock(readers_mu_);
  for (const ObjectId& id : gone) readers_.erase(id);
  reader_order_.remove_if([&](const ObjectId& id) { return gone.count(id) > 0; });
  return dropped + gone.size();
}

Result<std::shared_ptr<const RandomAccessFile>> Store::OpenRaw(const ObjectId& id) {
  const std::string path = ObjectPath(id);
  ASSIGN_OR_RETURN(auto file, ObjectOpened(path, PosixFile::Open(path, O_NOFOLLOW)));
  return std::shared_ptr<const RandomAccessFile>(std::move(file));
}

int OpenNoAtime(int dirfd, const char* path, int flags) {
  int fd = ::openat(dirfd, path, flags | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::openat(dirfd, path, flags);
  return fd;
}

namespace {
// ForEachUserFile below `rel` (the root when empty), open at `dfd` (taken
// over). The first error is kept in *error; the walk goes on.
void WalkUserDir(int dfd, const std::string& rel, const std::function<void(const std::string&)>& fn, int* error) {
  DIR* dir = ::fdopendir(dfd);
  if (dir == nullptr) {
    if (*error == 0) *error = errno;
    ::close(dfd);
    return;
  }
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      if (errno != 0 && *error == 0) *error = errno;
      break;
    }
    std::string_view name = e->d_name;
    if (name == "." || name == ".." || (rel.empty() && name == kMetaDirName)) continue;
    unsigned char type = e->d_type;
    if (type == DT_UNKNOWN) {
      struct stat st;
      if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      type = IFTODT(st.st_mode);
    }
    std::string child = rel.empty() ? std::string(name) : rel + "/" + std::string(name);
    if (type == DT_REG) {
      fn(child);
    } else if (type == DT_DIR) {
      int sub = OpenNoAtime(::dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) WalkUserDir(sub, child, fn, error);
      else if (errno != ENOENT && *error == 0) *error = errno;
    }
  }
  ::closedir(dir);
}
}  // namespace

Status ForEachUserFile(const std::string& backing, const std::function<void(const std::string&)>& fn) {
  int fd = OpenNoAtime(AT_FDCWD, backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "walk " + backing);
  int error = 0;
  WalkUserDir(fd, "", fn, &error);
  // A walk that missed a directory must not pass for complete (GC would
  // take the objects of the files it did not see for garbage).
  if (error != 0) return Status::Io(error, "walk " + backing);
  return Status::Ok();
}

}  // namespace ckptfs::fs
