// Split of insert cost: time in Grow (rebuild/split) vs the rest.
#include <chrono>
#include <cstdio>
#include "compact_index.h"
using namespace graphmod;
static uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
int main() {
  CompactIndex ix;
  const size_t n = 4000000;
  double grow = 0, rest = 0;
  size_t grows = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i + 8 < n) ix.Prefetch(int64_t(SplitMix(i + 8)));
    const size_t before = ix.slots();
    auto t0 = std::chrono::steady_clock::now();
    ix.Upsert(int64_t(SplitMix(i)), uint32_t(i), nullptr);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ix.slots() != before) grow += dt, ++grows; else rest += dt;
  }
  std::printf("%zu grows: %.0f ns/key in grows, %.0f ns/key in plain inserts\n", grows,
              grow * 1e9 / n, rest * 1e9 / n);
}
