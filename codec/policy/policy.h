// Which tensors are stored lossily, and with what error budget: rules that
// map a file glob and a tensor-name glob to lossless or lossy(budget). Parsed
// from a TOML file (docs/policy.md) and from mount options.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::policy {

enum class Mode { kLossless, kLossy };

struct Rule {
  // fnmatch(3) globs. A file glob without '/' matches the file's base name,
  // one with '/' the path relative to the mount root. Tensor globs match
  // the tensor name ('*' also matches '.').
  std::string files = "*";
  std::string tensors = "*";
  Mode mode = Mode::kLossy;
  lossy::Budget budget;  // for kLossy; rel_l2 or max_abs > 0, or max_rel > 0 alone
};

inline constexpr double kDefaultRelL2 = 1e-2;
// The floor of the optimizer state's default budget. Adam's first moment
// forgets an error within about 1/(1 - beta1) = 10 steps, and a relative
// error e in the second moment moves each element's step size by about e/2:
// restoring ten times from a store at 0.2 (with the dsq schedule on the
// weights) ended three training workloads within their targets on 8 of 9
// seed runs, with 1.2x the ratio of weights plus optimizer state of 0.1
// (docs/eval.md).
inline constexpr double kDefaultOptimizerRelL2 = 0.2;

// Adam's first moment coded in step space (codec/FORMAT.md "Step space")
// gets this multiple of the optimizer budget, measured on the step, by
// default (at most 1): 0.5 at the default 0.2. Restoring ten times from a
// store with exp_avg at 0.5 on the step ended the three eval workloads as
// close to or closer to their uninterrupted runs than 0.2 on m itself did,
// with 1.15-1.2x the ratio of weights plus optimizer state (docs/eval.md).
// SGD's momentum buffer is its own step (the update is -lr x buffer, with
// Nesterov -lr x (grad + momentum x buffer)) and gets the same budget on
// itself: its error moves the weights by lr x momentum / (1 - momentum) x
// the error after a restore, 0.15-0.39 of a checkpoint interval's update at
// 0.5 on the eval's ResNet, against 0.13-0.58 (digits) and 0.76-1.09
// (character LM) for Adam's first moment at 0.5 on the step
// (scripts/eval/momentum_reach.py); restoring the ResNet ten times over
// six seeds ended as close to its uninterrupted runs as at 0.2 on the
// buffer, with 1.3x the ratio (docs/eval.md).
inline constexpr double kMomentumStepBudgetFactor = 2.5;

// Update denominators (IsOptimizerDenominator: Adam's exp_avg_sq, ...) get
// this multiple of the optimizer budget as their per-element max_rel by
// default (at most 1): 0.45 at the default 0.2, every element within a
// factor 1.45 of its value either way (LOSSY.md §9), so each step size
// within a factor 0.83-1.2 of its own; the log mode's grid then has one
// level per octave (rounded in log, every element of a key frame within a
// factor sqrt(2)). Until 2026-12-06 the factor was 2 and the bound |v_hat -
// v| <= 0.4 v on the same grid, which let v come back up to 0.6 times its
// value and, rounded in value, smaller on average (docs/eval.md "What one
// restore does"). Restoring the character LM ten times from 0.4 ended as
// close to its uninterrupted runs as from 0.2 (+0.48 % against +0.45 %
// loss, three seeds, docs/eval.md), its second moment at 0.81 instead of
// 1.33 bits per parameter per version. Its first moment is the sensitive
// part: 0.7 on the step instead of 0.5 ended +1.45 %.
inline constexpr double kDenominatorBudgetFactor = 2.25;

// The optimizer state's budget when none is given: the weights' budget
// `rel_l2`, but at least kDefaultOptimizerRelL2; 0 (lossless) when `rel_l2`
// is 0.
double DefaultOptimizerBudget(double rel_l2);

// Immutable after construction. Thread safety: const methods are safe.
class Policy {
 public:
  // Everything lossless.
  static Policy Lossless();
  // The defaults: float tensors of detected checkpoints lossy with
  // `rel_l2`, optimizer state (names "optimizer.state.*" or "state.*" in
  // a file whose name says optim) with `optimizer_rel_l2`, update
  // denominators (IsOptimizerDenominator) in log mode with max_rel =
  // denominator_max_rel(), all else lossless. Without `optimizer_rel_l2` the
  // optimizer state gets DefaultOptimizerBudget(rel_l2), also after
  // SetDefaultBudget.
  // REQUIRES: both >= 0 (0 = lossless).
  static Policy Defaults(double rel_l2 = kDefaultRelL2, std::optional<double> optimizer_rel_l2 = std::nullopt);
  // Parses a policy file (format in docs/policy.md). Its rules come before
  // the defaults, which its [defaults] table may change. InvalidArgument
  // names the bad key and the line.
  static Result<Policy> FromToml(std::string_view text, std::string_view source_name = "policy");
  static Result<Policy> FromTomlFile(const std::string& path);

  // Overrides the default budgets (mount options budget= / opt_budget=).
  void SetDefaultBudget(double rel_l2) { default_rel_l2_ = rel_l2; }
  void SetOptimizerBudget(double rel_l2) { optimizer_rel_l2_ = rel_l2; }
  // Overrides the step-space budget of first moments (mount option
  // momentum_budget=).
  void SetMomentumStepBudget(double rel_l2) { momentum_step_rel_l2_ = rel_l2; }
  // Overrides the per-element bound of update denominators (mount option
  // denominator_budget=).
  void SetDenominatorBudget(double max_rel) { denominator_max_rel_ = max_rel; }
  // The budget of optimizer state under the defaults (max_rel for update
  // denominators).
  double optimizer_rel_l2() const { return optimizer_rel_l2_.value_or(DefaultOptimizerBudget(default_rel_l2_)); }
  // The budget on the step of a first moment coded in step space under the
  // defaults (lossy::Budget::step_rel_l2).
  double momentum_step_rel_l2() const {
    return momentum_step_rel_l2_.value_or(std::min(1.0, kMomentumStepBudgetFactor * optimizer_rel_l2()));
  }
  // The per-element max_rel of update denominators under the defaults.
  double denominator_max_rel() const {
    return denominator_max_rel_.value_or(std::min(1.0, kDenominatorBudgetFactor * optimizer_rel_l2()));
  }

  // The budget for tensor `t` of the file at `path` (relative to the mount
  // root) of `format`: zero (lossless) for integer/bool/f64 tensors, big-
  // endian tensors and opaque files whatever the rules say; else the first
  // matching rule; else the defaults.
  lossy::Budget BudgetFor(std::string_view path, FileFormat format, const TensorInfo& t) const;

  const std::vector<Rule>& rules() const { return rules_; }
  bool enabled() const { return enabled_; }

 private:
  std::vector<Rule> rules_;
  bool enabled_ = true;
  double default_rel_l2_ = kDefaultRelL2;
  std::optional<double> optimizer_rel_l2_;  // unset: DefaultOptimizerBudget(default_rel_l2_)
  std::optional<double> momentum_step_rel_l2_;  // unset: kMomentumStepBudgetFactor * optimizer_rel_l2()
  std::optional<double> denominator_max_rel_;   // unset: kDenominatorBudgetFactor * optimizer_rel_l2()
};

// True if `name` is optimizer state: "optimizer.state.*", "optim.state.*",
// "state.*", or, nested under a framework's keys, a name below a key that
// contains "optim" with a ".state." level after it
// (optimizer_states.0.state.3.exp_avg) or a per-parameter state leaf
// (optimizer_state_dict.base_optimizer_state.0.exp_avg_sq).
bool IsOptimizerState(std::string_view name);

// True if `name` is optimizer state used as a denominator of the update
// (Adam's exp_avg_sq, RMSprop's square_avg, Adagrad's sum, ...). The default
// policy never prunes these (zeroing one small element blows up the step):
// it stores them in log mode, with a per-element relative bound.
bool IsOptimizerDenominator(std::string_view name);

// True if `name` is a first moment: Adam's ("<optimizer state>.exp_avg"),
// which the container may code in step space, or SGD's momentum buffer
// ("<optimizer state>.momentum_buffer"), which is SGD's step itself. Under
// the defaults both carry the momentum budget as their step budget
// (lossy::Budget::step_rel_l2).
bool IsFirstMoment(std::string_view name);

}  // namespace ckptfs::policy
