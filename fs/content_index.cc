#include "fs/content_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "codec/common/io.h"

namespace ckptfs::fs {

namespace {

constexpr char kMagic[8] = {'C', 'K', 'F', 'S', 'C', 'I', 'X', '1'};
constexpr size_t kChecked = 40;  // bytes covered by the checksum

std::string EntryPath(Store& store, const ObjectId& key) {
  const std::string hex = key.Hex();
  return store.MetaPath(fmt::format("content/{}/{}", hex.substr(0, 2), hex));
}

void AppendDouble(std::string* out, double v) {
  char raw[sizeof v];
  std::memcpy(raw, &v, sizeof v);
  out->append(raw, sizeof raw);
}

// Walks a blob's chain as TouchChain does (refreshing every link, so that
// GC's grace period covers the chain until a manifest names it) and
// returns its depth.
Result<uint32_t> TouchChainDepth(Store& store, const ObjectId& id) {
  RETURN_IF_ERROR(store.TouchObject(id));
  ASSIGN_OR_RETURN(auto link, store.OpenBlob(id));
  uint32_t depth = 0;
  for (; link->base() && depth < 4096; ++depth) {
    const ObjectId below = *link->base();
    RETURN_IF_ERROR(store.TouchObject(below));
    ASSIGN_OR_RETURN(link, store.OpenBlob(below));
  }
  return depth;
}

}  // namespace

void ContentEntry::EncodeTo(std::byte* out) const {
  std::memset(out, 0, kEncodedSize);
  std::memcpy(out, kMagic, 8);
  std::memcpy(out + 8, object.bytes.data(), 16);
  StoreLE32(out + 24, chain_depth);
  out[28] = static_cast<std::byte>(format);
  StoreLE64(out + 32, logical_size);
  StoreLE64(out + kChecked, Checksum64(ByteSpan(out, kChecked)));
}

Result<ContentEntry> ContentEntry::DecodeFrom(ByteSpan bytes) {
  if (bytes.size() != kEncodedSize)
    return Status::Corruption(fmt::format("content entry: size want={} have={}", kEncodedSize, bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) return Status::Corruption("content entry: bad magic");
  if (LoadLE64(bytes.data() + kChecked) != Checksum64(bytes.first(kChecked)))
    return Status::Corruption("content entry: checksum mismatch");
  if (bytes[29] != std::byte{0} || bytes[30] != std::byte{0} || bytes[31] != std::byte{0})
    return Status::Corruption("content entry: reserved bytes set");
  ContentEntry e;
  std::memcpy(e.object.bytes.data(), bytes.data() + 8, 16);
  e.chain_depth = LoadLE32(bytes.data() + 24);
  e.format = static_cast<FileFormat>(bytes[28]);
  e.logical_size = LoadLE64(bytes.data() + 32);
  return e;
}

std::string CodingSignature(const EncodeOptions& e) {
  return fmt::format("chunk={} schedule={}/{}/{} predict={} step_space={} low_rank={} dither={} trellis={} blob={}",
                     e.chunk_bytes, static_cast<int>(e.budget_schedule.kind), e.budget_schedule.update_fraction,
                     e.budget_schedule.min_fraction, e.step_prediction, e.momentum_step_space, e.low_rank_moments,
                     e.momentum_dither, e.trellis, e.blob_version);
}

ObjectId ContentKey(ByteSpan file, const Layout& layout, const CommitOptions& options,
                    std::string_view logical_path) {
  // What the key covers besides the bytes: the settings of the encoder and
  // each tensor's budget at this path (a policy may give two paths
  // different budgets; a lossless mount never reuses a lossy blob).
  std::string how = fmt::format("ckptfs-content 1|compress={}|{}|", options.compress, options.coding);
  if (options.policy && layout.format != FileFormat::kOpaque) {
    for (const TensorInfo& t : layout.tensors) {
      const lossy::Budget b = options.policy->BudgetFor(logical_path, layout.format, t);
      how.append(t.name);
      how.push_back('\0');
      AppendDouble(&how, b.rel_l2);
      AppendDouble(&how, b.max_abs);
      AppendDouble(&how, b.max_rel);
      AppendDouble(&how, b.step_rel_l2);
    }
  }
  const ObjectId data = ObjectId::Of(file);
  ObjectIdStream key;
  key.Update(ByteSpan(reinterpret_cast<const std::byte*>(data.bytes.data()), data.bytes.size()));
  key.Update(AsBytes(how));
  return key.Digest();
}

std::optional<ContentEntry> FindIdenticalContent(Store& store, const ObjectId& key, uint64_t logical_size,
                                                 FileFormat format, Logger* log) {
  const std::string path = EntryPath(store, key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  std::byte raw[ContentEntry::kEncodedSize + 1];
  const ssize_t n = ::pread(fd, raw, sizeof raw, 0);
  ::close(fd);
  if (n < 0) return std::nullopt;
  Result<ContentEntry> entry = ContentEntry::DecodeFrom(ByteSpan(raw, static_cast<size_t>(n)));
  if (!entry.ok()) {
    if (log) log->Debug("content index {}: {}", key.Hex(), entry.status().ToString());
    return std::nullopt;
  }
  if (entry->logical_size != logical_size || entry->format != format) return std::nullopt;
  Result<uint32_t> depth = TouchChainDepth(store, entry->object);
  if (!depth.ok()) {
    if (log) log->Debug("content index {}: object {}: {}", key.Hex(), entry->object.Hex(), depth.status().ToString());
    return std::nullopt;
  }
  Result<std::shared_ptr<const BlobReader>> reader = store.OpenBlob(entry->object);
  if (!reader.ok() || (*reader)->logical_size() != logical_size || (*reader)->format() != format)
    return std::nullopt;
  entry->chain_depth = *depth;
  return *entry;
}

void RecordContent(Store& store, const ObjectId& key, const ContentEntry& entry, Logger* log) {
  const std::string path = EntryPath(store, key);
  const std::string dir = path.substr(0, path.rfind('/'));
  if (::mkdir(store.MetaPath("content").c_str(), 0700) != 0 && errno != EEXIST) return;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
  std::byte raw[ContentEntry::kEncodedSize];
  entry.EncodeTo(raw);
  Result<TempFile> tmp = store.CreateTemp();
  if (!tmp.ok()) return;
  if (::pwrite(tmp->fd(), raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw) ||
      ::rename(tmp->path().c_str(), path.c_str()) != 0) {
    if (log) log->Debug("content index {}: {}", key.Hex(), std::strerror(errno));
    return;
  }
  tmp->Release();
}

uint64_t SweepContentIndex(Store& store, bool dry_run) {
  uint64_t removed = 0;
  const std::string root = store.MetaPath("content");
  DIR* top = ::opendir(root.c_str());
  if (top == nullptr) return 0;
  while (struct dirent* d = ::readdir(top)) {
    if (d->d_name[0] == '.') continue;
    const std::string sub = root + "/" + d->d_name;
    DIR* dir = ::opendir(sub.c_str());
    if (dir == nullptr) continue;
    while (struct dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const std::string path = sub + "/" + e->d_name;
      auto bytes = ReadWholeFile(path);
      auto entry = bytes.ok() ? ContentEntry::DecodeFrom(*bytes) : Result<ContentEntry>(bytes.status());
      struct stat st;
      const bool gone = !entry.ok() || ::stat(store.ObjectPath(entry->object).c_str(), &st) != 0;
      if (!gone) continue;
      ++removed;
      if (!dry_run) ::unlink(path.c_str());
    }
    ::closedir(dir);
  }
  ::closedir(top);
  return removed;
}

}  // namespace ckptfs::fs
