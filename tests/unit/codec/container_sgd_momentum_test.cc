// SGD's momentum buffer is its own step (the update is -lr x buffer): with
// first moments on their step (EncodeOptions::momentum_step_space, the
// default of the mount and `ckptfs encode`) the default policy's momentum
// budget applies to it as it is; without, the optimizer budget. Adam's
// state and the weights keep theirs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/policy/policy.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

constexpr size_t kElements = 24000;

// A checkpoint of one SGD parameter and one Adam parameter.
FileBuilder MixedOptimizers() {
  FileBuilder f;
  f.Verbatim(RandomBytes(40, 1))
      .Tensor("model.a.weight", DType::kF32, {120, 200}, NormalF32(kElements, 1))
      .Tensor("model.b.weight", DType::kF32, {120, 200}, NormalF32(kElements, 2))
      .Tensor("optimizer.state.0.momentum_buffer", DType::kF32, {120, 200}, NormalF32(kElements, 3, 1e-3f))
      .Tensor("optimizer.state.1.exp_avg", DType::kF32, {120, 200}, NormalF32(kElements, 4, 1e-3f));
  std::vector<float> v(kElements);
  std::vector<std::byte> square = NormalF32(kElements, 5, 1e-3f);
  for (size_t i = 0; i < kElements; ++i) v[i] = F32At(square, i) * F32At(square, i);
  f.Tensor("optimizer.state.1.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(v)).Verbatim(RandomBytes(24, 2));
  return f;
}

// Relative L2 error of tensor `t` of `f` as decoded from `blob`.
double TensorError(const FileBuilder& f, const std::vector<std::byte>& blob, size_t t) {
  Result<std::shared_ptr<const BlobReader>> reader = OpenBytes(blob);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return INFINITY;
  const Segment& s = f.layout.segments[t + 1];  // after the leading verbatim segment
  std::vector<std::byte> got(s.length);
  EXPECT_TRUE((*reader)->ReadAt(s.offset, got).ok());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < s.length / 4; ++i) {
    const double x = F32At(ByteSpan(f.bytes).subspan(s.offset), i);
    const double d = F32At(got, i) - x;
    err2 += d * d;
    ref2 += x * x;
  }
  return std::sqrt(err2 / ref2);
}

TEST(SgdMomentum, TheDefaultPolicyGivesItTheMomentumBudget) {
  const policy::Policy policy = policy::Policy::Defaults();
  const lossy::Budget b = policy.BudgetFor("ckpt.pt", FileFormat::kTorchZip,
                                           TensorInfo{"optimizer.state.0.momentum_buffer", DType::kF32, {4}, false});
  EXPECT_EQ(b.rel_l2, policy::kDefaultOptimizerRelL2);
  EXPECT_DOUBLE_EQ(b.step_rel_l2, policy::kMomentumStepBudgetFactor * policy::kDefaultOptimizerRelL2);
}

TEST(SgdMomentum, OnItsStepItGetsTheMomentumBudgetAsItIs) {
  const FileBuilder f = MixedOptimizers();
  const policy::Policy policy = policy::Policy::Defaults();
  EncodeOptions on = DefaultLossy(policy, true);
  on.momentum_step_space = true;
  EncodeOptions off = on;
  off.momentum_step_space = false;
  const std::vector<std::byte> step = Encode(f.bytes, f.layout, on);
  const std::vector<std::byte> plain = Encode(f.bytes, f.layout, off);
  const double budget = policy.momentum_step_rel_l2();
  ASSERT_GT(budget, policy.optimizer_rel_l2());
  // The buffer (tensor 2): within the momentum budget (times the unbiasing
  // gain's allowance, a first moment's levels), and looser than the
  // optimizer budget it gets without step space.
  const double on_error = TensorError(f, step, 2), off_error = TensorError(f, plain, 2);
  EXPECT_LE(on_error, budget * lossy::kUnbiasAllowance * 1.001);
  EXPECT_GT(on_error, policy.optimizer_rel_l2()) << on_error;
  EXPECT_LE(off_error, policy.optimizer_rel_l2() * lossy::kUnbiasAllowance * 1.001);
  EXPECT_LT(step.size(), plain.size());
  // The weights are coded alike either way (a key frame: no prediction).
  for (size_t t : {size_t{0}, size_t{1}})
    EXPECT_DOUBLE_EQ(TensorError(f, step, t), TensorError(f, plain, t)) << t;
  // Adam's first moment: on m itself within the optimizer budget only
  // without step space (in step space its budget is on m / sqrt(v)).
  EXPECT_LE(TensorError(f, plain, 3), policy.optimizer_rel_l2() * 1.001);
}

// A rule that names the buffer keeps its own budget in either space.
TEST(SgdMomentum, ARuleKeepsItsBudget) {
  const FileBuilder f = MixedOptimizers();
  Result<policy::Policy> policy = policy::Policy::FromToml(
      "[[rule]]\ntensors = \"optimizer.state.*.momentum_buffer\"\nmode = \"lossy\"\nrel_l2 = 0.05\n");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  EncodeOptions on = DefaultLossy(*policy, true);
  on.momentum_step_space = true;
  EXPECT_LE(TensorError(f, Encode(f.bytes, f.layout, on), 2), 0.05 * 1.001);
}

}  // namespace
}  // namespace ckptfs
