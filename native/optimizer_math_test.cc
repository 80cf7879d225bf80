// Tests of native/optimizer_math.h: one step of each optimizer against the
// value worked out by hand from tf.compat.v1.train's formulas.
#include <cmath>
#include <vector>

#include "native/optimizer_math.h"
#include "native/test_check.h"

using graphmod::Optimizer;
using graphmod::OptimizerKind;

namespace {

bool Near(float a, double b) { return std::fabs(a - b) <= 1e-5 * (1 + std::fabs(b)); }

// One step on a 1-wide row starting at var with slot rows `slots`.
float Step(const Optimizer& o, float var, std::vector<float>* slots, float g) {
  graphmod::UpdateRow(o, &var, slots->data(), &g, 1);
  return var;
}

Optimizer Make(OptimizerKind kind, float lr) {
  Optimizer o;
  o.kind = kind;
  o.lr = lr;
  return o;
}

void TestParseAndSlots() {
  OptimizerKind k;
  CHECK(graphmod::ParseOptimizer("adam", &k) && k == OptimizerKind::kAdam);
  CHECK(!graphmod::ParseOptimizer("lamb", &k));
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kSgd) == 0);
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kAdagrad) == 1);
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kMomentum) == 1);
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kAdam) == 2);
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kFtrl) == 2);
  CHECK(graphmod::SlotsNeeded(OptimizerKind::kRmsProp) == 2);
  // Every kind has one spec, found by its name; names are what the ops take.
  const auto& specs = graphmod::OptimizerSpecs();
  CHECK(specs.size() == 6);
  for (const auto& s : specs) {
    CHECK(graphmod::ParseOptimizer(s.name, &k) && k == s.kind);
    CHECK(&graphmod::SpecOf(s.kind) == &s);
    CHECK(!s.hparams.empty() && std::string(s.hparams[0].first) == "lr");
  }
  CHECK(graphmod::OptimizerNames() == "sgd, adagrad, momentum, adam, ftrl, rmsprop");
}

void TestSgdAdagradMomentum() {
  std::vector<float> none;
  CHECK(Near(Step(Make(OptimizerKind::kSgd, 0.1f), 1.f, &none, 0.5f), 0.95));
  std::vector<float> acc = {0.1f};
  CHECK(Near(Step(Make(OptimizerKind::kAdagrad, 0.1f), 1.f, &acc, 0.5f),
             1 - 0.1 * 0.5 / std::sqrt(0.35)));
  CHECK(Near(acc[0], 0.35));
  Optimizer m = Make(OptimizerKind::kMomentum, 0.1f);
  m.momentum = 0.9f;
  std::vector<float> mom = {0.f};
  CHECK(Near(Step(m, 1.f, &mom, 0.5f), 0.95));
  CHECK(Near(mom[0], 0.5));
  m.nesterov = true;  // lr*g + lr*momentum*acc, with acc = 0.9*0.5 + 0.5
  CHECK(Near(Step(m, 1.f, &mom, 0.5f), 1 - (0.05 + 0.1 * 0.9 * 0.95)));
}

void TestAdamFirstStepMovesByLr() {
  Optimizer o = Make(OptimizerKind::kAdam, 0.1f);
  o.epsilon = 1e-8f;
  o.beta1_power = o.beta1;  // step 1
  o.beta2_power = o.beta2;
  std::vector<float> slots = {0.f, 0.f};
  // Bias correction makes Adam's first step lr * sign(g).
  CHECK(Near(Step(o, 1.f, &slots, 0.5f), 0.9));
  CHECK(Near(slots[0], 0.05) && Near(slots[1], 0.001 * 0.25));
}

void TestFtrl() {
  Optimizer o = Make(OptimizerKind::kFtrl, 0.1f);
  std::vector<float> slots = {0.1f, 0.f};  // accumulator, linear
  CHECK(Near(Step(o, 0.f, &slots, 0.5f), -0.5 * 0.1 / std::sqrt(0.35)));
  CHECK(Near(slots[0], 0.35) && Near(slots[1], 0.5));
  o.l1 = 1.f;  // |linear| <= l1: the weight is exactly zero
  slots = {0.1f, 0.f};
  CHECK(Step(o, 0.f, &slots, 0.5f) == 0.f);
  // lr_power -1: powers are the accumulators themselves (the std::pow path).
  o.l1 = 0.f;
  o.lr_power = -1.f;
  slots = {0.1f, 0.f};
  CHECK(Near(Step(o, 1.f, &slots, 0.5f), 2.0 / 3.5));
}

void TestRmsProp() {
  Optimizer o = Make(OptimizerKind::kRmsProp, 0.1f);
  o.rho = 0.9f;
  std::vector<float> slots = {0.f, 0.f};
  CHECK(Near(Step(o, 1.f, &slots, 0.5f), 1 - 0.1 * 0.5 / std::sqrt(0.025)));
}

void TestRowsAreIndependentPerElement() {
  // A d-wide update is d 1-wide updates: slots are laid out row by row.
  Optimizer o = Make(OptimizerKind::kAdam, 0.01f);
  o.beta1_power = 0.81f;
  o.beta2_power = 0.998f;
  o.epsilon = 1e-7f;
  std::vector<float> var = {1.f, -2.f, 3.f}, g = {0.3f, -0.1f, 2.f};
  std::vector<float> slots = {0.1f, 0.2f, 0.3f, 0.01f, 0.02f, 0.03f};
  std::vector<float> wide_slots = slots, wide = var;
  graphmod::UpdateRow(o, wide.data(), wide_slots.data(), g.data(), 3);
  for (int j = 0; j < 3; ++j) {
    std::vector<float> s = {slots[j], slots[3 + j]};
    CHECK(Near(wide[j], Step(o, var[j], &s, g[j])));
    CHECK(Near(wide_slots[j], s[0]) && Near(wide_slots[3 + j], s[1]));
  }
}

}  // namespace

int main() {
  TestParseAndSlots();
  TestSgdAdagradMomentum();
  TestAdamFirstStepMovesByLr();
  TestFtrl();
  TestRmsProp();
  TestRowsAreIndependentPerElement();
  return graphmod_test::TestExit("optimizer_math_test");
}
