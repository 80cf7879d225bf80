// Tests of native/memory.h and native/bits.h: alignment promises the index
// and arena rely on, the hash's spread, and saturating counters.
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>

#include "native/bits.h"
#include "native/memory.h"
#include "native/test_check.h"

namespace {

void TestAlignment() {
  for (size_t bytes : {size_t{1}, size_t{64}, size_t{100}, size_t{4096}, size_t{1} << 20}) {
    graphmod::Memory m = graphmod::AllocateAligned(bytes);
    CHECK(m != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(m.get()) % 64 == 0);
    std::memset(m.get(), 1, bytes);  // ASan: the whole request is usable
  }
  // Huge allocations are rounded up to whole huge pages, so the last bytes
  // of the rounded size are ours too.
  const size_t big = graphmod::kHugePage + 1;
  graphmod::Memory m = graphmod::AllocateAligned(big);
  CHECK(reinterpret_cast<uintptr_t>(m.get()) % graphmod::kHugePage == 0);
  std::memset(m.get(), 2, 2 * graphmod::kHugePage);
}

void TestHashSpreadsSequentialKeys() {
  // Sequential keys must land in many distinct top-8-bit buckets (shards).
  std::set<uint64_t> buckets;
  for (int64_t k = 0; k < 4096; ++k) buckets.insert(graphmod::HashKey(k) >> 56);
  CHECK(buckets.size() == 256);
  CHECK(graphmod::HashKey(42) == graphmod::HashKey(42));
  CHECK(graphmod::Mix(1) != graphmod::Mix(2));
}

void TestAddCountSaturates() {
  const uint32_t top = std::numeric_limits<uint32_t>::max();
  CHECK(graphmod::AddCount(0, 5) == 5);
  CHECK(graphmod::AddCount(top - 1, 1) == top);
  CHECK(graphmod::AddCount(top - 1, 10) == top);
  CHECK(graphmod::AddCount(top, uint64_t{1} << 40) == top);
}

}  // namespace

int main() {
  TestAlignment();
  TestHashSpreadsSequentialKeys();
  TestAddCountSaturates();
  return graphmod_test::TestExit("memory_test");
}
