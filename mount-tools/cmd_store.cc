// ckptfs stats / inspect / restore / fsck / gc: the store, mounted or not.
// All of them read through the daemon's own decode path (fs::FileContent,
// BlobReader), never a second parser.
#include <fcntl.h>
#include <sched.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "codec/common/replacement_file.h"
#include "fs/blob_links.h"
#include "fs/commit_pipeline.h"
#include "fs/gc.h"
#include "fs/manifest.h"
#include "fs/options.h"
#include "fs/store.h"
#include "mount-tools/blob_report.h"
#include "mount-tools/commands.h"
#include "mount-tools/output_sink.h"
#include "mount-tools/progress.h"

namespace ckptfs::tools {
namespace {
namespace sfs = std::filesystem;
using nlohmann::json;

// The backing directory holding `path` (the nearest ancestor with
// .ckptfs/format).
Result<std::string> FindStoreRoot(const std::string& path) {
  std::error_code ec;
  sfs::path p = sfs::absolute(path, ec);
  if (ec) return Status::Io(ec.value(), "resolve " + path);
  for (sfs::path dir = sfs::is_directory(p, ec) ? p : p.parent_path();; dir = dir.parent_path()) {
    if (sfs::exists(dir / fs::kMetaDirName / "format", ec)) return dir.string();
    if (dir == dir.root_path() || dir.empty()) break;
  }
  return Status::NotFound(path + " is not inside a ckptfs backing directory");
}

// fsck and gc walk every file, of chains of any depth.
constexpr uint64_t kWalkChunkCacheBytes = uint64_t{64} << 20;

// A store for a one-shot command, with an LRU of `cache_bytes` decoded
// chunks.
Result<std::unique_ptr<fs::Store>> OpenStoreAt(const std::string& backing, uint64_t cache_bytes) {
  fs::StoreOptions options;
  options.create = false;
  options.chunk_cache_bytes = cache_bytes;
  // A restore of a step-predicted file decodes its optimizer state ahead
  // of itself, for the weights: as much room for it as a default mount.
  options.chunk_cache_awaited_bytes = fs::SplitMemory(fs::MountOptions{}).awaited_mib << 20;
  return fs::Store::Open(backing, options);
}

std::string Xattr(const std::string& path, const char* name) {
  char buf[256];
  ssize_t n = ::getxattr(path.c_str(), name, buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

struct FileStats {
  std::string path;
  uint64_t logical = 0, stored = 0;
  std::string codec, state, base;
  std::string level;  // the level the version was committed under ("" unknown)
  uint32_t chain_depth = 0;
};

// Stats of one file inside a mount (through the virtual xattrs).
bool MountedStats(const std::string& path, FileStats* out) {
  out->state = Xattr(path, "user.ckptfs.state");
  if (out->state.empty()) return false;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  out->logical = static_cast<uint64_t>(st.st_size);
  out->stored = std::strtoull(Xattr(path, "user.ckptfs.stored_bytes").c_str(), nullptr, 10);
  out->codec = Xattr(path, "user.ckptfs.codec");
  out->base = Xattr(path, "user.ckptfs.base");
  out->chain_depth = static_cast<uint32_t>(std::strtoul(Xattr(path, "user.ckptfs.chain_depth").c_str(), nullptr, 10));
  out->level = Xattr(path, "user.ckptfs.level");
  if (out->level == "unknown" || out->state != "committed") out->level.clear();
  return true;
}

// Stats of one manifest (or plain file) of an unmounted store.
Status BackingStats(const std::string& path, FileStats* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::Io(errno, "open " + path);
  auto m = fs::ReadManifest(fd);
  struct stat st;
  ::fstat(fd, &st);
  out->level = fs::RecordedLevel(fd);
  ::close(fd);
  if (!m.ok()) return m.status().WithContext(path);
  if (!m->has_value()) {
    out->logical = out->stored = static_cast<uint64_t>(st.st_size);
    out->codec = out->state = "plain";
    return Status::Ok();
  }
  const fs::Manifest& man = **m;
  out->logical = man.logical_size;
  out->stored = man.kind == fs::ManifestKind::kInline ? man.inline_data.size() : man.stored_bytes;
  out->codec = man.kind == fs::ManifestKind::kBlob ? fmt::format("blob:{}", FileFormatName(man.format))
                                                   : std::string(fs::StorageName(man));
  out->state = man.kind == fs::ManifestKind::kStaging ? "staging" : "committed";
  out->base = man.base ? man.base->Hex() : "";
  out->chain_depth = man.chain_depth;
  return Status::Ok();
}

int RunStats(const std::string& path, bool as_json) {
  std::vector<std::string> files;
  std::error_code ec;
  if (sfs::is_directory(path, ec)) {
    for (auto it = sfs::recursive_directory_iterator(path, ec); !ec && it != sfs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->path().filename() == fs::kMetaDirName) {
        it.disable_recursion_pending();
        continue;
      }
      std::error_code sec;
      if (!it->is_symlink(sec) && it->is_regular_file(sec)) files.push_back(it->path().string());
    }
    if (ec) return ReportStatus(Status::Io(ec.value(), "walk " + path), "stats");
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<FileStats> all;
  for (const std::string& f : files) {
    FileStats s;
    s.path = f;
    if (!MountedStats(f, &s)) {
      if (Status st = BackingStats(f, &s); !st.ok()) return ReportStatus(st, "stats");
    }
    all.push_back(s);
  }
  uint64_t logical = 0, stored = 0;
  for (auto& s : all) logical += s.logical, stored += s.stored;
  auto ratio = [](uint64_t l, uint64_t s) { return s == 0 ? 1.0 : static_cast<double>(l) / s; };
  if (as_json) {
    json j;
    j["files"] = json::array();
    for (auto& s : all)
      j["files"].push_back({{"path", s.path}, {"logical_bytes", s.logical}, {"stored_bytes", s.stored},
                            {"ratio", ratio(s.logical, s.stored)}, {"codec", s.codec}, {"state", s.state},
                            {"chain_depth", s.chain_depth}, {"base", s.base}, {"level", s.level}});
    j["total"] = {{"files", all.size()}, {"logical_bytes", logical}, {"stored_bytes", stored},
                  {"ratio", ratio(logical, stored)}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{:>14} {:>14} {:>8} {:>5} {:<18} {:<8} {}\n", "logical", "stored", "ratio", "depth",
                             "codec", "level", "path");
    for (auto& s : all)
      std::cout << fmt::format("{:>14} {:>14} {:>8.2f} {:>5} {:<18} {:<8} {}\n", s.logical, s.stored,
                               ratio(s.logical, s.stored), s.chain_depth, s.codec, s.level.empty() ? "-" : s.level,
                               s.path);
    std::cout << fmt::format("{:>14} {:>14} {:>8.2f}       TOTAL ({} files)\n", logical, stored,
                             ratio(logical, stored), all.size());
  }
  return kExitOk;
}

struct OpenedManifest {
  std::unique_ptr<fs::Store> store;
  std::optional<fs::Manifest> manifest;  // nullopt: a plain file
};

// The store that holds `file` and its manifest, to be decoded on `threads`
// threads (the LRU fits its chain).
Result<OpenedManifest> OpenManifestFile(const std::string& file, unsigned threads) {
  OpenedManifest o;
  ASSIGN_OR_RETURN(std::string root, FindStoreRoot(file));
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::Io(errno, "open " + file);
  auto m = fs::ReadManifest(fd);
  ::close(fd);
  if (!m.ok()) return m.status().WithContext(file);
  o.manifest = *m;
  const uint32_t depth = o.manifest ? o.manifest->chain_depth : 0;
  ASSIGN_OR_RETURN(o.store, OpenStoreAt(root, CommandChunkCacheBytes(threads, depth)));
  return o;
}

int RunInspect(const std::string& file, bool as_json, bool chunks) {
  if (LooksLikeBlob(file)) return InspectBlobFile(file, as_json, chunks);  // a bare blob, not a store file
  auto opened = OpenManifestFile(file, 1);
  if (!opened.ok()) return ReportStatus(opened.status(), "inspect");
  json j;
  j["path"] = file;
  if (!opened->manifest) {
    j["kind"] = "plain";
  } else {
    const fs::Manifest& m = *opened->manifest;
    j["kind"] = fs::ManifestKindName(m.kind);
    if (m.inline_zstd) j["inline_zstd"] = true;
    j["sequence"] = m.sequence;
    j["logical_bytes"] = m.logical_size;
    j["stored_bytes"] = m.stored_bytes;
    j["chain_depth"] = m.chain_depth;
    if (m.kind == fs::ManifestKind::kBlob || m.kind == fs::ManifestKind::kRaw) j["object"] = m.object.Hex();
    if (m.base) j["base"] = m.base->Hex();
    if (m.kind == fs::ManifestKind::kStaging) j["staging"] = m.staging.RelPath();
    if (m.kind == fs::ManifestKind::kBlob) {
      auto reader = opened->store->OpenBlob(m.object);
      if (!reader.ok()) return ReportStatus(reader.status(), "inspect");
      j["blob"] = DescribeBlob(**reader, chunks);
    }
  }
  if (as_json) {
    std::cout << j.dump(2) << "\n";
  } else {
    for (auto& [k, v] : j.items())
      if (k != "blob") std::cout << fmt::format("{:<14} {}\n", k, v.dump());
    if (j.contains("blob")) PrintBlobReport(file, j["blob"]);
  }
  return kExitOk;
}

// One thread per core this process may run on, at most 8: each holds a
// few 8 MiB pieces and its decode scratch.
unsigned DefaultRestoreThreads() {
  cpu_set_t set;
  unsigned cores = std::thread::hardware_concurrency();
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<unsigned>(CPU_COUNT(&set));
  return std::clamp(cores, 1u, 8u);
}

int RunRestore(const std::string& file, const std::string& out, bool quiet, unsigned threads) {
  auto opened = OpenManifestFile(file, threads);
  if (!opened.ok()) return ReportStatus(opened.status(), "restore");
  Result<fs::FileContent> content = Status::Internal("unset");
  if (opened->manifest) {
    content = fs::FileContent::Open(*opened->store, *opened->manifest);
  } else {
    auto plain = PosixFile::Open(file);
    if (!plain.ok()) return ReportStatus(plain.status(), "restore");
    content = fs::FileContent::Verbatim(std::shared_ptr<const RandomAccessFile>(std::move(*plain)));
  }
  if (!content.ok()) return ReportStatus(content.status(), "restore");
  // OUT keeps its old bytes unless the whole file was read and checked.
  auto out_file = ReplacementFile::Create(out);
  if (!out_file.ok()) return ReportStatus(out_file.status(), "restore");
  Progress progress("restore " + file, content->size(), "bytes", ProgressWanted(quiet));
  OutputFileSink sink(std::move(*out_file), &progress);
  Status s;
  if (content->blob()) {
    // Decoded on `threads` (whole chunks, in order), the whole-file
    // checksum checked.
    s = DecodeToSink(*content->blob(), &sink, threads).WithContext(file);
  } else {
    std::vector<std::byte> buf(std::min<uint64_t>(content->size(), 8u << 20));
    for (uint64_t off = 0; off < content->size() && s.ok();) {
      uint64_t n = std::min<uint64_t>(buf.size(), content->size() - off);
      s = content->ReadAt(off, MutableByteSpan(buf.data(), n));
      if (s.ok()) s = sink.Append(ByteSpan(buf.data(), n));
      off += n;
    }
  }
  if (s.ok()) s = sink.Finish();
  progress.Finish();
  return ReportStatus(s, "restore");
}

int RunFsck(const std::string& backing, bool as_json, bool quiet) {
  auto store = OpenStoreAt(backing, kWalkChunkCacheBytes);
  if (!store.ok()) return ReportStatus(store.status(), "fsck");
  fs::Store& st = **store;
  std::vector<std::string> problems;
  uint64_t manifests = 0, objects = 0, chunks = 0;
  std::set<ObjectId> raw_objects, blob_objects;
  Progress progress("fsck " + backing, 0, "files and objects checked", ProgressWanted(quiet));
  Status walk = fs::ForEachUserFile(st.backing(), [&](const std::string& rel) {
    progress.Add(1);
    std::string path = st.backing() + "/" + rel;
    int fd = fs::OpenNoAtime(AT_FDCWD, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);  // fsck reads no user's file
    if (fd < 0) return problems.push_back(fmt::format("{}: cannot open: {}", rel, std::strerror(errno)));
    char magic[8] = {};
    bool looks_like_manifest = ::pread(fd, magic, 8, 0) == 8 && std::memcmp(magic, fs::Manifest::kMagic, 8) == 0;
    auto m = fs::ReadManifest(fd);
    ::close(fd);
    if (!m.ok()) return problems.push_back(fmt::format("{}: {}", rel, m.status().ToString()));
    if (!m->has_value()) {
      if (looks_like_manifest) problems.push_back(fmt::format("{}: manifest magic but no valid slot", rel));
      return;
    }
    ++manifests;
    const fs::Manifest& man = **m;
    if (man.kind == fs::ManifestKind::kStaging) {
      if (::access(st.StagingPath(man.staging).c_str(), F_OK) != 0)
        problems.push_back(fmt::format("{}: staging file {} is missing", rel, man.staging.RelPath()));
      return;
    }
    if (man.kind == fs::ManifestKind::kRaw) raw_objects.insert(man.object);
    if (man.kind == fs::ManifestKind::kInline) {
      // Compressed inline data must decode to the file's size.
      if (man.inline_zstd)
        if (auto content = fs::FileContent::Open(st, man); !content.ok())
          problems.push_back(fmt::format("{}: {}", rel, content.status().ToString()));
      return;
    }
    if (::access(st.ObjectPath(man.object).c_str(), F_OK) != 0)
      return problems.push_back(fmt::format("{}: object {} is missing", rel, man.object.Hex()));
    auto content = fs::FileContent::Open(st, man);
    if (!content.ok()) return problems.push_back(fmt::format("{}: {}", rel, content.status().ToString()));
    if (man.kind != fs::ManifestKind::kBlob) return;
    // Every blob it reads (its base chain down to a key frame, refs) must open.
    std::vector<ObjectId> pending{man.object};
    std::set<ObjectId> seen{man.object};
    while (!pending.empty()) {
      const ObjectId id = pending.back();
      pending.pop_back();
      blob_objects.insert(id);
      auto reader = st.OpenBlob(id);
      if (!reader.ok()) return problems.push_back(fmt::format("{}: chain: {}", rel, reader.status().ToString()));
      if (seen.size() > fs::kMaxLinkedBlobs)
        return problems.push_back(fmt::format("{}: reads more than {} blobs", rel, fs::kMaxLinkedBlobs));
      for (const ObjectId& below : fs::BlobLinks(**reader))
        if (seen.insert(below).second) pending.push_back(below);
    }
  });
  if (!walk.ok()) return ReportStatus(walk, "fsck");
  fs::ForEachObject(st, [&](const ObjectId& id, const std::string& path) {
    ++objects;
    progress.Add(1);
    struct stat lst;
    if (::lstat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode))
      return problems.push_back(fmt::format("object {}: not a regular file (the daemon refuses it)", id.Hex()));
    auto mapped = MappedFile::Open(path);
    if (!mapped.ok()) return problems.push_back(fmt::format("object {}: {}", id.Hex(), mapped.status().ToString()));
    if (ObjectId::Of(mapped->bytes()) != id)
      problems.push_back(fmt::format("object {}: content does not match its name (XXH3-128)", id.Hex()));
    if (raw_objects.count(id) && !blob_objects.count(id)) return;
    auto reader = st.OpenBlob(id);
    if (!reader.ok()) {
      if (blob_objects.count(id)) problems.push_back(fmt::format("object {}: {}", id.Hex(), reader.status().ToString()));
      return;
    }
    for (uint32_t i = 0; i < (*reader)->chunks().size(); ++i) {
      ++chunks;
      Status v = (*reader)->VerifyChunk(i);
      if (!v.ok())
        problems.push_back(fmt::format("object {}: chunk {} (logical offset {}): {}", id.Hex(), i,
                                       (*reader)->chunks()[i].logical_offset, v.ToString()));
    }
  });
  progress.Finish();
  if (as_json) {
    json j = {{"manifests", manifests}, {"objects", objects}, {"chunks", chunks}, {"problems", problems},
              {"clean", problems.empty()}};
    std::cout << j.dump(2) << "\n";
  } else {
    for (auto& p : problems) std::cout << "problem: " << p << "\n";
    std::cout << fmt::format("{} manifests, {} objects, {} chunks checked: {}\n", manifests, objects, chunks,
                             problems.empty() ? "clean" : fmt::format("{} problems", problems.size()));
  }
  return problems.empty() ? kExitOk : kExitProblemsFound;
}

int RunGc(const std::string& backing, int64_t grace, bool dry_run, bool as_json) {
  auto store = OpenStoreAt(backing, kWalkChunkCacheBytes);
  if (!store.ok()) return ReportStatus(store.status(), "gc");
  fs::GcOptions options;
  options.grace_seconds = grace;
  options.dry_run = dry_run;
  auto report = fs::CollectGarbage(**store, options, nullptr);
  if (!report.ok()) return ReportStatus(report.status(), "gc");
  if (as_json) {
    json j = {{"manifests", report->manifests}, {"objects", report->objects}, {"live", report->live_objects},
              {"removed", report->removed}, {"removed_bytes", report->removed_bytes},
              {"kept_young", report->kept_young}, {"problems", report->problems}, {"dry_run", dry_run},
              {"swept", report->swept}};
    std::cout << j.dump(2) << "\n";
  } else {
    for (auto& p : report->problems) std::cout << "problem: " << p << "\n";
    std::cout << fmt::format("{} objects, {} live, {} {} ({} bytes), {} kept within the grace period\n",
                             report->objects, report->live_objects, dry_run ? "would remove" : "removed",
                             report->removed, report->removed_bytes, report->kept_young);
  }
  return report->swept ? kExitOk : kExitProblemsFound;
}

}  // namespace

void RegisterStoreCommands(CLI::App& app, int* exit_code) {
  struct Args {
    std::string path, out;
    bool json = false, dry_run = false, chunks = false, quiet = false;
    int64_t grace = 3600;
    unsigned threads = DefaultRestoreThreads();
  };
  auto a = std::make_shared<Args>();
  CLI::App* stats = app.add_subcommand("stats", "Logical vs stored bytes per file and in total");
  stats->add_option("path", a->path, "File or directory, in a mount or in an unmounted backing directory")
      ->required();
  stats->add_flag("--json", a->json, "Machine-readable output");
  stats->callback([a, exit_code] { *exit_code = RunStats(a->path, a->json); });

  CLI::App* inspect = app.add_subcommand("inspect", "Describe FILE of an unmounted store (manifest, tensors, codecs, sizes) or a bare blob");
  inspect->add_option("file", a->path, "Path of the manifest under BACKING")->required();
  inspect->add_flag("--json", a->json, "Machine-readable output");
  inspect->add_flag("--chunks", a->chunks, "List every chunk with its checksum");
  inspect->callback([a, exit_code] { *exit_code = RunInspect(a->path, a->json, a->chunks); });

  CLI::App* restore = app.add_subcommand("restore", "Decode FILE of an unmounted store into OUT");
  restore->add_option("file", a->path, "Path of the manifest under BACKING")->required();
  restore->add_option("out", a->out, "Where to write the file")->required();
  restore->add_flag("-q,--quiet", a->quiet, "No progress line on a terminal");
  restore->add_option("--threads", a->threads, "Decode threads (default: one per core, at most 8)")->check(CLI::Range(1, 256));
  restore->callback([a, exit_code] { *exit_code = RunRestore(a->path, a->out, a->quiet, a->threads); });

  CLI::App* fsck = app.add_subcommand("fsck", "Verify every manifest, object and chunk (exit 4 on problems)");
  fsck->add_option("backing", a->path, "Backing directory")->required();
  fsck->add_flag("--json", a->json, "Machine-readable output");
  fsck->add_flag("-q,--quiet", a->quiet, "No progress line on a terminal");
  fsck->callback([a, exit_code] { *exit_code = RunFsck(a->path, a->json, a->quiet); });

  CLI::App* gc = app.add_subcommand("gc", "Delete objects no manifest reaches (older than the grace period)");
  gc->add_option("backing", a->path, "Backing directory")->required();
  gc->add_option("--grace", a->grace, "Keep unreferenced objects younger than this many seconds (default 3600)");
  gc->add_flag("--dry-run", a->dry_run, "Only report");
  gc->add_flag("--json", a->json, "Machine-readable output");
  gc->callback([a, exit_code] { *exit_code = RunGc(a->path, a->grace, a->dry_run, a->json); });
}

}  // namespace ckptfs::tools
