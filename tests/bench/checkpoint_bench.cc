// Checkpoint benchmark: ckptfs's codec next to zstd -1 and zstd -3 on the same
// bytes, in one process, single-threaded, medians of several runs. Prints
// JSON (one object) on stdout.
//
//   checkpoint_bench [--runs N] [--clock wall|cpu] [--budget REL_L2] [--opt-budget REL_L2]
//                    [--policy FILE.toml] [--schedule off|dsq] [--momentum plain|step] [--dump DIR] [--no-zstd]
//                    FILE... [--seq V0 V1 ...]
// --budget stores float tensors lossily within that per-tensor relative L2
// error (the mount's default policy; --opt-budget for optimizer state,
// by default as on the mount: --budget, at least 0.1);
// --policy puts a policy file's rules before those defaults (e.g. update
// denominators lossless, to compare with their log mode in the same run);
// --schedule dsq lets the budget of delta frames follow the update size.
// --momentum plain codes Adam's exp_avg as it is instead of in step space
// (the mount's default, step).
// --dump writes each encoded blob to DIR/<N>.blob (N counts the files, then
// the versions, from 0), for comparing two builds' output with cmp.
// --no-zstd leaves out the zstd baselines (so that a profile shows ckptfs alone).
// --seq encodes each version against the previous one (delta frames); each
// version also reports, over the model's lossy float tensors (not the
// optimizer state), the true update from the previous version, the error
// achieved and the budget applied.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "codec/common/io.h"
#include "codec/container/blob.h"
#include "codec/container/lossy_report.h"
#include "codec/format/layout.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy_chunk_codec.h"
#include "tests/bench/bench_clock.h"

namespace ckptfs {
namespace {

// How each measurement is taken: the median of `runs` calls, by `clock`
// (--clock cpu: the calling thread's CPU time).
struct Timing {
  int runs = 5;
  bench::ClockKind clock = bench::ClockKind::kWall;
};

// --dump: where the encoded blobs go (empty = nowhere), and the next blob's number.
struct BlobDump {
  std::string dir;
  int count = 0;
  Status Write(ByteSpan blob) {
    if (dir.empty()) return Status::Ok();
    return WriteWholeFile(dir + "/" + std::to_string(count++) + ".blob", blob);
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double MedianSeconds(const Timing& timing, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < timing.runs; ++i) {
    const double t0 = bench::NowSeconds(timing.clock);
    f();
    t.push_back(bench::NowSeconds(timing.clock) - t0);
  }
  return Median(t);
}

nlohmann::json Entry(uint64_t logical, uint64_t stored, double enc_s, double dec_s) {
  return {{"stored_bytes", stored},
          {"ratio", stored ? double(logical) / double(stored) : 0.0},
          {"encode_MBps", enc_s > 0 ? double(logical) / enc_s / 1e6 : 0.0},
          {"decode_MBps", dec_s > 0 ? double(logical) / dec_s / 1e6 : 0.0}};
}

nlohmann::json BenchZstd(ByteSpan in, int level, const Timing& timing) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::vector<std::byte> comp(ZSTD_compressBound(in.size()));
  std::vector<std::byte> back(in.size());
  size_t n = 0;
  double enc = MedianSeconds(timing, [&] {
    n = ZSTD_compressCCtx(c, comp.data(), comp.size(), in.data(), in.size(), level);
  });
  double dec = MedianSeconds(timing, [&] { ZSTD_decompressDCtx(d, back.data(), back.size(), comp.data(), n); });
  ZSTD_freeCCtx(c);
  ZSTD_freeDCtx(d);
  if (ZSTD_isError(n) || std::memcmp(back.data(), in.data(), in.size()) != 0) return {{"error", "zstd failed"}};
  return Entry(in.size(), n, enc, dec);
}

struct Encoded {
  std::vector<std::byte> blob;
  EncodeStats stats;
};

class MapResolver final : public BlobResolver {
 public:
  std::map<ObjectId, std::shared_ptr<const BlobReader>> readers;
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override {
    auto it = readers.find(id);
    if (it == readers.end()) return Status::NotFound("base " + id.Hex());
    return it->second;
  }
};

// Encodes and decodes `file` (against `base` when given); adds the reader of
// the result to `resolver` under its id and returns that id via *id_out.
// Over the model's float tensors that were stored lossily (optimizer state
// excluded): the relative update from `previous` (same tensor names; empty
// for the first version), the error of `decoded`, and the budget applied.
nlohmann::json ModelErrors(ByteSpan file, const Layout& layout, ByteSpan previous, ByteSpan decoded,
                           const BlobReader& reader) {
  std::map<std::string, Segment> before;
  if (!previous.empty()) {
    Layout prev = DetectLayout(previous);
    for (const Segment& s : prev.segments)
      if (s.is_tensor()) before[prev.tensors[s.tensor].name] = s;
  }
  auto reports = LossyTensorReports(reader);
  if (!reports.ok()) return {{"error", reports.status().ToString()}};
  std::map<std::string, double> budget;
  for (const TensorLossyReport& r : *reports) budget[reader.tensors()[r.tensor].name] = r.budget_rel_l2;
  double err2 = 0, ref2 = 0, upd2 = 0, upd_ref2 = 0, budget2 = 0;
  for (const Segment& s : layout.segments) {
    if (!s.is_tensor()) continue;
    const TensorInfo& t = layout.tensors[s.tensor];
    auto b = budget.find(t.name);
    if (b == budget.end() || policy::IsOptimizerState(t.name)) continue;
    ByteSpan now = file.subspan(s.offset, s.length);
    const ErrorSums e = MeasureError(t.dtype, now, decoded.subspan(s.offset, s.length));
    err2 += e.err2;
    ref2 += e.ref2;
    budget2 += b->second * b->second * e.ref2;
    if (auto p = before.find(t.name); p != before.end() && p->second.length == s.length) {
      const ErrorSums u = MeasureError(t.dtype, now, previous.subspan(p->second.offset, s.length));
      upd2 += u.err2;
      upd_ref2 += u.ref2;
    }
  }
  nlohmann::json j;
  j["model_rel_l2"] = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  j["model_budget_rel_l2"] = ref2 > 0 ? std::sqrt(budget2 / ref2) : 0.0;
  j["model_update_rel"] = upd_ref2 > 0 ? nlohmann::json(std::sqrt(upd2 / upd_ref2)) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json BenchCkptfs(ByteSpan file, const BaseRef* base, const Timing& timing, const policy::Policy* policy,
                           const lossy::BudgetSchedule& schedule, bool momentum_step, ByteSpan previous,
                           MapResolver* resolver, BlobDump* dump, ObjectId* id_out) {
  Layout layout = DetectLayout(file);
  EncodeOptions options;
  options.threads = 1;
  options.budget_schedule = schedule;
  options.momentum_step_space = momentum_step;
  if (policy != nullptr)
    options.lossy_budget = [policy](FileFormat format, const TensorInfo& t) { return policy->BudgetFor("", format, t); };
  VectorSink sink;
  EncodeStats stats;
  Status failure;
  double enc = MedianSeconds(timing, [&] {
    sink.bytes.clear();
    auto r = EncodeBlob(file, layout, base, options, &sink);
    if (!r.ok()) failure = r.status();
    else stats = *r;
  });
  if (!failure.ok()) return {{"error", failure.ToString()}};
  ObjectId id = ObjectId::Of(sink.bytes);
  if (Status written = dump->Write(sink.bytes); !written.ok()) return {{"error", written.ToString()}};
  auto reader = BlobReader::Open(std::make_shared<MemoryFile>(sink.bytes), std::nullopt, resolver);
  if (!reader.ok()) return {{"error", reader.status().ToString()}};
  std::vector<std::byte> out(file.size());
  double dec = MedianSeconds(timing, [&] {
    Status s = (*reader)->ReadAt(0, out);
    if (!s.ok()) failure = s;
  });
  if (!failure.ok()) return {{"error", failure.ToString()}};
  resolver->readers[id] = *reader;
  *id_out = id;
  nlohmann::json j = Entry(file.size(), sink.bytes.size(), enc, dec);
  j["exact"] = std::memcmp(out.data(), file.data(), file.size()) == 0;
  j["format"] = std::string(FileFormatName(layout.format));
  j["tensors"] = layout.tensors.size();
  j["delta_chunks"] = stats.delta_chunks;
  j["chunks"] = stats.chunks;
  j["lossy_chunks"] = stats.lossy_chunks;
  j["max_rel_l2"] = stats.max_rel_l2;
  if (policy != nullptr) j.update(ModelErrors(file, layout, previous, out, **reader));
  return j;
}

int Main(int argc, char** argv) {
  Timing timing;
  BlobDump dump;
  double budget = 0, opt_budget = -1;
  lossy::BudgetSchedule schedule;
  std::vector<std::string> files, seq;
  std::string policy_file;
  bool in_seq = false, zstd_baselines = true, momentum_step = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) timing.runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--clock" && i + 1 < argc)
      timing.clock = std::string(argv[++i]) == "cpu" ? bench::ClockKind::kThreadCpu : bench::ClockKind::kWall;
    else if (a == "--budget" && i + 1 < argc) budget = std::atof(argv[++i]);
    else if (a == "--opt-budget" && i + 1 < argc) opt_budget = std::atof(argv[++i]);
    else if (a == "--schedule" && i + 1 < argc) {
      auto parsed = lossy::ParseBudgetSchedule(argv[++i]);
      if (!parsed.ok()) return (std::fprintf(stderr, "--schedule: want off or dsq\n"), 2);
      schedule = *parsed;
    } else if (a == "--policy" && i + 1 < argc) policy_file = argv[++i];
    else if (a == "--momentum" && i + 1 < argc) {
      const std::string m = argv[++i];
      if (m != "plain" && m != "step") return (std::fprintf(stderr, "--momentum: want plain or step\n"), 2);
      momentum_step = m == "step";
    }
    else if (a == "--dump" && i + 1 < argc) dump.dir = argv[++i];
    else if (a == "--no-zstd") zstd_baselines = false;
    else if (a == "--seq") in_seq = true;
    else (in_seq ? seq : files).push_back(a);
  }
  if (budget < 0 || !(budget < 1)) return (std::fprintf(stderr, "--budget: want [0, 1)\n"), 2);
  std::optional<policy::Policy> lossy_policy;
  if (!policy_file.empty()) {
    Result<policy::Policy> p = policy::Policy::FromTomlFile(policy_file);
    if (!p.ok()) return (std::fprintf(stderr, "%s\n", p.status().ToString().c_str()), 2);
    p->SetDefaultBudget(budget);
    if (opt_budget >= 0) p->SetOptimizerBudget(opt_budget);
    lossy_policy = std::move(*p);
  } else if (budget > 0 || opt_budget > 0) {
    lossy_policy =
        policy::Policy::Defaults(budget, opt_budget >= 0 ? std::optional<double>(opt_budget) : std::nullopt);
  }
  const policy::Policy* policy = lossy_policy ? &*lossy_policy : nullptr;
  nlohmann::json out;
  out["runs"] = timing.runs;
  out["budget"] = budget;
  out["opt_budget"] = policy != nullptr ? policy->optimizer_rel_l2() : 0.0;
  out["policy"] = policy_file;
  out["threads"] = 1;
  out["clock"] = timing.clock == bench::ClockKind::kThreadCpu ? "thread_cpu" : "wall";
  out["schedule"] = std::string(lossy::BudgetScheduleName(schedule));
  out["files"] = nlohmann::json::array();
  MapResolver resolver;
  for (const auto& path : files) {
    auto bytes = ReadWholeFile(path);
    if (!bytes.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), bytes.status().ToString().c_str());
      return 2;
    }
    ObjectId id;
    nlohmann::json j{{"file", path}, {"bytes", bytes->size()}};
    j["ckptfs"] = BenchCkptfs(*bytes, nullptr, timing, policy, schedule, momentum_step, {}, &resolver, &dump, &id);
    if (zstd_baselines) {
      j["zstd-1"] = BenchZstd(*bytes, 1, timing);
      j["zstd-3"] = BenchZstd(*bytes, 3, timing);
    }
    out["files"].push_back(j);
  }
  if (!seq.empty()) {
    out["sequence"] = nlohmann::json::array();
    std::optional<BaseRef> base;
    uint64_t logical = 0, stored = 0, zstd_stored = 0;
    std::vector<std::byte> previous;
    for (const auto& path : seq) {
      auto bytes = ReadWholeFile(path);
      if (!bytes.ok()) return 2;
      ObjectId id;
      nlohmann::json j{{"file", path}, {"bytes", bytes->size()}};
      j["ckptfs"] =
          BenchCkptfs(*bytes, base ? &*base : nullptr, timing, policy, schedule, momentum_step, previous, &resolver,
                      &dump, &id);
      previous = *bytes;
      if (zstd_baselines) j["zstd-3"] = BenchZstd(*bytes, 3, Timing{1, timing.clock});
      if (j["ckptfs"].contains("error")) return (std::puts(j.dump(2).c_str()), 3);
      logical += bytes->size();
      stored += j["ckptfs"]["stored_bytes"].get<uint64_t>();
      if (zstd_baselines) zstd_stored += j["zstd-3"]["stored_bytes"].get<uint64_t>();
      out["sequence"].push_back(j);
      base = BaseRef{id, resolver.readers[id]};
    }
    out["sequence_total"] = {{"bytes", logical},
                             {"ckptfs_ratio", stored ? double(logical) / double(stored) : 0.0},
                             {"zstd-3_ratio", zstd_stored ? double(logical) / double(zstd_stored) : 0.0}};
  }
  std::puts(out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace ckptfs

int main(int argc, char** argv) { return ckptfs::Main(argc, argv); }
