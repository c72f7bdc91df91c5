#include "codec/policy/policy.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "codec/format/dcp_metadata.h"

namespace ckptfs::policy {
namespace {

bool GlobMatch(const std::string& glob, std::string_view text) {
  return ::fnmatch(glob.c_str(), std::string(text).c_str(), 0) == 0;
}

bool FileMatches(const std::string& glob, std::string_view path) {
  if (glob.find('/') != std::string::npos) return GlobMatch(glob, path);
  const size_t slash = path.rfind('/');
  return GlobMatch(glob, slash == std::string_view::npos ? path : path.substr(slash + 1));
}

Status Bad(std::string_view source, const toml::source_region& where, std::string why) {
  return Status::InvalidArgument(fmt::format("{}:{}: {}", source, where.begin.line, why));
}

Result<double> ReadBudgetValue(std::string_view source, const toml::node& node, std::string_view key) {
  std::optional<double> v = node.value<double>();
  if (!v || !std::isfinite(*v) || *v < 0 || *v >= 1e6)
    return Bad(source, node.source(), fmt::format("{} must be a number >= 0", key));
  return *v;
}

Result<Mode> ReadMode(std::string_view source, const toml::node& node) {
  std::optional<std::string> v = node.value<std::string>();
  if (v == "lossy") return Mode::kLossy;
  if (v == "lossless") return Mode::kLossless;
  return Bad(source, node.source(), "mode must be \"lossy\" or \"lossless\"");
}

}  // namespace

namespace {

// The leaf names of per-parameter optimizer state (Adam, AMSGrad, SGD with
// momentum, RMSprop, Adamax, Adagrad, Adadelta, Adafactor).
bool IsOptimizerLeaf(std::string_view leaf) {
  for (std::string_view d : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "exp_inf",
                             "acc_delta", "exp_avg_sq_row", "exp_avg_sq_col"})
    if (leaf == d) return true;
  return false;
}

bool ContainsOptim(std::string_view s) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("optim") != std::string::npos;
}

}  // namespace

bool IsOptimizerState(std::string_view name) {
  if (name.starts_with("optimizer.state.") || name.starts_with("optim.state.") || name.starts_with("state."))
    return true;
  // Frameworks nest the optimizer's state dict under their own keys:
  // Lightning's optimizer_states.0.state.3.exp_avg_sq, DeepSpeed's
  // optimizer_state_dict.base_optimizer_state.0.exp_avg_sq. Optimizer
  // state there is a name under a key that says optim, below a `state`
  // level or with a per-parameter state leaf.
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos) return false;
  const size_t state = name.find(".state.");
  if (state != std::string_view::npos && ContainsOptim(name.substr(0, state))) return true;
  return IsOptimizerLeaf(name.substr(dot + 1)) && ContainsOptim(name.substr(0, dot));
}

bool IsOptimizerDenominator(std::string_view name) {
  if (!IsOptimizerState(name)) return false;
  size_t dot = name.rfind('.');
  std::string_view leaf = dot == std::string_view::npos ? name : name.substr(dot + 1);
  // Adam/AdamW/AMSGrad second moments, RMSprop, Adamax, Adagrad, Adadelta,
  // Adafactor's factored second moments.
  for (std::string_view d : {"exp_avg_sq", "max_exp_avg_sq", "square_avg", "exp_inf", "sum", "acc_delta",
                             "exp_avg_sq_row", "exp_avg_sq_col"})
    if (leaf == d) return true;
  return false;
}

bool IsFirstMoment(std::string_view name) {
  return IsOptimizerState(name) && (name.ends_with(".exp_avg") || name.ends_with(".momentum_buffer"));
}

Policy Policy::Lossless() {
  Policy p;
  p.enabled_ = false;
  return p;
}

double DefaultOptimizerBudget(double rel_l2) { return rel_l2 > 0 ? std::max(rel_l2, kDefaultOptimizerRelL2) : 0.0; }

Policy Policy::Defaults(double rel_l2, std::optional<double> optimizer_rel_l2) {
  Policy p;
  p.default_rel_l2_ = rel_l2;
  p.optimizer_rel_l2_ = optimizer_rel_l2;
  return p;
}

Result<Policy> Policy::FromToml(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(
        fmt::format("{}:{}: {}", source, e.source().begin.line, std::string(e.description())));
  }
  Policy p;
  for (const auto& [key, node] : root) {
    if (key == "defaults") {
      const toml::table* t = node.as_table();
      if (t == nullptr) return Bad(source, node.source(), "[defaults] must be a table");
      for (const auto& [k, v] : *t) {
        if (k == "mode") {
          ASSIGN_OR_RETURN(Mode m, ReadMode(source, v));
          p.enabled_ = m == Mode::kLossy;
        } else if (k == "rel_l2") {
          ASSIGN_OR_RETURN(p.default_rel_l2_, ReadBudgetValue(source, v, "rel_l2"));
        } else if (k == "optimizer_rel_l2") {
          ASSIGN_OR_RETURN(double budget, ReadBudgetValue(source, v, "optimizer_rel_l2"));
          p.optimizer_rel_l2_ = budget;
        } else if (k == "momentum_step_rel_l2") {
          ASSIGN_OR_RETURN(double budget, ReadBudgetValue(source, v, "momentum_step_rel_l2"));
          if (budget == 0) return Bad(source, v.source(), "momentum_step_rel_l2 must be > 0");
          p.momentum_step_rel_l2_ = budget;
        } else if (k == "denominator_max_rel") {
          ASSIGN_OR_RETURN(double bound, ReadBudgetValue(source, v, "denominator_max_rel"));
          p.denominator_max_rel_ = bound;
        } else {
          return Bad(source, v.source(), fmt::format("unknown key '{}' in [defaults]", k.str()));
        }
      }
    } else if (key == "rule") {
      const toml::array* rules = node.as_array();
      if (rules == nullptr) return Bad(source, node.source(), "rules are written [[rule]]");
      for (const toml::node& r : *rules) {
        const toml::table* t = r.as_table();
        if (t == nullptr) return Bad(source, r.source(), "a rule must be a table");
        Rule rule;
        bool have_mode = false;
        for (const auto& [k, v] : *t) {
          if (k == "files" || k == "tensors") {
            std::optional<std::string> s = v.value<std::string>();
            if (!s || s->empty()) return Bad(source, v.source(), fmt::format("{} must be a non-empty glob", k.str()));
            (k == "files" ? rule.files : rule.tensors) = *s;
          } else if (k == "mode") {
            ASSIGN_OR_RETURN(rule.mode, ReadMode(source, v));
            have_mode = true;
          } else if (k == "rel_l2") {
            ASSIGN_OR_RETURN(rule.budget.rel_l2, ReadBudgetValue(source, v, "rel_l2"));
          } else if (k == "max_abs") {
            ASSIGN_OR_RETURN(rule.budget.max_abs, ReadBudgetValue(source, v, "max_abs"));
          } else if (k == "max_rel") {
            ASSIGN_OR_RETURN(rule.budget.max_rel, ReadBudgetValue(source, v, "max_rel"));
          } else {
            return Bad(source, v.source(), fmt::format("unknown key '{}' in [[rule]]", k.str()));
          }
        }
        if (!have_mode) return Bad(source, r.source(), "a rule needs mode = \"lossy\" or \"lossless\"");
        if (rule.mode == Mode::kLossy && !rule.budget.lossy())
          return Bad(source, r.source(), "a lossy rule needs rel_l2, max_abs or max_rel > 0");
        if (rule.budget.max_rel > 0 && (rule.budget.rel_l2 > 0 || rule.budget.max_abs > 0))
          return Bad(source, r.source(), "max_rel (per-element relative bound) is used alone");
        if (rule.mode == Mode::kLossless) rule.budget = {};
        p.rules_.push_back(std::move(rule));
      }
    } else {
      return Bad(source, node.source(), fmt::format("unknown table or key '{}'", key.str()));
    }
  }
  return p;
}

Result<Policy> Policy::FromTomlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("policy file {}: cannot open", path));
  std::stringstream text;
  text << in.rdbuf();
  return FromToml(text.str(), path);
}

lossy::Budget Policy::BudgetFor(std::string_view path, FileFormat format, const TensorInfo& t) const {
  if (format == FileFormat::kOpaque || !IsCodecFloat(t.dtype) || t.big_endian) return {};
  for (const Rule& r : rules_)
    if (FileMatches(r.files, path) && GlobMatch(r.tensors, t.name)) return r.budget;
  if (!enabled_) return {};
  // A DCP shard's tensors carry no names (their FQNs are in the separate
  // .metadata file): until a save's metadata named them (dcp_metadata.h),
  // optimizer state cannot be told from weights, and a second moment under
  // an L2 budget can break training (below): lossless unless a rule says
  // otherwise.
  if (format == FileFormat::kDcp && IsPositionalDcpName(t.name)) return {};
  // The L2-budget codec may prune a small positive element to 0; in a
  // denominator such as Adam's sqrt(exp_avg_sq) + eps that turns the next
  // update into m / eps and training diverges after a restore (measured:
  // NaN loss). Denominators therefore get the log mode, which bounds every
  // element's relative error (zeros stay zeros): every element within a
  // factor 1 + max_rel of its value either way, max_rel =
  // denominator_max_rel(), so each element's step size m / sqrt(v) moves by
  // a factor between 1/sqrt(1 + max_rel) and sqrt(1 + max_rel) (0.83-1.2
  // at the default 0.45). An optimizer budget of 0 keeps them lossless with
  // the rest of the optimizer state, whatever denominator_max_rel says.
  if (IsOptimizerDenominator(t.name)) return lossy::Budget{0, 0, optimizer_rel_l2() > 0 ? denominator_max_rel() : 0};
  if (IsFirstMoment(t.name) && optimizer_rel_l2() > 0)
    return lossy::Budget{optimizer_rel_l2(), 0, 0, momentum_step_rel_l2()};
  return lossy::Budget{IsOptimizerState(t.name) ? optimizer_rel_l2() : default_rel_l2_, 0};
}

}  // namespace ckptfs::policy
