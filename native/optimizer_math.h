// The sparse optimizers' update of one row, with the formulas of
// tf.compat.v1.train's optimizers (so a table trains as the dense variable
// it replaces would), and what each keeps per key.
#ifndef GRAPHMOD_NATIVE_OPTIMIZER_MATH_H_
#define GRAPHMOD_NATIVE_OPTIMIZER_MATH_H_

#include <string>
#include <utility>
#include <vector>

namespace graphmod {

enum class OptimizerKind { kSgd, kAdagrad, kMomentum, kAdam, kFtrl, kRmsProp };

struct Optimizer;

// Each optimizer as the ops name it, the slot rows it keeps per key and its
// hyper-parameters in the order of the ops' `hparams` input: the C++ side of
// graphmod/optimizers.py's SPECS (tests/test_optimizers.py checks both agree).
struct OptimizerSpec {
  const char* name;
  OptimizerKind kind;
  int slots;
  std::vector<std::pair<const char*, float Optimizer::*>> hparams;
};
const std::vector<OptimizerSpec>& OptimizerSpecs();
const OptimizerSpec& SpecOf(OptimizerKind kind);

// Parses an OptimizerSpec's name.
bool ParseOptimizer(const std::string& name, OptimizerKind* out);
// "sgd, adagrad, ...": the names ParseOptimizer knows, for error messages.
std::string OptimizerNames();
// Slot rows the optimizer keeps per key.
inline int SlotsNeeded(OptimizerKind kind) { return SpecOf(kind).slots; }

// Hyper-parameters of one sparse update; each optimizer reads its own fields.
struct Optimizer {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.f;
  float epsilon = 0.f;       // adagrad (keras style, 0 = tf.compat.v1), adam, rmsprop
  float momentum = 0.f;      // momentum, rmsprop
  bool nesterov = false;     // momentum
  float beta1 = 0.9f, beta2 = 0.999f;  // adam
  float beta1_power = 1.f, beta2_power = 1.f;  // adam: beta^t of this step
  float l1 = 0.f, l2 = 0.f, l2_shrinkage = 0.f, lr_power = -0.5f;  // ftrl
  float rho = 0.9f;          // rmsprop decay
};

// One optimizer step on one row of d values: var is the row, slots its
// SlotsNeeded(kind) slot rows of d values each (back to back), g the row's
// summed gradient.
void UpdateRow(const Optimizer& o, float* var, float* slots, const float* g, int d);

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_OPTIMIZER_MATH_H_
