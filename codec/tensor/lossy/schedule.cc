#include "codec/tensor/lossy/schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace ckptfs::lossy {

Result<BudgetSchedule> ParseBudgetSchedule(std::string_view name) {
  BudgetSchedule s;
  if (name == "off") return s;
  if (name == "dsq") {
    s.kind = BudgetSchedule::Kind::kDsq;
    return s;
  }
  return Status::InvalidArgument("budget schedule: want off or dsq, have '" + std::string(name) + "'");
}

std::string_view BudgetScheduleName(const BudgetSchedule& schedule) {
  return schedule.kind == BudgetSchedule::Kind::kDsq ? "dsq" : "off";
}

Budget EffectiveBudget(const BudgetSchedule& schedule, const Budget& configured, std::optional<double> update_rel) {
  if (!schedule.enabled() || !update_rel || !(configured.rel_l2 > 0)) return configured;
  // A non-finite or negative measure (no finite values) gives no evidence:
  // keep the configured budget.
  if (!std::isfinite(*update_rel) || *update_rel < 0) return configured;
  const double floor = std::clamp(schedule.min_fraction, 0.0, 1.0) * configured.rel_l2;
  const double wanted = std::max(schedule.update_fraction, 0.0) * *update_rel;
  const double rel = std::clamp(wanted, floor, configured.rel_l2);
  // A zero floor with a zero update would make the chunk lossless; that is a
  // budget of 0 in the codec's terms, not a tight one. Stay lossy.
  if (!(rel > 0)) return configured;
  const double factor = rel / configured.rel_l2;
  return Budget{rel, configured.max_abs * factor};
}

}  // namespace ckptfs::lossy
