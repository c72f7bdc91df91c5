// A small Adam run (two weight matrices and a bias with their exp_avg and
// exp_avg_sq, per-element gradient scales over several octaves) written as
// a torch-like checkpoint, for the container tests of step prediction and
// step space.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "blob_test_util.h"
#include "codec/container/blob.h"
#include "codec/policy/policy.h"
#include "codec/tensor/lossy/schedule.h"

namespace ckptfs::testing {

struct AdamRun {
  static constexpr size_t kN = 24000;
  static constexpr size_t kBias = 300;
  std::mt19937 rng{7};
  std::normal_distribution<float> normal{0.0f, 1.0f};
  struct Param {
    std::vector<float> w, m, v, scale;
  };
  Param a, b, bias;
  int t = 0;

  AdamRun() {
    for (Param* p : {&a, &b, &bias}) {
      const size_t n = p == &bias ? kBias : kN;
      p->w.resize(n);
      p->m.assign(n, 0.0f);
      p->v.assign(n, 0.0f);
      p->scale.resize(n);
      for (size_t i = 0; i < n; ++i) {
        p->w[i] = 0.05f * normal(rng);
        p->scale[i] = std::exp(normal(rng));
      }
    }
    Steps(30);
  }
  void Steps(int k) {
    for (int s = 0; s < k; ++s) {
      ++t;
      for (Param* p : {&a, &b, &bias})
        for (size_t i = 0; i < p->w.size(); ++i) {
          const float g = p->scale[i] * (0.5f * p->w[i] + 0.2f * normal(rng));
          p->m[i] = 0.9f * p->m[i] + 0.1f * g;
          p->v[i] = 0.999f * p->v[i] + 0.001f * g * g;
          p->w[i] -= 1e-3f * p->m[i] / (std::sqrt(p->v[i]) + 1e-8f);
        }
    }
  }
  FileBuilder File() const {
    FileBuilder f;
    f.Verbatim(RandomBytes(40, 1))
        .Tensor("model.a.weight", DType::kF32, {120, 200}, F32Bytes(a.w))
        .Tensor("model.b.weight", DType::kF32, {120, 200}, F32Bytes(b.w))
        .Tensor("model.bias", DType::kF32, {kBias}, F32Bytes(bias.w))
        .Tensor("optimizer.state.0.exp_avg", DType::kF32, {120, 200}, F32Bytes(b.m))
        .Tensor("optimizer.state.0.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(b.v))
        .Tensor("optimizer.state.1.exp_avg", DType::kF32, {120, 200}, F32Bytes(a.m))
        .Tensor("optimizer.state.1.exp_avg_sq", DType::kF32, {120, 200}, F32Bytes(a.v))
        .Tensor("optimizer.state.2.exp_avg", DType::kF32, {kBias}, F32Bytes(bias.m))
        .Tensor("optimizer.state.2.exp_avg_sq", DType::kF32, {kBias}, F32Bytes(bias.v))
        .Verbatim(RandomBytes(24, 2));
    return f;
  }
};

inline EncodeOptions DefaultLossy(const policy::Policy& policy, bool predict) {
  EncodeOptions options;
  options.chunk_bytes = 32 << 10;  // several chunks per tensor
  options.lossy_budget = [&policy](FileFormat, const TensorInfo& t) {
    return policy.BudgetFor("ckpt.pt", FileFormat::kTorchZip, t);
  };
  options.budget_schedule = *lossy::ParseBudgetSchedule("dsq");
  options.step_prediction = predict;
  return options;
}

}  // namespace ckptfs::testing
