// Tests of native/admission.h: exact pending counts, the count-min sketch's
// guarantees (never under, rarely far over), and which counter a shard uses.
#include <cstdint>
#include <limits>
#include <map>
#include <random>

#include "native/admission.h"
#include "native/bits.h"
#include "native/test_check.h"

using graphmod::AdmissionCounter;
using graphmod::CountMinSketch;
using graphmod::ExactAdmission;
using graphmod::HashKey;
using graphmod::PendingCount;

namespace {

void TestExactCounts() {
  ExactAdmission a;
  PendingCount& p = a.Entry(5, 10);
  CHECK(p.count == 0 && p.last_seen == 10);
  CHECK(ExactAdmission::Sight(&p, 12, 3) == 1);
  CHECK(ExactAdmission::Sight(&p, 11, 4) == 2);  // out of time order: last_seen stays 12
  CHECK(p.last_seen == 12 && p.version == 4);
  CHECK(&a.Entry(5, 99) == &p && p.last_seen == 12);  // an existing entry is kept
  p.count = std::numeric_limits<uint32_t>::max();
  CHECK(ExactAdmission::Sight(&p, 12, 4) == std::numeric_limits<uint32_t>::max());
  CHECK(a.size() == 1 && a.Bytes() > 0);
  CHECK(a.Erase(5) && !a.Erase(5) && a.empty());
}

void TestExactDropSeenBefore() {
  ExactAdmission a;
  for (int64_t k = 0; k < 10; ++k) a.Set(k, PendingCount{1, k, 0});
  std::map<int64_t, int> dropped;
  a.DropSeenBefore(4, [&](int64_t key) { ++dropped[key]; });
  CHECK(dropped.size() == 4);
  for (int64_t k = 0; k < 4; ++k) CHECK(dropped[k] == 1);
  CHECK(a.size() == 6);
  for (const auto& [key, p] : a.entries()) CHECK(key >= 4 && p.last_seen == key);
  a.Clear();
  CHECK(a.empty() && a.Bytes() == 0);
}

void TestSketchNeverUnderestimates() {
  CountMinSketch s;
  CHECK(!s.enabled());
  s.Resize(512);
  CHECK(s.enabled() && s.size() == 4 * 512 && s.Bytes() == 4 * 512 * 4);
  // Zipf-like stream over 5000 keys in 2048 counters: every estimate is at
  // least the true count, and the hot keys' are close to it.
  std::mt19937_64 rng(1);
  std::map<int64_t, uint64_t> truth;
  for (int i = 0; i < 40000; ++i) {
    const int64_t key = static_cast<int64_t>(5000.0 / (1 + (rng() % 5000))) + (rng() % 3) * 7919;
    ++truth[key];
    CHECK(s.Add(HashKey(key)) >= truth[key]);
  }
  for (const auto& [key, count] : truth) CHECK(s.Estimate(HashKey(key)) >= count);
  int close = 0, hot = 0;
  for (const auto& [key, count] : truth)
    if (count >= 100) {
      ++hot;
      close += s.Estimate(HashKey(key)) <= count + count / 5;
    }
  CHECK(hot > 0 && close == hot);
}

void TestSketchAddReturnsOneMoreThanEstimate() {
  CountMinSketch s;
  s.Resize(64);
  for (int i = 0; i < 10; ++i) {
    const uint64_t before = s.Estimate(HashKey(3));
    CHECK(s.Add(HashKey(3)) == before + 1);
  }
}

void TestSketchHalvesAndClears() {
  CountMinSketch s;
  s.Resize(64);
  for (int i = 0; i < 9; ++i) s.Add(HashKey(1));
  s.Halve();
  CHECK(s.Estimate(HashKey(1)) == 4);
  s.Clear();
  CHECK(s.Estimate(HashKey(1)) == 0 && s.size() == 4 * 64);
}

void TestCounterUsesSketchWhenItHasOne() {
  AdmissionCounter exact;
  PendingCount* entry = nullptr;
  CHECK(exact.Sight(9, HashKey(9), 5, 2, &entry) == 1);
  CHECK(entry != nullptr && exact.Sight(9, HashKey(9), 6, 2, &entry) == 2);
  CHECK(exact.exact.size() == 1 && entry->last_seen == 6);

  AdmissionCounter sketched;
  sketched.sketch.Resize(128);
  entry = nullptr;
  CHECK(sketched.Sight(9, HashKey(9), 5, 2, &entry) == 1);
  CHECK(sketched.Sight(9, HashKey(9), 5, 2, &entry) == 2);
  CHECK(entry == nullptr && sketched.exact.empty());  // nothing per key
  CHECK(sketched.Bytes() == sketched.sketch.Bytes());
}

}  // namespace

int main() {
  TestExactCounts();
  TestExactDropSeenBefore();
  TestSketchNeverUnderestimates();
  TestSketchAddReturnsOneMoreThanEstimate();
  TestSketchHalvesAndClears();
  TestCounterUsesSketchWhenItHasOne();
  return graphmod_test::TestExit("admission_test");
}
