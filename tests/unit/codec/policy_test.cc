// Lossy policies: defaults, TOML rules, and the tensors never made lossy.
#include <gtest/gtest.h>

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "codec/policy/policy.h"

namespace ckptfs::policy {
namespace {

TensorInfo T(std::string name, DType dtype = DType::kF32) { return TensorInfo{std::move(name), dtype, {4}, false}; }

// A policy file that sets one [defaults] key and has one lossy rule for
// the tensors named `rule_tensors` with `rule_budget` (a "key = value" line).
Result<Policy> DefaultAndRule(std::string_view default_key_value, std::string_view rule_tensors,
                              std::string_view rule_budget) {
  return Policy::FromToml(fmt::format("[defaults]\n{}\n\n[[rule]]\ntensors = \"{}\"\nmode = \"lossy\"\n{}\n",
                                      default_key_value, rule_tensors, rule_budget));
}

TEST(Policy, DefaultsAreLossyForCheckpointFloatsOnly) {
  Policy p = Policy::Defaults(1e-2, 5e-2);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("model.w")).rel_l2, 1e-2);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.0.exp_avg")).rel_l2, 5e-2);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("model.w", DType::kBF16)).rel_l2, 1e-2);
  for (DType d : {DType::kI64, DType::kBool, DType::kF64, DType::kU8}) EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("x", d)).rel_l2, 0.0);
  EXPECT_EQ(p.BudgetFor("a.bin", FileFormat::kOpaque, T("x")).rel_l2, 0.0);
  TensorInfo big = T("x");
  big.big_endian = true;
  EXPECT_EQ(p.BudgetFor("a.npy", FileFormat::kNpy, big).rel_l2, 0.0);
  EXPECT_EQ(Policy::Lossless().BudgetFor("a.pt", FileFormat::kTorchZip, T("w")).rel_l2, 0.0);
}

TEST(Policy, OptimizerStateDefaultsToTheBudgetButAtLeastTheFloor) {
  const TensorInfo m = T("optimizer.state.0.exp_avg"), v = T("optimizer.state.0.exp_avg_sq");
  auto check = [&](const Policy& p, double weights, double optimizer, const char* what) {
    EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("model.w")).rel_l2, weights) << what;
    EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, m).rel_l2, optimizer) << what;
    EXPECT_DOUBLE_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel,
                     std::min(1.0, kDenominatorBudgetFactor * optimizer))
        << what;
    EXPECT_EQ(p.optimizer_rel_l2(), optimizer) << what;
  };
  check(Policy::Defaults(), kDefaultRelL2, kDefaultOptimizerRelL2, "no budgets given");
  check(Policy::Defaults(1e-2), 1e-2, kDefaultOptimizerRelL2, "a budget below the floor");
  check(Policy::Defaults(0.3), 0.3, 0.3, "a budget above the floor");
  check(Policy::Defaults(1e-2, 1e-2), 1e-2, 1e-2, "an explicit optimizer budget");
  check(Policy::Defaults(0), 0.0, 0.0, "budget 0: lossless");
  // Changing the weights' budget later moves an unset optimizer budget with it.
  Policy later = Policy::Defaults(1e-2);
  later.SetDefaultBudget(0.5);
  check(later, 0.5, 0.5, "SetDefaultBudget above the floor");
  later.SetOptimizerBudget(0.02);
  check(later, 0.5, 0.02, "SetOptimizerBudget");
  // A policy file's [defaults] follows the same rule.
  Result<Policy> file = Policy::FromToml("[defaults]\nrel_l2 = 0.2\n");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  check(*file, 0.2, 0.2, "rel_l2 in [defaults]");
  Result<Policy> empty = Policy::FromToml("");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  check(*empty, kDefaultRelL2, kDefaultOptimizerRelL2, "an empty policy file");
}

// Update denominators get kDenominatorBudgetFactor times the optimizer
// budget as their per-element bound (at most 1), unless set (mount option,
// [defaults] key); a rule's max_rel applies either way; 0 is lossless.
TEST(Policy, DenominatorsGetTheirOwnBound) {
  const TensorInfo v = T("optimizer.state.0.exp_avg_sq"), m = T("optimizer.state.0.exp_avg");
  Policy p = Policy::Defaults();
  EXPECT_DOUBLE_EQ(p.denominator_max_rel(), 0.45);
  EXPECT_DOUBLE_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.45);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).rel_l2, 0.0);
  p.SetDenominatorBudget(0.25);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.25);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, m).rel_l2, kDefaultOptimizerRelL2) << "m keeps its budget";
  p.SetDenominatorBudget(0);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.0) << "0: lossless";
  EXPECT_EQ(Policy::Defaults(0).BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.0) << "all lossless";
  Result<Policy> file = DefaultAndRule("denominator_max_rel = 0.1", "optimizer.state.1.exp_avg_sq", "max_rel = 0.3");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->BudgetFor("a.pt", FileFormat::kTorchZip, v).max_rel, 0.1);
  EXPECT_EQ(file->BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.1.exp_avg_sq")).max_rel, 0.3);
  EXPECT_FALSE(Policy::FromToml("[defaults]\ndenominator_max_rel = -0.1\n").ok());
}

// Adam's first moment also carries the budget it gets when the container
// codes it in step space: kMomentumStepBudgetFactor times the optimizer
// budget (at most 1), unless set; a rule's budget applies either way.
TEST(Policy, FirstMomentsGetABudgetOnTheStep) {
  const TensorInfo m = T("optimizer.state.0.exp_avg"), v = T("optimizer.state.0.exp_avg_sq");
  const TensorInfo sgd = T("optimizer.state.0.momentum_buffer");
  Policy p = Policy::Defaults();
  lossy::Budget b = p.BudgetFor("a.pt", FileFormat::kTorchZip, m);
  EXPECT_EQ(b.rel_l2, kDefaultOptimizerRelL2);  // coded as it is
  EXPECT_DOUBLE_EQ(b.step_rel_l2, kMomentumStepBudgetFactor * kDefaultOptimizerRelL2);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, v).step_rel_l2, 0.0);
  // SGD's momentum buffer is its own step: the same budget.
  EXPECT_DOUBLE_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, sgd).step_rel_l2,
                   kMomentumStepBudgetFactor * kDefaultOptimizerRelL2);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, T("model.exp_avg")).step_rel_l2, 0.0);
  EXPECT_EQ(Policy::Defaults(1e-2, 0.6).BudgetFor("a.pt", FileFormat::kTorchZip, m).step_rel_l2, 1.0);
  EXPECT_DOUBLE_EQ(Policy::Defaults(1e-2, 0.04).BudgetFor("a.pt", FileFormat::kTorchZip, m).step_rel_l2, 0.1);
  EXPECT_EQ(Policy::Defaults(0).BudgetFor("a.pt", FileFormat::kTorchZip, m).step_rel_l2, 0.0);
  p.SetMomentumStepBudget(0.3);
  EXPECT_EQ(p.BudgetFor("a.pt", FileFormat::kTorchZip, m).step_rel_l2, 0.3);
  Result<Policy> file = DefaultAndRule("momentum_step_rel_l2 = 0.4", "optimizer.state.1.exp_avg", "rel_l2 = 0.25");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->BudgetFor("a.pt", FileFormat::kTorchZip, m).step_rel_l2, 0.4);
  b = file->BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.1.exp_avg"));
  EXPECT_EQ(b.rel_l2, 0.25);
  EXPECT_EQ(b.step_rel_l2, 0.0);  // the rule's 0.25 in either space
  EXPECT_FALSE(Policy::FromToml("[defaults]\nmomentum_step_rel_l2 = -0.5\n").ok());
  EXPECT_FALSE(Policy::FromToml("[defaults]\nmomentum_step_rel_l2 = 0\n").ok());
}

TEST(Policy, TomlRulesComeFirstAndDefaultsCanChange) {
  Result<Policy> p = Policy::FromToml(R"(
[defaults]
rel_l2 = 0.02
optimizer_rel_l2 = 0.1

[[rule]]
files = "*.safetensors"
mode = "lossless"

[[rule]]
files = "ckpt/*.pt"
tensors = "*.bias"
mode = "lossy"
rel_l2 = 0.001
max_abs = 0.5
)");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->BudgetFor("dir/m.safetensors", FileFormat::kSafetensors, T("w")).rel_l2, 0.0);
  lossy::Budget b = p->BudgetFor("ckpt/x.pt", FileFormat::kTorchZip, T("layer.0.bias"));
  EXPECT_EQ(b.rel_l2, 0.001);
  EXPECT_EQ(b.max_abs, 0.5);
  EXPECT_EQ(p->BudgetFor("other/x.pt", FileFormat::kTorchZip, T("layer.0.bias")).rel_l2, 0.02);
  EXPECT_EQ(p->BudgetFor("x.pt", FileFormat::kTorchZip, T("optimizer.state.3.exp_avg")).rel_l2, 0.1);
  // Update denominators get the log mode with twice the optimizer budget, never an L2 budget.
  lossy::Budget d = p->BudgetFor("x.pt", FileFormat::kTorchZip, T("optimizer.state.3.exp_avg_sq"));
  EXPECT_EQ(d.rel_l2, 0.0);
  EXPECT_DOUBLE_EQ(d.max_rel, kDenominatorBudgetFactor * 0.1);
  // Integer tensors stay lossless even when a rule says lossy.
  EXPECT_EQ(p->BudgetFor("ckpt/x.pt", FileFormat::kTorchZip, T("a.bias", DType::kI32)).rel_l2, 0.0);
}

TEST(Policy, OptimizerDenominatorsGetTheLogModeUnlessARuleNamesThem) {
  Policy p = Policy::Defaults(1e-2, 5e-2);
  for (const char* name : {"optimizer.state.0.exp_avg_sq", "optimizer.state.7.max_exp_avg_sq",
                           "optimizer.state.1.square_avg", "optimizer.state.2.sum", "state.4.exp_inf"}) {
    lossy::Budget b = p.BudgetFor("a.pt", FileFormat::kTorchZip, T(name));
    EXPECT_EQ(b.rel_l2, 0.0) << name;
    EXPECT_EQ(b.max_abs, 0.0) << name;
    EXPECT_DOUBLE_EQ(b.max_rel, kDenominatorBudgetFactor * 5e-2) << name;
  }
  // Defaults with a zero optimizer budget: lossless.
  EXPECT_FALSE(Policy::Defaults(1e-2, 0).BudgetFor("a.pt", FileFormat::kTorchZip, T("state.0.exp_avg_sq")).lossy());
  // A rule can force lossless, or set the bound.
  Result<Policy> off = Policy::FromToml("[[rule]]\ntensors = \"*.exp_avg_sq\"\nmode = \"lossless\"\n");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.0.exp_avg_sq")).lossy());
  Result<Policy> rel = Policy::FromToml("[[rule]]\ntensors = \"*.exp_avg_sq\"\nmode = \"lossy\"\nmax_rel = 0.002\n");
  ASSERT_TRUE(rel.ok()) << rel.status().ToString();
  EXPECT_EQ(rel->BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.0.exp_avg_sq")).max_rel, 0.002);
  EXPECT_FALSE(
      Policy::FromToml("[[rule]]\ntensors = \"*\"\nmode = \"lossy\"\nmax_rel = 0.01\nrel_l2 = 0.01\n").ok());
  EXPECT_FALSE(IsOptimizerDenominator("model.exp_avg_sq"));  // not optimizer state
  EXPECT_FALSE(IsOptimizerDenominator("optimizer.state.0.exp_avg"));
  // An explicit rule is the user's choice.
  Result<Policy> r = Policy::FromToml("[[rule]]\ntensors = \"*.exp_avg_sq\"\nmode = \"lossy\"\nrel_l2 = 0.01\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->BudgetFor("a.pt", FileFormat::kTorchZip, T("optimizer.state.0.exp_avg_sq")).rel_l2, 0.01);
}

TEST(Policy, OptimizerStateNestedUnderFrameworkKeys) {
  // Lightning and DeepSpeed put the optimizer's state dict under their own
  // keys; its second moments still get the per-element bound.
  for (const char* name : {"optimizer_states.0.state.3.exp_avg_sq",
                           "optimizer_state_dict.base_optimizer_state.0.exp_avg_sq",
                           "optimizer_state_dict.state.12.exp_avg_sq", "optimizer.state.0.exp_avg_sq"}) {
    EXPECT_TRUE(IsOptimizerState(name)) << name;
    EXPECT_TRUE(IsOptimizerDenominator(name)) << name;
    EXPECT_GT(Policy::Defaults().BudgetFor("a.ckpt", FileFormat::kTorchZip, T(name)).max_rel, 0.0) << name;
  }
  EXPECT_TRUE(IsFirstMoment("optimizer_states.0.state.3.exp_avg"));
  EXPECT_TRUE(IsOptimizerState("optimizer_state_dict.single_partition_of_fp32_groups.state.0.momentum_buffer"));
  // Model tensors that merely look alike are not optimizer state.
  for (const char* name : {"state_dict.layer.weight", "model.state.exp_avg_sq", "exp_avg_sq", "module.optim_proj.weight",
                           "state_dict.optimizer_head.bias"}) {
    EXPECT_FALSE(IsOptimizerState(name)) << name;
  }
}

TEST(Policy, DefaultsModeLosslessKeepsOnlyRules) {
  Result<Policy> p = Policy::FromToml("[defaults]\nmode = \"lossless\"\n[[rule]]\ntensors = \"big.*\"\nmode = \"lossy\"\nrel_l2 = 0.05\n");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->BudgetFor("x.pt", FileFormat::kTorchZip, T("big.w")).rel_l2, 0.05);
  EXPECT_EQ(p->BudgetFor("x.pt", FileFormat::kTorchZip, T("small.w")).rel_l2, 0.0);
}

TEST(Policy, BadFilesAreRejectedWithALine) {
  for (const char* text : {
           "[defaults]\nrel_l2 = -1\n",
           "[defaults]\nbudget = 0.1\n",
           "[[rule]]\nfiles = \"*\"\n",                      // no mode
           "[[rule]]\nmode = \"lossy\"\n",                   // no budget
           "[[rule]]\nmode = \"fast\"\n",
           "[[rule]]\nmode = \"lossy\"\nrel_l2 = \"x\"\n",
           "unknown = 1\n",
           "[defaults\n",
       }) {
    Result<Policy> p = Policy::FromToml(text, "p.toml");
    EXPECT_FALSE(p.ok()) << text;
    if (!p.ok()) {
      EXPECT_NE(p.status().message().find("p.toml:"), std::string::npos) << p.status().ToString();
    }
  }
}

}  // namespace
}  // namespace ckptfs::policy
