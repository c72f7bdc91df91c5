// Checkpoint benchmark: ckptfs's codec next to zstd -1 and zstd -3 on the same
// bytes, in one process, single-threaded, medians of several runs. Prints
// JSON (one object) on stdout.
//
//   checkpoint_bench [--runs N] [--budget REL_L2] [--opt-budget REL_L2] [--policy FILE.toml] FILE...
//                    [--seq V0 V1 ...]
// --budget stores float tensors lossily within that per-tensor relative L2
// error (the mount's default policy; --opt-budget for optimizer state);
// --policy puts a policy file's rules before those defaults (e.g. update
// denominators lossless, to compare with their log mode in the same run).
// --seq encodes each version against the previous one (delta frames).
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "codec/common/io.h"
#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "codec/policy/policy.h"

namespace ckptfs {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double MedianSeconds(int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(t);
}

nlohmann::json Entry(uint64_t logical, uint64_t stored, double enc_s, double dec_s) {
  return {{"stored_bytes", stored},
          {"ratio", stored ? double(logical) / double(stored) : 0.0},
          {"encode_MBps", enc_s > 0 ? double(logical) / enc_s / 1e6 : 0.0},
          {"decode_MBps", dec_s > 0 ? double(logical) / dec_s / 1e6 : 0.0}};
}

nlohmann::json BenchZstd(ByteSpan in, int level, int runs) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::vector<std::byte> comp(ZSTD_compressBound(in.size()));
  std::vector<std::byte> back(in.size());
  size_t n = 0;
  double enc = MedianSeconds(runs, [&] {
    n = ZSTD_compressCCtx(c, comp.data(), comp.size(), in.data(), in.size(), level);
  });
  double dec = MedianSeconds(runs, [&] { ZSTD_decompressDCtx(d, back.data(), back.size(), comp.data(), n); });
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
nlohmann::json BenchCkptfs(ByteSpan file, const BaseRef* base, int runs, const policy::Policy* policy,
                           MapResolver* resolver, ObjectId* id_out) {
  Layout layout = DetectLayout(file);
  EncodeOptions options;
  options.threads = 1;
  if (policy != nullptr)
    options.lossy_budget = [policy](FileFormat format, const TensorInfo& t) { return policy->BudgetFor("", format, t); };
  VectorSink sink;
  EncodeStats stats;
  Status failure;
  double enc = MedianSeconds(runs, [&] {
    sink.bytes.clear();
    auto r = EncodeBlob(file, layout, base, options, &sink);
    if (!r.ok()) failure = r.status();
    else stats = *r;
  });
  if (!failure.ok()) return {{"error", failure.ToString()}};
  ObjectId id = ObjectId::Of(sink.bytes);
  auto reader = BlobReader::Open(std::make_shared<MemoryFile>(sink.bytes), std::nullopt, resolver);
  if (!reader.ok()) return {{"error", reader.status().ToString()}};
  std::vector<std::byte> out(file.size());
  double dec = MedianSeconds(runs, [&] {
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
  return j;
}

int Main(int argc, char** argv) {
  int runs = 5;
  double budget = 0, opt_budget = -1;
  std::vector<std::string> files, seq;
  std::string policy_file;
  bool in_seq = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--budget" && i + 1 < argc) budget = std::atof(argv[++i]);
    else if (a == "--opt-budget" && i + 1 < argc) opt_budget = std::atof(argv[++i]);
    else if (a == "--policy" && i + 1 < argc) policy_file = argv[++i];
    else if (a == "--seq") in_seq = true;
    else (in_seq ? seq : files).push_back(a);
  }
  if (budget < 0 || !(budget < 1)) return (std::fprintf(stderr, "--budget: want [0, 1)\n"), 2);
  std::optional<policy::Policy> lossy_policy;
  if (!policy_file.empty()) {
    Result<policy::Policy> p = policy::Policy::FromTomlFile(policy_file);
    if (!p.ok()) return (std::fprintf(stderr, "%s\n", p.status().ToString().c_str()), 2);
    p->SetDefaultBudget(budget);
    p->SetOptimizerBudget(opt_budget >= 0 ? opt_budget : budget);
    lossy_policy = std::move(*p);
  } else if (budget > 0 || opt_budget > 0) {
    lossy_policy = policy::Policy::Defaults(budget, opt_budget >= 0 ? opt_budget : budget);
  }
  const policy::Policy* policy = lossy_policy ? &*lossy_policy : nullptr;
  nlohmann::json out;
  out["runs"] = runs;
  out["budget"] = budget;
  out["opt_budget"] = opt_budget >= 0 ? opt_budget : budget;
  out["policy"] = policy_file;
  out["threads"] = 1;
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
    j["ckptfs"] = BenchCkptfs(*bytes, nullptr, runs, policy, &resolver, &id);
    j["zstd-1"] = BenchZstd(*bytes, 1, runs);
    j["zstd-3"] = BenchZstd(*bytes, 3, runs);
    out["files"].push_back(j);
  }
  if (!seq.empty()) {
    out["sequence"] = nlohmann::json::array();
    std::optional<BaseRef> base;
    uint64_t logical = 0, stored = 0, zstd_stored = 0;
    for (const auto& path : seq) {
      auto bytes = ReadWholeFile(path);
      if (!bytes.ok()) return 2;
      ObjectId id;
      nlohmann::json j{{"file", path}, {"bytes", bytes->size()}};
      j["ckptfs"] = BenchCkptfs(*bytes, base ? &*base : nullptr, runs, policy, &resolver, &id);
      j["zstd-3"] = BenchZstd(*bytes, 3, 1);
      if (j["ckptfs"].contains("error")) return (std::puts(j.dump(2).c_str()), 3);
      logical += bytes->size();
      stored += j["ckptfs"]["stored_bytes"].get<uint64_t>();
      zstd_stored += j["zstd-3"]["stored_bytes"].get<uint64_t>();
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
