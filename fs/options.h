// Mount options: ckptfs's own (-o compress=...,threads=...) and the subset
// of libfuse/kernel mount options passed through to libfuse.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codec/common/status.h"
#include "codec/container/blob.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/schedule.h"
#include "fs/log.h"

namespace ckptfs::fs {

// What mem= leaves to each consumer (MiB): the chunk cache gets half of
// the bound (at most cache=), encodes the rest. Without mem=: cache= and
// no encode bound (0), and room for awaited chunks (ChunkCache: a
// stream's optimizer state decoded ahead of it as its weights' inputs)
// of kAwaitedPerCache times cache= beside it, held only while such a file
// is being read; with mem= none (the bound is kept as it was set).
inline constexpr uint64_t kAwaitedPerCache = 4;
struct MemorySplit {
  uint64_t cache_mib = 0;
  uint64_t encode_mib = 0;
  uint64_t awaited_mib = 0;
};

// keyframe=N at most. A version's chain (chain_depth, its bases) is
// shorter than N links; a read through a ref copy follows the ref's chain
// too (one hop: refs do not chain), so fewer than 2N links, within a
// reader's chain limit (DecodeLimits::max_chain_depth, 256).
inline constexpr uint32_t kMaxKeyframe = 128;

struct MountOptions;
MemorySplit SplitMemory(const MountOptions& options);


struct MountOptions {
  std::string backing;
  std::string mountpoint;
  bool foreground = false;
  bool debug_fuse = false;       // -o debug: libfuse's request trace
  bool compress = true;          // compress=on|off
  unsigned threads = 2;          // threads=N encode workers, and the cores a commit's chunks share
  unsigned fuse_threads = 16;    // fuse_threads=N request threads
  uint32_t keyframe = 10;        // keyframe=N, at most kMaxKeyframe
  uint64_t cache_mib = 256;      // cache=MiB decoded chunk cache
  // mem=MiB (0: no bound): half for the chunk cache (at most cache=), the
  // rest reserved by encodes for their working set (encodes wait for it);
  // encoders also drop their mapped view of the staging file as they go.
  uint64_t mem_mib = 0;
  int zstd_level = 3;            // zstd=LEVEL
  std::string log_file;          // log=FILE (default stderr; syslog once daemonized)
  LogLevel log_level = LogLevel::kInfo;  // loglevel=debug|info|warn|error
  std::string crash_at;          // crash_at=<commit step>: abort() there (tests)
  int64_t gc_grace_seconds = 3600;   // gc_grace=SECONDS
  int64_t gc_interval_seconds = 3600;  // gc_interval=SECONDS (0: no background GC)
  // readahead=KiB for the mount's bdi. 16 MiB keeps the kernel asking for
  // the next few 4 MiB chunks while one is read, so the multithreaded loop
  // decodes them in parallel (1 GB cat: 2.05 s at 1 MiB, 1.48 s at 16 MiB).
  uint32_t read_ahead_kb = 16384;
  // decode_ahead=MiB: decoded chunks kept ahead of a sequential reader, on
  // threads= workers (0: off). At most a quarter of the chunk cache.
  uint64_t decode_ahead_mib = 16;
  bool lossy = true;             // lossy=on|off: float tensors of checkpoints within a budget
  double budget = 1e-2;          // budget=REL_L2 default per-tensor relative L2 error
  bool budget_set = false;       // budget= was given
  double opt_budget = -1;        // opt_budget=REL_L2 for optimizer state (< 0: policy::DefaultOptimizerBudget)
  std::string policy_file;       // policy=FILE.toml rules (docs/policy.md)
  lossy::GpuMode gpu = lossy::GpuMode::kAuto;  // gpu=auto|on|off lossy kernel backend
  // schedule=off|dsq: a delta frame's budget follows the size of its update
  // (on by default: docs/eval.md measured it closer to the uninterrupted run).
  lossy::BudgetSchedule schedule{lossy::BudgetSchedule::Kind::kDsq};
  // predict=on|off: weights coded against a prediction from their optimizer
  // state when smaller (codec/tensor/lossy/step_predictor.h).
  bool step_prediction = true;
  // low_rank=on|off: Adam's exp_avg matrices in step space also tried with
  // a low-rank term in their prediction (codec/FORMAT.md "Low-rank term").
  bool low_rank_moments = kLowRankMomentsByDefault;
  // momentum_dither=REL: Adam's exp_avg in step space with a base coded
  // with a subtractive dither, its error noise of this relative size on the
  // step (0 = off; codec/FORMAT.md "Dither").
  double momentum_dither = kMomentumDitherByDefault;
  // trellis=on|off: chunks with an L2 budget also tried with trellis-coded
  // quantization, kept when smaller (codec/tensor/lossy/trellis.h).
  bool trellis = kTrellisByDefault;
  // momentum=plain|step: Adam's exp_avg coded as it is, or in step space
  // (its budget on m / (sqrt(v) + eps); codec/optimizer/step_space.h), and
  // SGD's momentum_buffer, its own step, then with the same budget.
  bool momentum_step_space = true;
  // momentum_budget=REL_L2: that budget on the step; < 0: the policy's
  // default (policy::kMomentumStepBudgetFactor times the optimizer budget).
  double momentum_budget = -1.0;
  // denominator_budget=MAX_REL: the per-element bound of update
  // denominators (exp_avg_sq, ...); < 0: the policy's default
  // (policy::kDenominatorBudgetFactor times the optimizer budget).
  double denominator_budget = -1.0;
  // staging=auto|store|DIR: where the raw bytes of files being written
  // wait for their commit. store: BACKING/.ckptfs/staging; DIR: a
  // node-local directory (fsync then commits to the store); auto (the
  // default): store, except on a network or FUSE backing filesystem,
  // where it is kDefaultLocalStaging (fs/staging_placement.h).
  std::string staging = "auto";
  // level=lossless|safe|default|compact|max: the preset the option set came from
  // (kPresets; later options on the command line override its settings).
  std::string level = "default";
  std::vector<std::string> fuse_options;  // passed to libfuse (-o ...)
  // Built from lossy/budget/opt_budget/policy by BuildLossyPolicy (RunDaemon).
  std::shared_ptr<const policy::Policy> policy;
};

// The lossy policy the options ask for: the policy file's rules (if any),
// then the defaults with budget= / opt_budget= when given; everything
// lossless with lossy=off. InvalidArgument/NotFound for a bad policy file.
Result<std::shared_ptr<const policy::Policy>> BuildLossyPolicy(const MountOptions& options);

// The named trade-offs of -o level= (docs/policy.md "Levels"): each is a
// list of mount options applied before the other options of the list.
struct Preset {
  std::string_view name;
  std::string_view options;
  std::string_view summary;  // one line for `ckptfs mount --help`
};
inline constexpr Preset kPresets[] = {
    {"lossless", "lossy=off", "every byte stored exactly (lossless codec and deltas)"},
    {"safe", "lossy=on,budget=0.003,opt_budget=0.05",
     "weights within 0.3 %, optimizer state within 5 % (relative L2 per tensor)"},
    {"default", "lossy=on,budget=0.01", "weights within 1 %, optimizer state within its own budget (the default)"},
    {"compact", "lossy=on,budget=0.02,keyframe=20",
     "more ratio: weights within 2 %, delta chains twice as long (deep versions read slower)"},
    {"max", "lossy=on,budget=0.03,low_rank=on,keyframe=20",
     "most ratio: weights within 3 %, longer delta chains; check your model's accuracy"},
};
// The preset called `name`, or nullptr.
const Preset* FindPreset(std::string_view name);

// Parses one comma-separated -o list into `opts`. InvalidArgument names the
// first unknown or malformed option. Mount-helper options that only matter
// to mount(8) (defaults, _netdev, noauto, user, nofail...) are ignored.
Status ParseMountOptionList(const std::string& list, MountOptions* opts);

}  // namespace ckptfs::fs
