// The cold index (native/cold_index.h): random operations against
// std::unordered_map with the invariants checked along the way, with the
// default segments and with small ones (many splits); edge keys; injected
// allocation failures (an Upsert that throws changes nothing).
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <unordered_map>
#include <vector>

#include "native/cold_index.h"
#include "native/test_check.h"

using graphmod::ColdIndex;

static void Same(const ColdIndex& ix, const std::unordered_map<int64_t, uint32_t>& m) {
  CHECK(ix.size() == m.size());
  CHECK(ix.CheckInvariants());
  size_t n = 0;
  ix.ForEach([&](int64_t k, uint32_t r) {
    auto it = m.find(k);
    CHECK(it != m.end() && it->second == r);
    ++n;
  });
  CHECK(n == m.size());
  for (const auto& kv : m) {
    uint32_t r;
    CHECK(ix.Find(kv.first, &r) && r == kv.second);
  }
}

static void Random(uint64_t seed, size_t ops, int64_t key_space, size_t max_segment_bytes) {
  std::mt19937_64 rng(seed);
  ColdIndex ix(max_segment_bytes);
  std::unordered_map<int64_t, uint32_t> m;
  for (size_t i = 0; i < ops; ++i) {
    const int64_t key = static_cast<int64_t>(rng() % key_space) - key_space / 2;
    const uint32_t rec = static_cast<uint32_t>(rng() % ColdIndex::kEmpty);
    const int op = static_cast<int>(rng() % 10);
    // Phases: mostly growing, then mostly erasing (shrinks), then mixed.
    const bool grow = (i / (ops / 4)) % 2 == 0;
    if (op < (grow ? 7 : 2)) {
      uint32_t old = 0;
      const bool added = ix.Upsert(key, rec, &old);
      auto it = m.find(key);
      CHECK(added == (it == m.end()));
      if (!added) CHECK(old == it->second);
      m[key] = rec;
    } else if (op < 9) {
      uint32_t old = 0;
      const bool erased = ix.Erase(key, &old);
      auto it = m.find(key);
      CHECK(erased == (it != m.end()));
      if (erased) {
        CHECK(old == it->second);
        m.erase(it);
      }
    } else {
      auto it = m.find(key);
      const uint32_t from = it != m.end() && rng() % 2 ? it->second : rec;
      const bool moved = ix.Relocate(key, from, rec ^ 1);
      CHECK(moved == (it != m.end() && it->second == from));
      if (moved) it->second = rec ^ 1;
      uint32_t r;
      CHECK(ix.Find(key, &r) == (it != m.end()));
    }
    if (i % (ops / 16) == 0) Same(ix, m);
  }
  Same(ix, m);
  std::printf("random seed %llu: %zu keys, %zu segments, %.1f%% full, %.2f B/key\n",
              (unsigned long long)seed, ix.size(), ix.segments(),
              100.0 * ix.size() / std::max<size_t>(1, ix.slots()),
              ix.size() ? double(ix.bytes()) / ix.size() : 0.0);
  ix.Clear();
  CHECK(ix.size() == 0 && ix.bytes() == 0 && ix.CheckInvariants());
  CHECK(!ix.Find(1, nullptr));
}

static void Edges() {
  ColdIndex ix;
  CHECK(!ix.Find(0, nullptr) && !ix.Erase(0, nullptr) && !ix.Relocate(0, 1, 2));
  const int64_t keys[] = {0, -1, 1, std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()};
  for (int64_t k : keys) CHECK(ix.Upsert(k, 7, nullptr));
  for (int64_t k : keys) {
    uint32_t r;
    CHECK(ix.Find(k, &r) && r == 7);
  }
  CHECK(ix.Upsert(0, ColdIndex::kEmpty - 1, nullptr) == false);
  uint32_t r;
  CHECK(ix.Find(0, &r) && r == ColdIndex::kEmpty - 1);
  CHECK(ix.CheckInvariants());
  // Sequential keys (one shard's keys share hash bits; the index remixes).
  for (int64_t k = 1000; k < 400000; ++k) CHECK(ix.Upsert(k * 16, uint32_t(k), nullptr));
  CHECK(ix.CheckInvariants());
  for (int64_t k = 1000; k < 400000; ++k) CHECK(ix.Find(k * 16, &r) && r == uint32_t(k));
  CHECK(!ix.Find(17, nullptr));
  const double load = double(ix.size()) / ix.slots();
  std::printf("edges: %zu keys, %zu segments, load %.3f, %.2f B/key, peak %.2f B/key\n",
              ix.size(), ix.segments(), load, double(ix.bytes()) / ix.size(),
              double(ix.peak_bytes()) / ix.size());
  CHECK(load > 0.80 && load <= ColdIndex::kMaxLoad + 1e-9);
  // The point of the layout (issue 35): at most 16 bytes a key, and a
  // growth copies one segment, never the whole index.
  CHECK(double(ix.bytes()) / ix.size() <= 16.0);
  CHECK(double(ix.peak_bytes()) / ix.size() <= 16.0 + 2.0 * (8 << 20) / ix.size());
}

// Injected allocation failures: an Upsert that throws changes nothing.
static void Failures() {
  {  // the very first segment's allocation fails: still empty, bytes 0
    ColdIndex ix;
    ColdIndex::FailAllocationAfter(1);
    bool thrown = false;
    try {
      ix.Upsert(1, 1, nullptr);
    } catch (const std::bad_alloc&) {
      thrown = true;
    }
    ColdIndex::FailAllocationAfter(0);
    CHECK(thrown && ix.size() == 0 && ix.bytes() == 0 && ix.CheckInvariants());
    CHECK(ix.Upsert(1, 1, nullptr) && ix.Find(1, nullptr));
    ix.Clear();
    CHECK(ix.bytes() == 0 && ix.CheckInvariants());
  }
  std::mt19937_64 rng(9);
  ColdIndex ix;
  std::unordered_map<int64_t, uint32_t> m;
  size_t thrown = 0;
  for (int i = 0; i < 300000; ++i) {
    const int64_t key = static_cast<int64_t>(rng());
    // Armed until it fires (at the next growth): then that Upsert throws.
    if (rng() % 4 == 0) ColdIndex::FailAllocationAfter(1);
    try {
      CHECK(ix.Upsert(key, uint32_t(i), nullptr));
      m[key] = uint32_t(i);
    } catch (const std::bad_alloc&) {
      ++thrown;
      CHECK(!ix.Find(key, nullptr));
      CHECK(ix.size() == m.size());
    }
    if (i % 50000 == 0) Same(ix, m);
  }
  ColdIndex::FailAllocationAfter(0);
  // Erases with shrinks failing: still erased.
  size_t n = 0;
  for (auto it = m.begin(); it != m.end() && n < m.size() * 3 / 4; ++n) {
    if (rng() % 10 == 0) ColdIndex::FailAllocationAfter(1);
    CHECK(ix.Erase(it->first, nullptr));
    ColdIndex::FailAllocationAfter(0);
    it = m.erase(it);
  }
  Same(ix, m);
  std::printf("failures: %zu Upserts threw, index intact (%zu keys)\n", thrown, ix.size());
  CHECK(thrown > 0);
}

int main() {
  Edges();
  Failures();
  for (size_t segment_bytes : {size_t{8} << 20, size_t{64} << 10}) {
    Random(1, 400000, 100000, segment_bytes);
    Random(2, 1500000, 1 << 20, segment_bytes);
    Random(3, 200000, 50, segment_bytes);
  }
  return graphmod_test::TestExit("cold_index_test");
}
