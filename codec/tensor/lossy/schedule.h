// Dynamic precision ("DSQ" schedule): the error budget of a delta frame
// follows the measured size of the update it stores. Early in training the
// weights move a lot between versions and the configured budget is far below
// the update; as the learning rate decays the update shrinks, and a fixed
// budget would let the quantization error grow as large as (or larger than)
// the training progress between two checkpoints. The schedule keeps the
// error a fixed fraction of the update instead, within [floor, configured].
// Rationale and defaults: LOSSY.md §8.
#pragma once

#include <optional>
#include <string_view>

#include "codec/common/status.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

// The loosest update_fraction the options accept: at 1 a delta frame may be
// as far from its version as that version is from the previous one; above
// a few times that, the schedule would only ever hit the configured budget.
inline constexpr double kMaxUpdateFraction = 4.0;

struct BudgetSchedule {
  enum class Kind { kOff, kDsq };
  Kind kind = Kind::kOff;
  // The reconstruction error may be at most this fraction of the update:
  // effective rel_l2 = update_fraction * ||w - base|| / ||w||.
  double update_fraction = 0.5;
  // ... but never below this fraction of the configured budget (each step
  // tighter costs bits; this bounds the cost on a frozen or converged tensor).
  double min_fraction = 0.1;

  bool enabled() const { return kind != Kind::kOff; }
};

// "off" or "dsq" (with the default parameters); else InvalidArgument.
Result<BudgetSchedule> ParseBudgetSchedule(std::string_view name);
std::string_view BudgetScheduleName(const BudgetSchedule& schedule);

// The budget a chunk is encoded to, given its configured budget and its
// measured relative update `update_rel` = ||w - base|| / ||w|| over the
// finite elements (nullopt for a key frame: nothing to compare against).
// With the schedule off, for a key frame, or for a budget without rel_l2,
// this is `configured`. Otherwise rel_l2 becomes
//   clamp(update_fraction * update_rel, min_fraction * rel_l2, rel_l2)
// and max_abs (if set) shrinks by the same factor. The result is never
// looser than `configured` and never lossless when `configured` is lossy.
// Thread safety: pure function.
Budget EffectiveBudget(const BudgetSchedule& schedule, const Budget& configured, std::optional<double> update_rel);

}  // namespace ckptfs::lossy
