// The CHECK macro of the native C++ tests: a failed check is reported with
// its line and counted (tests go on, so one run shows every failure), and
// the test's main returns TestExit(name). Counted atomically: checks may fail
// on several threads at once.
#ifndef GRAPHMOD_NATIVE_TEST_CHECK_H_
#define GRAPHMOD_NATIVE_TEST_CHECK_H_

#include <atomic>
#include <cstdio>

namespace graphmod_test {
inline std::atomic<int> failures{0};

inline int TestExit(const char* name) {
  if (failures != 0) {
    std::fprintf(stderr, "%s: %d check(s) failed\n", name, failures.load());
    return 1;
  }
  std::printf("%s: all checks passed\n", name);
  return 0;
}
}  // namespace graphmod_test

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++graphmod_test::failures;                                                    \
    }                                                                               \
  } while (0)

#endif  // GRAPHMOD_NATIVE_TEST_CHECK_H_
