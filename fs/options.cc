#include "fs/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string>

#include "fs/commit_pipeline.h"

namespace ckptfs::fs {
namespace {

template <typename T>
Status ParseNumber(std::string_view key, std::string_view value, T min, T max, T* out) {
  T v{};
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || v < min || v > max)
    return Status::InvalidArgument(fmt::format("-o {}: want a number in [{}, {}] have '{}'", key, min, max, value));
  *out = v;
  return Status::Ok();
}

Status ParseOnOff(std::string_view key, std::string_view value, bool* out) {
  if (value == "on" || value == "1" || value == "true") *out = true;
  else if (value == "off" || value == "0" || value == "false") *out = false;
  else return Status::InvalidArgument(fmt::format("-o {}: want on|off have '{}'", key, value));
  return Status::Ok();
}

// Options libfuse 3.14 accepts (fuse_session_new and the mount code).
const std::set<std::string_view> kFuseFlags = {"allow_other", "allow_root", "default_permissions", "auto_unmount",
                                               "ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec",
                                               "noatime", "atime", "nodiratime", "relatime", "sync", "async",
                                               "dirsync"};
const std::set<std::string_view> kIgnored = {"defaults", "noauto", "auto", "user", "nouser", "users", "nofail",
                                             "_netdev", "x-systemd.automount"};

}  // namespace

const Preset* FindPreset(std::string_view name) {
  for (const Preset& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

// The items of a comma-separated list.
std::vector<std::string_view> SplitItems(std::string_view list) {
  std::vector<std::string_view> items;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

Status ParseOptionItems(std::string_view list, MountOptions* o);

}  // namespace

Status ParseMountOptionList(const std::string& list, MountOptions* o) {
  // level= first, wherever it stands: the options next to it refine it.
  for (std::string_view item : SplitItems(list)) {
    if (!item.starts_with("level=")) continue;
    std::string_view name = item.substr(6);
    const Preset* preset = FindPreset(name);
    if (preset == nullptr) {
      std::string names;
      for (const Preset& p : kPresets) names += (names.empty() ? "" : "|") + std::string(p.name);
      return Status::InvalidArgument(fmt::format("-o level: want {} have '{}'", names, name));
    }
    RETURN_IF_ERROR(ParseOptionItems(preset->options, o));
    o->level = std::string(name);
  }
  return ParseOptionItems(list, o);
}

namespace {
Status ParseOptionItems(std::string_view list, MountOptions* o) {
  for (std::string_view item : SplitItems(list)) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    if (key == "compress") RETURN_IF_ERROR(ParseOnOff(key, value, &o->compress));
    else if (key == "threads") RETURN_IF_ERROR(ParseNumber<unsigned>(key, value, 1, 256, &o->threads));
    else if (key == "fuse_threads") RETURN_IF_ERROR(ParseNumber<unsigned>(key, value, 2, 256, &o->fuse_threads));
    else if (key == "keyframe") RETURN_IF_ERROR(ParseNumber<uint32_t>(key, value, 1, kMaxKeyframe, &o->keyframe));
    else if (key == "cache") RETURN_IF_ERROR(ParseNumber<uint64_t>(key, value, 0, 1u << 20, &o->cache_mib));
    else if (key == "mem") RETURN_IF_ERROR(ParseNumber<uint64_t>(key, value, 0, 1u << 24, &o->mem_mib));
    else if (key == "zstd") RETURN_IF_ERROR(ParseNumber<int>(key, value, -7, 22, &o->zstd_level));
    else if (key == "gc_grace") RETURN_IF_ERROR(ParseNumber<int64_t>(key, value, 0, INT64_MAX, &o->gc_grace_seconds));
    else if (key == "gc_interval")
      RETURN_IF_ERROR(ParseNumber<int64_t>(key, value, 0, INT64_MAX, &o->gc_interval_seconds));
    else if (key == "readahead") RETURN_IF_ERROR(ParseNumber<uint32_t>(key, value, 0, 1u << 20, &o->read_ahead_kb));
    else if (key == "decode_ahead")
      RETURN_IF_ERROR(ParseNumber<uint64_t>(key, value, 0, 1u << 20, &o->decode_ahead_mib));
    else if (key == "level") continue;  // applied first (ParseMountOptionList)
    else if (key == "log") o->log_file = std::string(value);
    else if (key == "staging") {
      if (value.empty() || (value != "auto" && value != "store" && value.front() != '/'))
        return Status::InvalidArgument(fmt::format("-o staging: want auto|store|/ABSOLUTE/DIR have '{}'", value));
      o->staging = std::string(value);
    }
    else if (key == "lossy") RETURN_IF_ERROR(ParseOnOff(key, value, &o->lossy));
    else if (key == "predict") RETURN_IF_ERROR(ParseOnOff(key, value, &o->step_prediction));
    else if (key == "low_rank") RETURN_IF_ERROR(ParseOnOff(key, value, &o->low_rank_moments));
    else if (key == "trellis") RETURN_IF_ERROR(ParseOnOff(key, value, &o->trellis));
    else if (key == "momentum_dither")
      RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, kMaxMomentumDither, &o->momentum_dither));
    else if (key == "momentum") {
      if (value != "plain" && value != "step")
        return Status::InvalidArgument(fmt::format("-o momentum: want plain|step have '{}'", value));
      o->momentum_step_space = value == "step";
    } else if (key == "momentum_budget") {
      RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, 1.0, &o->momentum_budget));
      // 0 would read as "lossless" like the other budgets, but it is a budget
      // on the step of a first moment that stays lossy: refuse it.
      if (o->momentum_budget == 0)
        return Status::InvalidArgument("-o momentum_budget: want a number in (0, 1] have '0'");
    } else if (key == "denominator_budget") {
      RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, 1.0, &o->denominator_budget));
    }
    else if (key == "budget") {
      RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, 1.0, &o->budget));
      o->budget_set = true;
    } else if (key == "opt_budget") RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, 1.0, &o->opt_budget));
    else if (key == "policy") {
      if (value.empty()) return Status::InvalidArgument("-o policy: want a file name");
      o->policy_file = std::string(value);
    } else if (key == "gpu") {
      Result<lossy::GpuMode> mode = lossy::ParseGpuMode(value);
      if (!mode.ok()) return Status::InvalidArgument(fmt::format("-o gpu: want auto|on|off have '{}'", value));
      o->gpu = *mode;
    } else if (key == "schedule") {
      Result<lossy::BudgetSchedule> schedule = lossy::ParseBudgetSchedule(value);
      if (!schedule.ok()) return Status::InvalidArgument(fmt::format("-o schedule: want off|dsq have '{}'", value));
      const double fraction = o->schedule.update_fraction;  // update_fraction= may come first
      o->schedule = *schedule;
      o->schedule.update_fraction = fraction;
    } else if (key == "update_fraction") {
      RETURN_IF_ERROR(ParseNumber<double>(key, value, 0.0, lossy::kMaxUpdateFraction, &o->schedule.update_fraction));
      if (o->schedule.update_fraction == 0)
        return Status::InvalidArgument(
            fmt::format("-o update_fraction: want a number in (0, {}] have '0'", lossy::kMaxUpdateFraction));
    }
    else if (key == "loglevel" || key == "log_level") {
      if (!ParseLogLevel(value, &o->log_level))
        return Status::InvalidArgument(fmt::format("-o loglevel: want debug|info|warn|error have '{}'", value));
    } else if (key == "crash_at") {
      if (!IsCommitStep(value))
        return Status::InvalidArgument(fmt::format("-o crash_at: unknown commit step '{}'", value));
      o->crash_at = std::string(value);
    } else if (key == "debug") o->debug_fuse = true;
    else if (kFuseFlags.count(key) && eq == std::string_view::npos) o->fuse_options.emplace_back(key);
    else if (kIgnored.count(key) || key.starts_with("x-")) continue;
    else return Status::InvalidArgument(fmt::format("-o: unknown option '{}'", item));
  }
  return Status::Ok();
}
}  // namespace

MemorySplit SplitMemory(const MountOptions& o) {
  if (o.mem_mib == 0) return {o.cache_mib, 0, kAwaitedPerCache * o.cache_mib};
  uint64_t cache = std::min(o.cache_mib, o.mem_mib / 2);
  return {cache, std::max<uint64_t>(1, o.mem_mib - cache), 0};
}

Result<std::shared_ptr<const policy::Policy>> BuildLossyPolicy(const MountOptions& o) {
  if (!o.lossy) return std::make_shared<const policy::Policy>(policy::Policy::Lossless());
  policy::Policy p = policy::Policy::Defaults(
      o.budget, o.opt_budget >= 0 ? std::optional<double>(o.opt_budget) : std::nullopt);
  if (!o.policy_file.empty()) {
    ASSIGN_OR_RETURN(p, policy::Policy::FromTomlFile(o.policy_file));
    // Explicit mount options win over the file's [defaults].
    if (o.budget_set) p.SetDefaultBudget(o.budget);
    if (o.opt_budget >= 0) p.SetOptimizerBudget(o.opt_budget);
  }
  if (o.momentum_budget >= 0) p.SetMomentumStepBudget(o.momentum_budget);
  if (o.denominator_budget >= 0) p.SetDenominatorBudget(o.denominator_budget);
  return std::make_shared<const policy::Policy>(std::move(p));
}

}  // namespace ckptfs::fs
