#include "native/initializer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "native/bits.h"

namespace graphmod {
namespace {

// Uniform in (0, 1) from 24 random bits.
inline float Uniform01(uint64_t x) {
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Inverse of the standard normal CDF, by Acklam's rational approximation
// (relative error below 1.2e-9): one uniform per normal value, and only the
// 5% of draws in the tails pay for a log and a square root.
double NormalQuantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                             -2.759285104469687e+02, 1.383577518672690e+02,
                             -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                             -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                             -2.400758277161838e+00, -2.549732539343734e+00,
                             4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                             2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kTail = 0.02425;
  if (p < kTail || p > 1.0 - kTail) {
    const double q = std::sqrt(-2.0 * std::log(p < kTail ? p : 1.0 - p));
    const double x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
                     ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    return p < kTail ? x : -x;
  }
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
}

// The standard normal's quantiles at kQuantileBins + 1 evenly spaced points of
// (0, 1), or of [Phi(-2), Phi(2)] for the normal truncated at two standard
// deviations (TF's truncated_normal, here with no rejection loop). Linear
// interpolation between them is within 5e-6 of the exact inverse for the
// truncated normal and, outside the two exact outer bins, within 0.02 (at
// |z| > 3.2) for the normal.
constexpr int kQuantileBins = 4096;

std::vector<float> MakeQuantileTable(bool truncated) {
  constexpr double kLow = 0.022750131948179195;  // Phi(-2)
  std::vector<float> t(kQuantileBins + 1, 0.f);
  for (int i = 0; i <= kQuantileBins; ++i) {
    const double u = static_cast<double>(i) / kQuantileBins;
    if (truncated) {
      t[i] = static_cast<float>(NormalQuantile(kLow + (1.0 - 2.0 * kLow) * u));
    } else if (i != 0 && i != kQuantileBins) {  // the outer bins are inverted exactly
      t[i] = static_cast<float>(NormalQuantile(u));
    }
  }
  return t;
}

const float* QuantileTable(bool truncated) {
  static const std::vector<float> normal = MakeQuantileTable(false);
  static const std::vector<float> truncated_normal = MakeQuantileTable(true);
  return truncated ? truncated_normal.data() : normal.data();
}

}  // namespace

bool ParseInitializer(const std::string& name, Initializer* out) {
  if (name == "zeros") *out = Initializer::kZeros;
  else if (name == "constant") *out = Initializer::kConstant;
  else if (name == "uniform") *out = Initializer::kUniform;
  else if (name == "normal") *out = Initializer::kNormal;
  else if (name == "truncated_normal") *out = Initializer::kTruncatedNormal;
  else return false;
  return true;
}

void InitialValues(const InitializerSpec& spec, int64_t key, float* out, int d) {
  const float a = spec.a, b = spec.b;
  // A counter-based stream seeded by (key, seed): the row depends on nothing
  // else, so any process in any insertion order gives a key the same row.
  const uint64_t base = Mix(static_cast<uint64_t>(key) ^ Mix(spec.seed ^ 0x5851f42d4c957f2dULL));
  uint64_t counter = 0;
  auto next = [&]() { return Mix(base + 0x9e3779b97f4a7c15ULL * ++counter); };
  switch (spec.kind) {
    case Initializer::kZeros:
      std::fill(out, out + d, 0.f);
      return;
    case Initializer::kConstant:
      std::fill(out, out + d, a);
      return;
    case Initializer::kUniform:
      for (int j = 0; j < d; ++j) out[j] = a + (b - a) * Uniform01(next());
      return;
    case Initializer::kNormal:
    case Initializer::kTruncatedNormal: {
      const bool truncated = spec.kind == Initializer::kTruncatedNormal;
      const float* table = QuantileTable(truncated);
      uint64_t bits = 0;
      for (int j = 0; j < d; ++j) {
        // Two 32-bit draws per 64-bit mix: 12 bits pick the bin, 20 place the
        // value inside it.
        bits = (j & 1) ? bits << 32 : next();
        const uint32_t r = static_cast<uint32_t>(bits >> 32);
        const uint32_t bin = r >> 20;
        const float frac = (static_cast<float>(r & 0xFFFFF) + 0.5f) * (1.0f / 1048576.0f);
        float z;
        if (!truncated && (bin == 0 || bin == kQuantileBins - 1)) {
          // The normal's outermost bins reach to infinity: invert exactly.
          z = static_cast<float>(NormalQuantile((bin + static_cast<double>(frac)) / kQuantileBins));
        } else {
          z = table[bin] + frac * (table[bin + 1] - table[bin]);
        }
        out[j] = a + b * z;
      }
      return;
    }
  }
}

}  // namespace graphmod
