#include "native/optimizer_math.h"

#include <cmath>

namespace graphmod {

bool ParseOptimizer(const std::string& name, OptimizerKind* out) {
  if (name == "sgd") *out = OptimizerKind::kSgd;
  else if (name == "adagrad") *out = OptimizerKind::kAdagrad;
  else if (name == "momentum") *out = OptimizerKind::kMomentum;
  else if (name == "adam") *out = OptimizerKind::kAdam;
  else if (name == "ftrl") *out = OptimizerKind::kFtrl;
  else if (name == "rmsprop") *out = OptimizerKind::kRmsProp;
  else return false;
  return true;
}

int SlotsNeeded(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return 0;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kMomentum: return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl:
    case OptimizerKind::kRmsProp: return 2;
  }
  return 0;
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
