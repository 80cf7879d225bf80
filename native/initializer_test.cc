// Tests of native/initializer.h: rows depend on (key, seed) only, and each
// distribution has the range and moments it promises.
#include <cmath>
#include <vector>

#include "native/initializer.h"
#include "native/test_check.h"

using graphmod::InitializerSpec;
using graphmod::Initializer;

namespace {

std::vector<float> Row(const InitializerSpec& spec, int64_t key, int d) {
  std::vector<float> v(d);
  graphmod::InitialValues(spec, key, v.data(), d);
  return v;
}

void TestParse() {
  Initializer k;
  CHECK(graphmod::ParseInitializer("truncated_normal", &k) && k == Initializer::kTruncatedNormal);
  CHECK(graphmod::ParseInitializer("zeros", &k) && k == Initializer::kZeros);
  CHECK(!graphmod::ParseInitializer("glorot", &k));
}

void TestDeterministicPerKeyAndSeed() {
  InitializerSpec s{Initializer::kNormal, 0.f, 1.f, 7};
  CHECK(Row(s, 5, 32) == Row(s, 5, 32));
  CHECK(Row(s, 5, 32) != Row(s, 6, 32));
  InitializerSpec other = s;
  other.seed = 8;
  CHECK(Row(s, 5, 32) != Row(other, 5, 32));
  // A shorter row is a prefix of a longer one: the stream does not depend on d.
  const std::vector<float> long_row = Row(s, 9, 16), short_row = Row(s, 9, 8);
  CHECK(std::vector<float>(long_row.begin(), long_row.begin() + 8) == short_row);
}

void TestConstantAndZeros() {
  for (float v : Row({Initializer::kConstant, 2.5f, 0.f, 0}, 1, 9)) CHECK(v == 2.5f);
  for (float v : Row({Initializer::kZeros, 2.5f, 0.f, 0}, 1, 9)) CHECK(v == 0.f);
}

// Mean and standard deviation over many keys' rows.
void Moments(const InitializerSpec& s, double* mean, double* stddev, float* lo, float* hi) {
  double sum = 0, sq = 0;
  int n = 0;
  *lo = 1e30f;
  *hi = -1e30f;
  for (int64_t key = 0; key < 4000; ++key)
    for (float v : Row(s, key, 16)) {
      sum += v;
      sq += double(v) * v;
      *lo = std::min(*lo, v);
      *hi = std::max(*hi, v);
      ++n;
    }
  *mean = sum / n;
  *stddev = std::sqrt(sq / n - *mean * *mean);
}

void TestDistributions() {
  double mean, sd;
  float lo, hi;
  Moments({Initializer::kUniform, -1.f, 3.f, 1}, &mean, &sd, &lo, &hi);
  CHECK(lo >= -1.f && hi < 3.f);
  CHECK(std::fabs(mean - 1.0) < 0.03);
  Moments({Initializer::kNormal, 1.f, 2.f, 1}, &mean, &sd, &lo, &hi);
  CHECK(std::fabs(mean - 1.0) < 0.05 && std::fabs(sd - 2.0) < 0.05);
  CHECK(lo < 1.f - 2 * 3.f && hi > 1.f + 2 * 3.f);  // tails beyond 3 sigma exist
  // Truncated at two standard deviations; its stddev is 0.88 of the scale.
  Moments({Initializer::kTruncatedNormal, 0.f, 1.f, 1}, &mean, &sd, &lo, &hi);
  CHECK(lo >= -2.f && hi <= 2.f);
  CHECK(std::fabs(mean) < 0.03 && std::fabs(sd - 0.88) < 0.03);
}

}  // namespace

int main() {
  TestParse();
  TestDeterministicPerKeyAndSeed();
  TestConstantAndZeros();
  TestDistributions();
  return graphmod_test::TestExit("initializer_test");
}
