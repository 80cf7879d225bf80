// The initial values of a new row: a pure function of (key, seed), so every
// process, in any insertion order, gives a key the same row (restores,
// multi-worker training and re-created rows agree).
#ifndef GRAPHMOD_NATIVE_INITIALIZER_H_
#define GRAPHMOD_NATIVE_INITIALIZER_H_

#include <cstdint>
#include <string>

namespace graphmod {

enum class Initializer { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

// Parses "zeros", "constant", "uniform", "normal", "truncated_normal".
bool ParseInitializer(const std::string& name, Initializer* out);

struct InitializerSpec {
  Initializer kind = Initializer::kTruncatedNormal;
  float a = 0.f;     // constant value | uniform low  | normal mean
  float b = 0.05f;   // (unused)       | uniform high | normal stddev
  uint64_t seed = 0;
};

// Writes the d initial values of `key` to out.
void InitialValues(const InitializerSpec& spec, int64_t key, float* out, int d);

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_INITIALIZER_H_
