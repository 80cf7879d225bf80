#include "native/optimizer_math.h"

#include <cmath>

namespace graphmod {

const std::vector<OptimizerSpec>& OptimizerSpecs() {
  using O = Optimizer;
  static const std::vector<OptimizerSpec> specs = {
      {"sgd", OptimizerKind::kSgd, 0, {{"lr", &O::lr}}},
      {"adagrad", OptimizerKind::kAdagrad, 1, {{"lr", &O::lr}, {"epsilon", &O::epsilon}}},
      {"momentum", OptimizerKind::kMomentum, 1, {{"lr", &O::lr}, {"momentum", &O::momentum}}},
      {"adam", OptimizerKind::kAdam, 2,
       {{"lr", &O::lr}, {"beta1", &O::beta1}, {"beta2", &O::beta2}, {"epsilon", &O::epsilon},
        {"beta1_power", &O::beta1_power}, {"beta2_power", &O::beta2_power}}},
      {"ftrl", OptimizerKind::kFtrl, 2,
       {{"lr", &O::lr}, {"l1", &O::l1}, {"l2", &O::l2}, {"l2_shrinkage", &O::l2_shrinkage},
        {"lr_power", &O::lr_power}}},
      {"rmsprop", OptimizerKind::kRmsProp, 2,
       {{"lr", &O::lr}, {"rho", &O::rho}, {"momentum", &O::momentum},
        {"epsilon", &O::epsilon}}},
  };
  return specs;
}

const OptimizerSpec& SpecOf(OptimizerKind kind) {
  for (const auto& s : OptimizerSpecs())
    if (s.kind == kind) return s;
  return OptimizerSpecs().front();  // unreachable: every kind has a spec (tested)
}

bool ParseOptimizer(const std::string& name, OptimizerKind* out) {
  for (const auto& s : OptimizerSpecs()) {
    if (name == s.name) {
      *out = s.kind;
      return true;
    }
  }
  return false;
}

std::string OptimizerNames() {
  std::string names;
  for (const auto& s : OptimizerSpecs()) names += std::string(names.empty() ? "" : ", ") + s.name;
  return names;
}

void UpdateRow(const Optimizer& o, float* var, float* slots, const float* g, int d) {
  switch (o.kind) {
    case OptimizerKind::kSgd:
      for (int j = 0; j < d; ++j) var[j] -= o.lr * g[j];
      return;
    case OptimizerKind::kAdagrad: {
      float* acc = slots;
      for (int j = 0; j < d; ++j) {
        acc[j] += g[j] * g[j];
        var[j] -= o.lr * g[j] / (std::sqrt(acc[j]) + o.epsilon);
      }
      return;
    }
    case OptimizerKind::kMomentum: {
      float* acc = slots;
      for (int j = 0; j < d; ++j) {
        acc[j] = o.momentum * acc[j] + g[j];
        var[j] -= o.nesterov ? o.lr * g[j] + o.lr * o.momentum * acc[j] : o.lr * acc[j];
      }
      return;
    }
    case OptimizerKind::kAdam: {
      float* m = slots;
      float* v = slots + d;
      const float lr_t = o.lr * std::sqrt(1.f - o.beta2_power) / (1.f - o.beta1_power);
      for (int j = 0; j < d; ++j) {
        m[j] = o.beta1 * m[j] + (1.f - o.beta1) * g[j];
        v[j] = o.beta2 * v[j] + (1.f - o.beta2) * g[j] * g[j];
        var[j] -= lr_t * m[j] / (std::sqrt(v[j]) + o.epsilon);
      }
      return;
    }
    case OptimizerKind::kFtrl: {
      float* acc = slots;
      float* linear = slots + d;
      auto powered = [&](float x) {
        return o.lr_power == -0.5f ? std::sqrt(x) : std::pow(x, -o.lr_power);
      };
      for (int j = 0; j < d; ++j) {
        const float shrunk = g[j] + 2.f * o.l2_shrinkage * var[j];
        const float acc_new = acc[j] + g[j] * g[j];
        linear[j] += shrunk - (powered(acc_new) - powered(acc[j])) / o.lr * var[j];
        const float quadratic = powered(acc_new) / o.lr + 2.f * o.l2;
        var[j] = std::fabs(linear[j]) > o.l1
                     ? ((linear[j] > 0 ? o.l1 : -o.l1) - linear[j]) / quadratic
                     : 0.f;
        acc[j] = acc_new;
      }
      return;
    }
    case OptimizerKind::kRmsProp: {
      float* ms = slots;
      float* mom = slots + d;
      for (int j = 0; j < d; ++j) {
        ms[j] = o.rho * ms[j] + (1.f - o.rho) * g[j] * g[j];
        mom[j] = o.momentum * mom[j] + o.lr * g[j] / std::sqrt(ms[j] + o.epsilon);
        var[j] -= mom[j];
      }
      return;
    }
  }
}

}  // namespace graphmod
