#include "fs/content_index.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "fs/blob_links.h"

namespace ckptfs::fs {

namespace {

std::string EntryPath(Store& store, const ObjectId& key) { return store.MetaPath("content/" + key.Hex()); }

std::string TextChecksum(std::string_view text) {
  return fmt::format("{:08x}", static_cast<uint32_t>(Checksum64(AsBytes(text))));
}

bool IsLowerHex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
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
  RETURN_IF_ERROR(TouchLinked(store, *link));  // its refs too
  uint32_t depth = 0;
  for (; link->base() && depth < 4096; ++depth) {
    ASSIGN_OR_RETURN(link, store.OpenBlob(*link->base()));
  }
  return depth;
}

}  // namespace

std::string ContentEntry::EncodeText() const {
  const std::string body =
      fmt::format("{}.{}.{}.{:x}", object.Hex(), chain_depth, static_cast<unsigned>(format), logical_size);
  return body + "." + TextChecksum(body);
}

Result<ContentEntry> ContentEntry::DecodeText(std::string_view text) {
  const size_t last = text.rfind('.');
  if (last == std::string_view::npos || text.substr(last + 1) != TextChecksum(text.substr(0, last)))
    return Status::Corruption("content entry: checksum mismatch");
  std::vector<std::string_view> f;
  for (size_t pos = 0; pos <= last;) {
    size_t dot = text.find('.', pos);
    f.push_back(text.substr(pos, dot - pos));
    pos = dot + 1;
  }
  if (f.size() != 4) return Status::Corruption(fmt::format("content entry: fields want=4 have={}", f.size()));
  ContentEntry e;
  ASSIGN_OR_RETURN(e.object, ObjectId::FromHex(f[0]));
  auto number = [](std::string_view s, int base, uint64_t max) -> std::optional<uint64_t> {
    if (s.empty() || s.size() > 16 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
    if (base == 16 ? !IsLowerHex(s) : !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    uint64_t v = std::stoull(std::string(s), nullptr, base);
    return v <= max ? std::optional<uint64_t>(v) : std::nullopt;
  };
  auto depth = number(f[1], 10, UINT32_MAX);
  auto format = number(f[2], 10, 255);
  auto size = number(f[3], 16, UINT64_MAX);
  if (!depth || !format || !size) return Status::Corruption("content entry: bad number");
  e.chain_depth = static_cast<uint32_t>(*depth);
  e.format = static_cast<FileFormat>(*format);
  e.logical_size = *size;
  return e;
}

std::string CodingSignature(const EncodeOptions& e) {
  return fmt::format("chunk={} schedule={}/{}/{} predict={} step_space={} low_rank={} dither={} trellis={} blob={}",
                     e.chunk_bytes, static_cast<int>(e.budget_schedule.kind), e.budget_schedule.update_fraction,
                     e.budget_schedule.min_fraction, e.step_prediction, e.momentum_step_space, e.low_rank_moments,
                     e.momentum_dither, e.trellis, e.blob_version);
}

ObjectId ContentKey(const FileDigests& file, const Layout& layout, const CommitOptions& options,
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
  ObjectIdStream key;
  key.Update(ByteSpan(reinterpret_cast<const std::byte*>(file.id.bytes.data()), file.id.bytes.size()));
  key.Update(AsBytes(how));
  return key.Digest();
}

std::optional<ContentEntry> FindIdenticalContent(Store& store, const ObjectId& key, uint64_t logical_size,
                                                 FileFormat format, Logger* log) {
  const std::string path = EntryPath(store, key);
  char target[256];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof target) return std::nullopt;
  Result<ContentEntry> entry = ContentEntry::DecodeText(std::string_view(target, static_cast<size_t>(n)));
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

ObjectId ExactKey(uint64_t size, uint64_t checksum64) {
  const std::string text = fmt::format("ckptfs-exact 1|{}|{:016x}", size, checksum64);
  return ObjectId::Of(AsBytes(text));
}

std::optional<ContentEntry> FindStoredContent(Store& store, ByteSpan file, const FileDigests& digests,
                                              FileFormat format, const ObjectId& content_key, Logger* log) {
  if (auto same = FindIdenticalContent(store, content_key, file.size(), format, log)) return same;
  const uint64_t checksum = digests.checksum;
  auto same = FindIdenticalContent(store, ExactKey(file.size(), checksum), file.size(), format, log);
  if (!same) return std::nullopt;
  auto reader = store.OpenBlob(same->object);
  if (!reader.ok() || (*reader)->file_checksum() != checksum) return std::nullopt;
  // Equal checksums are not proof: compare the reconstruction piece by piece.
  std::vector<std::byte> piece(std::min<uint64_t>(file.size(), 4u << 20));
  for (uint64_t off = 0; off < file.size(); off += piece.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), file.size() - off));
    if (!(*reader)->ReadAt(off, MutableByteSpan(piece.data(), n)).ok() ||
        std::memcmp(piece.data(), file.data() + off, n) != 0)
      return std::nullopt;
  }
  return same;
}

void RecordContent(Store& store, const ObjectId& key, const ContentEntry& entry, Logger* log) {
  if (::mkdir(store.MetaPath("content").c_str(), 0700) != 0 && errno != EEXIST) return;
  // A fresh name in this daemon's temp folder (same file system), made a
  // symbolic link there and renamed over any older entry.
  Result<TempFile> tmp = store.CreateTemp();
  if (!tmp.ok()) return;
  const std::string tmp_path = tmp->path();
  const std::string path = EntryPath(store, key);
  if (::unlink(tmp_path.c_str()) != 0 || ::symlink(entry.EncodeText().c_str(), tmp_path.c_str()) != 0 ||
      ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    if (log) log->Debug("content index {}: {}", key.Hex(), std::strerror(errno));
    ::unlink(tmp_path.c_str());
    tmp->Release();
    return;
  }
  tmp->Release();
}

uint64_t SweepContentIndex(Store& store, bool dry_run) {
  uint64_t removed = 0;
  const std::string root = store.MetaPath("content");
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) return 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = root + "/" + e->d_name;
    char target[256];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
    Result<ContentEntry> entry = n > 0 && static_cast<size_t>(n) < sizeof target
                                     ? ContentEntry::DecodeText(std::string_view(target, static_cast<size_t>(n)))
                                     : Result<ContentEntry>(Status::Corruption("not an entry"));
    struct stat st;
    // Damaged entries and entries of removed objects go.
    if (entry.ok() && ::stat(store.ObjectPath(entry->object).c_str(), &st) == 0) continue;
    ++removed;
    if (!dry_run) ::unlink(path.c_str());
  }
  ::closedir(dir);
  return removed;
}

}  // namespace ckptfs::fs
