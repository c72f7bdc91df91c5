// encode / decode / inspect: the codec on single files, without a store.
//   ckptfs encode IN BLOB [--base BASE_BLOB] [--zstd-level N] [--threads N] [--stages]
//                 [--budget REL_L2 [--opt-budget REL_L2] [--schedule off|dsq] [--predict on|off]
//                  [--momentum plain|step] [--momentum-budget REL_L2] [--denominator-budget MAX_REL]]
//   ckptfs decode BLOB OUT [--base BASE_BLOB ...] [--threads N]
//   ckptfs inspect-blob BLOB [--json] [--chunks] [--base BASE_BLOB ...]
// (`ckptfs inspect` also accepts a bare blob and forwards it here.)
// A delta blob names its base by content address; --base supplies the base
// blob files (their ids are computed from their bytes), so a chain can be
// decoded offline.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "codec/common/replacement_file.h"
#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/schedule.h"
#include "fs/options.h"
#include "mount-tools/blob_report.h"
#include "mount-tools/commands.h"
#include "mount-tools/output_sink.h"
#include "mount-tools/progress.h"

namespace ckptfs::tools {
uint64_t CommandChunkCacheBytes(unsigned threads, uint32_t depth) {
  const uint64_t chunks = (uint64_t{depth} + 3) * threads;
  return std::max<uint64_t>(chunks * EncodeOptions{}.chunk_bytes, uint64_t{24} << 20);
}

namespace {

// Resolves base blobs from files named on the command line.
// One reader per base blob, all sharing a chunk cache (as the mount's store
// does): a chain's chunks, and the optimizer state a step prediction reads
// from the base, are decoded once instead of once per read.
class FileListResolver final : public BlobResolver {
 public:
  // `cache_bytes`: the LRU of decoded chunks (the awaited room is a
  // default mount's).
  explicit FileListResolver(uint64_t cache_bytes)
      : cache_{cache_bytes, 0, fs::SplitMemory(fs::MountOptions{}).awaited_mib << 20} {}
  // Returns the blob's id (the hash of its bytes).
  Result<ObjectId> AddFile(const std::string& path) {
    ASSIGN_OR_RETURN(std::shared_ptr<const RandomAccessFile> file, MappedRandomAccessFile::Open(path));
    ObjectId id = ObjectId::Of(file->Contiguous());
    files_[id] = std::move(file);
    return id;
  }
  // The chunk cache of every reader this resolver opens, also the one the
  // command reads from (OpenBlobFile).
  ChunkCache* cache() { return &cache_; }
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto open = readers_.find(id); open != readers_.end()) return open->second;
    auto it = files_.find(id);
    if (it == files_.end())
      return Status::NotFound("base blob " + id.Hex() + " was not given (pass it with --base)");
    ASSIGN_OR_RETURN(auto reader, BlobReader::Open(it->second, id, this, &cache_));
    readers_.emplace(id, reader);
    return reader;
  }

 private:
  ChunkCache cache_;
  std::mutex mu_;
  std::map<ObjectId, std::shared_ptr<const RandomAccessFile>> files_;
  std::map<ObjectId, std::shared_ptr<const BlobReader>> readers_;
};

struct BlobArgs {
  std::string in, out;
  std::vector<std::string> bases;
  int zstd_level = 3;
  unsigned threads = 1;
  bool json = false;
  bool chunks = false;
  bool stages = false;  // encode: print the time per stage (JSON)
  bool quiet = false;   // no progress line on a terminal
  double budget = 0.0;       // 0: lossless (the default of a single-file encode)
  double opt_budget = -1.0;  // < 0: the mount's default (policy::DefaultOptimizerBudget)
  std::string schedule = "dsq";  // the mount's default
  double update_fraction = -1.0;  // < 0: the mount's default (lossy::BudgetSchedule)
  std::string predict = "on";    // the mount's default
  std::string low_rank = kLowRankMomentsByDefault ? "on" : "off";  // the mount's default
  std::string trellis = kTrellisByDefault ? "on" : "off";           // the mount's default
  std::string momentum = "step";   // the mount's default
  double momentum_dither = kMomentumDitherByDefault;  // the mount's default
  double momentum_budget = -1.0;   // < 0: the mount's default (2.5x the optimizer budget)
  double denominator_budget = -1.0;  // < 0: the mount's default (2.25x the optimizer budget)
};

Result<std::shared_ptr<const BlobReader>> OpenBlobFile(const std::string& path, FileListResolver* resolver) {
  ASSIGN_OR_RETURN(std::shared_ptr<const RandomAccessFile> file, MappedRandomAccessFile::Open(path));
  const ObjectId id = ObjectId::Of(file->Contiguous());
  return BlobReader::Open(std::move(file), id, resolver, resolver->cache());
}

// Writes a blob into a ReplacementFile as the encoder makes it, and hashes
// it into its id on the way.
class BlobFileSink final : public ByteSink {
 public:
  explicit BlobFileSink(ReplacementFile file) : file_(std::move(file)) {}
  Status Append(ByteSpan data) override {
    id_.Update(data);
    return file_.Append(data);
  }
  Status Finish() { return file_.Commit(); }
  ObjectId id() const { return id_.Digest(); }

 private:
  ReplacementFile file_;
  ObjectIdStream id_;
};

int RunEncode(const BlobArgs& a) {
  auto mapped = MappedFile::Open(a.in);
  if (!mapped.ok()) return ReportStatus(mapped.status(), "encode");
  ByteSpan file = mapped->bytes();
  Layout layout = DetectLayout(file);
  if (!layout.fallback_reason.empty())
    std::cerr << "ckptfs: " << a.in << ": stored losslessly as opaque data: " << layout.fallback_reason << "\n";

  // A default mount's LRU, as the mount's encodes have: the weights'
  // predictions read the base's optimizer state again a pass after its
  // own delta frames did.
  FileListResolver resolver(fs::SplitMemory(fs::MountOptions{}).cache_mib << 20);
  BaseRef base;
  bool have_base = !a.bases.empty();
  if (have_base) {
    for (size_t i = 0; i < a.bases.size(); ++i) {
      Result<ObjectId> id = resolver.AddFile(a.bases[i]);
      if (!id.ok()) return ReportStatus(id.status(), "encode: --base");
      if (i == 0) base.id = *id;  // the first is the base, the others its chain
    }
    auto reader = resolver.OpenBlob(base.id);
    if (!reader.ok()) return ReportStatus(reader.status(), "encode: --base");
    base.reader = *reader;
  }
  EncodeOptions options;
  options.zstd_level = a.zstd_level;
  options.threads = a.threads;
  Result<lossy::BudgetSchedule> schedule = lossy::ParseBudgetSchedule(a.schedule);
  if (!schedule.ok()) return ReportStatus(schedule.status(), "encode: --schedule");
  options.budget_schedule = *schedule;
  if (a.update_fraction > 0) options.budget_schedule.update_fraction = a.update_fraction;
  options.step_prediction = a.predict == "on";
  options.low_rank_moments = a.low_rank == "on";
  options.trellis = a.trellis == "on";
  options.momentum_dither = a.momentum_dither;
  options.momentum_step_space = a.momentum == "step";
  if (a.budget > 0 || a.opt_budget > 0) {
    // The mount's default policy (docs/policy.md) with these budgets.
    auto policy = std::make_shared<policy::Policy>(
        policy::Policy::Defaults(a.budget, a.opt_budget >= 0 ? std::optional<double>(a.opt_budget) : std::nullopt));
    if (a.momentum_budget >= 0) policy->SetMomentumStepBudget(a.momentum_budget);
    if (a.denominator_budget >= 0) policy->SetDenominatorBudget(a.denominator_budget);
    options.lossy_budget = [policy](FileFormat format, const TensorInfo& t) {
      return policy->BudgetFor("", format, t);
    };
  }
  // The blob streams into its file as it is made (and into its id), not
  // through memory: a lossless 1 GB file makes a blob of about that size.
  auto out = ReplacementFile::Create(a.out);
  if (!out.ok()) return ReportStatus(out.status(), "encode");
  BlobFileSink sink(std::move(*out));
  Result<EncodeStats> stats = Status::Internal("not encoded");
  {
    Progress progress(fmt::format("encode {} ({:.0f} MB)", a.in, static_cast<double>(file.size()) / 1e6), 0, "",
                      ProgressWanted(a.quiet));
    stats = EncodeBlob(file, layout, have_base ? &base : nullptr, options, &sink);
  }
  if (!stats.ok()) return ReportStatus(stats.status(), "encode " + a.in);
  if (Status s = sink.Finish(); !s.ok()) return ReportStatus(s, "encode");
  double ratio = stats->stored_bytes ? double(stats->logical_bytes) / double(stats->stored_bytes) : 0.0;
  std::cout << fmt::format("{}: {} -> {} bytes ({:.3f}x), format {}, {} tensors, {} chunks ({} delta), id {}\n",
                           a.in, stats->logical_bytes, stats->stored_bytes, ratio,
                           FileFormatName(layout.format), layout.tensors.size(), stats->chunks,
                           stats->delta_chunks, sink.id().Hex());
  if (a.stages) {
    nlohmann::json j;
    for (size_t k = 0; k < static_cast<size_t>(EncodeStage::kCount); ++k) {
      const EncodeStageStat& st = stats->stages.stage[k];
      j[std::string(EncodeStageName(static_cast<EncodeStage>(k)))] = {
          {"seconds", st.seconds}, {"chunks", st.calls}, {"kept", st.kept}, {"saved_bytes", st.saved_bytes}};
    }
    std::cout << "stages: " << j.dump() << "\n";
  }
  return kExitOk;
}

int RunDecode(const BlobArgs& a) {
  FileListResolver resolver(CommandChunkCacheBytes(a.threads, static_cast<uint32_t>(a.bases.size())));
  for (const auto& b : a.bases)
    if (Result<ObjectId> id = resolver.AddFile(b); !id.ok()) return ReportStatus(id.status(), "decode: --base");
  auto reader = OpenBlobFile(a.in, &resolver);
  if (!reader.ok()) return ReportStatus(reader.status(), "decode " + a.in);
  Progress progress("decode " + a.in, (*reader)->logical_size(), "bytes", ProgressWanted(a.quiet));
  auto out = ReplacementFile::Create(a.out);
  if (!out.ok()) return ReportStatus(out.status(), "decode");
  OutputFileSink sink(std::move(*out), &progress);
  // Streamed through a few reused buffers: memory does not grow with the file.
  Status s = DecodeToSink(**reader, &sink, a.threads);
  progress.Finish();
  if (!s.ok()) return ReportStatus(s, "decode " + a.in);
  return ReportStatus(sink.Finish(), "decode");
}

int RunInspect(const BlobArgs& a) {
  FileListResolver resolver(CommandChunkCacheBytes(1, static_cast<uint32_t>(a.bases.size())));
  for (const auto& b : a.bases)
    if (Result<ObjectId> id = resolver.AddFile(b); !id.ok()) return ReportStatus(id.status(), "inspect: --base");
  auto opened = OpenBlobFile(a.in, &resolver);
  if (!opened.ok()) return ReportStatus(opened.status(), "inspect " + a.in);
  nlohmann::json j = DescribeBlob(**opened, a.chunks || a.json);
  j["blob"] = a.in;
  if (a.json) std::cout << j.dump(2) << "\n";
  else PrintBlobReport(a.in, j);
  return kExitOk;
}

}  // namespace

int InspectBlobFile(const std::string& path, bool json, bool chunks) {
  BlobArgs a;
  a.in = path;
  a.json = json;
  a.chunks = chunks;
  return RunInspect(a);
}

void RegisterBlobCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<BlobArgs>();

  CLI::App* enc = app.add_subcommand("encode", "Encode a file into a blob (no store)");
  enc->add_option("IN", args->in, "input file")->required()->check(CLI::ExistingFile);
  enc->add_option("BLOB", args->out, "output blob")->required();
  enc->add_option("--base", args->bases, "previous version's blob (delta frame); more for its chain");
  enc->add_option("--zstd-level", args->zstd_level, "zstd level")->check(CLI::Range(-7, 22));
  enc->add_option("--threads", args->threads, "encode threads")->check(CLI::Range(1, 256));
  enc->add_flag("--stages", args->stages,
                "print the time spent per stage and what the optional candidates saved (one JSON line)");
  enc->add_option("--budget", args->budget, "lossy: per-tensor rel_l2 budget of float tensors (0 = lossless)")
      ->check(CLI::Range(0.0, 1.0));
  enc->add_option("--opt-budget", args->opt_budget, "lossy: budget of optimizer state (default: --budget, at least 0.2)")
      ->check(CLI::Range(0.0, 1.0));
  enc->add_option("--schedule", args->schedule, "lossy: budget schedule of delta frames, off or dsq (default dsq)")
      ->check(CLI::IsMember({"off", "dsq"}));
  enc->add_option("--update-fraction", args->update_fraction,
                  "lossy: with the dsq schedule, a delta frame's error at most this fraction of its update "
                  "(default: the mount's)")
      ->check(CLI::Range(1e-6, lossy::kMaxUpdateFraction));
  enc->add_option("--low-rank", args->low_rank,
                  "lossy: also try Adam's exp_avg matrices (in step space) with a low-rank term in their "
                  "prediction, on or off (default: the mount's)")
      ->check(CLI::IsMember({"on", "off"}));
  enc->add_option("--trellis", args->trellis,
                  "lossy: also try trellis-coded quantization for chunks with an L2 budget, kept when smaller, "
                  "on or off (default: the mount's)")
      ->check(CLI::IsMember({"on", "off"}));
  enc->add_option("--momentum-dither", args->momentum_dither,
                  "lossy: Adam's exp_avg (in step space, with a base) coded with a subtractive dither, its error "
                  "noise of this relative size on the step; 0 = off (default: the mount's)")
      ->check(CLI::Range(0.0, kMaxMomentumDither));
  enc->add_option("--predict", args->predict,
                  "lossy: code weights against a prediction from their optimizer state when smaller, on or off "
                  "(default on)")
      ->check(CLI::IsMember({"on", "off"}));
  enc->add_option("--momentum", args->momentum,
                  "lossy: Adam's exp_avg coded as it is (plain) or in step space, its budget measured on "
                  "m / (sqrt(v) + eps), and SGD's momentum_buffer with the same budget (step) (default step)")
      ->check(CLI::IsMember({"plain", "step"}));
  enc->add_option("--momentum-budget", args->momentum_budget,
                  "lossy: rel_l2 budget on the step of exp_avg in step space and of SGD's momentum_buffer "
                  "(default 2.5x the optimizer budget, at most 1)")
      ->check(CLI::PositiveNumber & CLI::Range(0.0, 1.0));
  enc->add_option("--denominator-budget", args->denominator_budget,
                  "lossy: per-element bound of exp_avg_sq and other update denominators, each within a factor "
                  "1 + MAX_REL either way (log mode; default 2.25x the optimizer budget, at most 1; 0 = lossless)")
      ->check(CLI::Range(0.0, 1.0));
  enc->add_flag("-q,--quiet", args->quiet, "no progress line on a terminal");
  enc->callback([args, exit_code] { *exit_code = RunEncode(*args); });

  CLI::App* dec = app.add_subcommand("decode", "Decode a blob back into the file");
  dec->add_option("BLOB", args->in, "blob")->required()->check(CLI::ExistingFile);
  dec->add_option("OUT", args->out, "output file")->required();
  dec->add_option("--base", args->bases, "base blobs of a delta chain");
  dec->add_option("--threads", args->threads, "decode threads")->check(CLI::Range(1, 256));
  dec->add_flag("-q,--quiet", args->quiet, "no progress line on a terminal");
  dec->callback([args, exit_code] { *exit_code = RunDecode(*args); });

  CLI::App* ins = app.add_subcommand("inspect-blob", "Describe a blob: format, tensors, codecs, sizes");
  ins->add_option("BLOB", args->in, "blob")->required()->check(CLI::ExistingFile);
  ins->add_flag("--json", args->json, "machine-readable output");
  ins->add_flag("--chunks", args->chunks, "list every chunk with its checksum");
  ins->add_option("--base", args->bases, "base blobs of a delta chain");
  ins->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace ckptfs::tools
