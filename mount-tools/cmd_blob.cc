// encode / decode / inspect: the codec on single files, without a store.
//   ckptfs encode IN BLOB [--base BASE_BLOB] [--zstd-level N] [--threads N]
//   ckptfs decode BLOB OUT [--base BASE_BLOB ...]
//   ckptfs inspect BLOB [--json] [--chunks] [--base BASE_BLOB ...]
// A delta blob names its base by content address; --base supplies the base
// blob files (their ids are computed from their bytes), so a chain can be
// decoded offline.
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "mount-tools/commands.h"

namespace ckptfs::tools {
namespace {

// Resolves base blobs from files named on the command line.
class FileListResolver final : public BlobResolver {
 public:
  Status AddFile(const std::string& path) {
    ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(path));
    ObjectId id = ObjectId::Of(bytes);
    files_[id] = std::make_shared<MemoryFile>(std::move(bytes));
    return Status::Ok();
  }
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    auto it = files_.find(id);
    if (it == files_.end())
      return Status::NotFound("base blob " + id.Hex() + " was not given (pass it with --base)");
    return BlobReader::Open(it->second, id, this);
  }

 private:
  std::map<ObjectId, std::shared_ptr<MemoryFile>> files_;
};

struct BlobArgs {
  std::string in, out;
  std::vector<std::string> bases;
  int zstd_level = 3;
  unsigned threads = 1;
  bool json = false;
  bool chunks = false;
};

Result<std::shared_ptr<const BlobReader>> OpenBlobFile(const std::string& path, FileListResolver* resolver) {
  ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(path));
  ObjectId id = ObjectId::Of(bytes);
  return BlobReader::Open(std::make_shared<MemoryFile>(std::move(bytes)), id, resolver);
}

int RunEncode(const BlobArgs& a) {
  auto mapped = MappedFile::Open(a.in);
  if (!mapped.ok()) return ReportStatus(mapped.status(), "encode");
  ByteSpan file = mapped->bytes();
  Layout layout = DetectLayout(file);
  if (!layout.fallback_reason.empty())
    std::cerr << "ckptfs: " << a.in << ": stored losslessly as opaque data: " << layout.fallback_reason << "\n";

  FileListResolver resolver;
  BaseRef base;
  bool have_base = !a.bases.empty();
  if (have_base) {
    for (const auto& b : a.bases)
      if (Status s = resolver.AddFile(b); !s.ok()) return ReportStatus(s, "encode: --base");
    auto bytes = ReadWholeFile(a.bases.front());
    if (!bytes.ok()) return ReportStatus(bytes.status(), "encode: --base");
    base.id = ObjectId::Of(*bytes);
    auto reader = resolver.OpenBlob(base.id);
    if (!reader.ok()) return ReportStatus(reader.status(), "encode: --base");
    base.reader = *reader;
  }
  EncodeOptions options;
  options.zstd_level = a.zstd_level;
  options.threads = a.threads;
  VectorSink sink;
  auto stats = EncodeBlob(file, layout, have_base ? &base : nullptr, options, &sink);
  if (!stats.ok()) return ReportStatus(stats.status(), "encode " + a.in);
  if (Status s = WriteWholeFile(a.out, sink.bytes); !s.ok()) return ReportStatus(s, "encode");
  double ratio = stats->stored_bytes ? double(stats->logical_bytes) / double(stats->stored_bytes) : 0.0;
  std::cout << fmt::format("{}: {} -> {} bytes ({:.3f}x), format {}, {} tensors, {} chunks ({} delta), id {}\n",
                           a.in, stats->logical_bytes, stats->stored_bytes, ratio,
                           FileFormatName(layout.format), layout.tensors.size(), stats->chunks,
                           stats->delta_chunks, ObjectId::Of(sink.bytes).Hex());
  return kExitOk;
}

int RunDecode(const BlobArgs& a) {
  FileListResolver resolver;
  for (const auto& b : a.bases)
    if (Status s = resolver.AddFile(b); !s.ok()) return ReportStatus(s, "decode: --base");
  auto reader = OpenBlobFile(a.in, &resolver);
  if (!reader.ok()) return ReportStatus(reader.status(), "decode " + a.in);
  auto bytes = DecodeAll(**reader);
  if (!bytes.ok()) return ReportStatus(bytes.status(), "decode " + a.in);
  return ReportStatus(WriteWholeFile(a.out, *bytes), "decode");
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return "[" + fmt::format("{}", fmt::join(shape, ", ")) + "]";
}

int RunInspect(const BlobArgs& a) {
  FileListResolver resolver;
  for (const auto& b : a.bases)
    if (Status s = resolver.AddFile(b); !s.ok()) return ReportStatus(s, "inspect: --base");
  auto opened = OpenBlobFile(a.in, &resolver);
  if (!opened.ok()) return ReportStatus(opened.status(), "inspect " + a.in);
  const BlobReader& r = **opened;

  // Per-segment stored bytes and codecs, from the chunk table.
  struct SegmentSummary {
    uint64_t stored = 0;
    std::map<std::string, uint32_t> codecs;
  };
  std::vector<SegmentSummary> seg(r.segments().size());
  for (const ChunkInfo& c : r.chunks()) {
    if (c.segment < 0 || static_cast<size_t>(c.segment) >= seg.size()) continue;
    seg[c.segment].stored += c.stored_length;
    seg[c.segment].codecs[std::string(ChunkCodecName(c.codec))]++;
  }
  auto codec_list = [](const SegmentSummary& s) {
    std::vector<std::string> names;
    for (const auto& [name, n] : s.codecs) names.push_back(fmt::format("{}x{}", name, n));
    return fmt::format("{}", fmt::join(names, ","));
  };
  auto ratio = [](uint64_t logical, uint64_t stored) {
    return stored ? double(logical) / double(stored) : 0.0;
  };

  nlohmann::json j;
  j["blob"] = a.in;
  j["format"] = std::string(FileFormatName(r.format()));
  j["logical_bytes"] = r.logical_size();
  j["stored_bytes"] = r.stored_size();
  j["ratio"] = ratio(r.logical_size(), r.stored_size());
  j["file_checksum"] = fmt::format("{:016x}", r.file_checksum());
  j["base"] = r.base() ? nlohmann::json(r.base()->Hex()) : nlohmann::json(nullptr);
  uint64_t verbatim_logical = 0, verbatim_stored = 0;
  j["tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < r.segments().size(); ++i) {
    const SegmentInfo& s = r.segments()[i];
    if (s.tensor < 0) {
      verbatim_logical += s.length;
      verbatim_stored += seg[i].stored;
      continue;
    }
    const TensorInfo& t = r.tensors()[s.tensor];
    j["tensors"].push_back({{"name", t.name},
                            {"dtype", std::string(DTypeName(t.dtype))},
                            {"shape", t.shape},
                            {"offset", s.offset},
                            {"logical_bytes", s.length},
                            {"stored_bytes", seg[i].stored},
                            {"ratio", ratio(s.length, seg[i].stored)},
                            {"codecs", codec_list(seg[i])}});
  }
  j["verbatim"] = {{"logical_bytes", verbatim_logical}, {"stored_bytes", verbatim_stored}};
  if (a.chunks || a.json) {
    j["chunks"] = nlohmann::json::array();
    for (const ChunkInfo& c : r.chunks())
      j["chunks"].push_back({{"offset", c.logical_offset},
                             {"length", c.logical_length},
                             {"codec", std::string(ChunkCodecName(c.codec))},
                             {"stored_bytes", c.stored_length},
                             {"checksum", fmt::format("{:016x}", c.checksum)}});
  }
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << fmt::format("{}: format {}, {} -> {} bytes ({:.3f}x), base {}\n", a.in,
                           FileFormatName(r.format()), r.logical_size(), r.stored_size(),
                           ratio(r.logical_size(), r.stored_size()),
                           r.base() ? r.base()->Hex() : std::string("none"));
  std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8}  {}\n", "tensor", "dtype", "shape",
                           "bytes", "stored", "ratio", "codecs");
  for (const auto& t : j["tensors"])
    std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8.3f}  {}\n", t["name"].get<std::string>(),
                             t["dtype"].get<std::string>(), ShapeString(t["shape"].get<std::vector<uint64_t>>()),
                             t["logical_bytes"].get<uint64_t>(), t["stored_bytes"].get<uint64_t>(),
                             t["ratio"].get<double>(), t["codecs"].get<std::string>());
  std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8.3f}\n", "(verbatim bytes)", "", "",
                           verbatim_logical, verbatim_stored, ratio(verbatim_logical, verbatim_stored));
  if (a.chunks)
    for (const auto& c : j["chunks"])
      std::cout << fmt::format("  chunk @{:<12} len {:<10} {:<14} stored {:<10} xxh3 {}\n",
                               c["offset"].get<uint64_t>(), c["length"].get<uint64_t>(),
                               c["codec"].get<std::string>(), c["stored_bytes"].get<uint64_t>(),
                               c["checksum"].get<std::string>());
  return kExitOk;
}

}  // namespace

void RegisterBlobCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<BlobArgs>();

  CLI::App* enc = app.add_subcommand("encode", "Encode a file into a blob (no store)");
  enc->add_option("IN", args->in, "input file")->required()->check(CLI::ExistingFile);
  enc->add_option("BLOB", args->out, "output blob")->required();
  enc->add_option("--base", args->bases, "previous version's blob (delta frame); more for its chain");
  enc->add_option("--zstd-level", args->zstd_level, "zstd level")->check(CLI::Range(-7, 22));
  enc->add_option("--threads", args->threads, "encode threads")->check(CLI::Range(1, 256));
  enc->callback([args, exit_code] { *exit_code = RunEncode(*args); });

  CLI::App* dec = app.add_subcommand("decode", "Decode a blob back into the file");
  dec->add_option("BLOB", args->in, "blob")->required()->check(CLI::ExistingFile);
  dec->add_option("OUT", args->out, "output file")->required();
  dec->add_option("--base", args->bases, "base blobs of a delta chain");
  dec->callback([args, exit_code] { *exit_code = RunDecode(*args); });

  CLI::App* ins = app.add_subcommand("inspect-blob", "Describe a blob: format, tensors, codecs, sizes");
  ins->add_option("BLOB", args->in, "blob")->required()->check(CLI::ExistingFile);
  ins->add_flag("--json", args->json, "machine-readable output");
  ins->add_flag("--chunks", args->chunks, "list every chunk with its checksum");
  ins->add_option("--base", args->bases, "base blobs of a delta chain");
  ins->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace ckptfs::tools
