// Tests of native/cold_index.h: random upserts, finds and erases against
// std::unordered_map, and growth then shrink after mass erases keeping every
// remaining key's fields.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

#include "native/cold_index.h"
#include "native/test_check.h"

using graphmod::ColdIndex;

namespace {

void TestColdIndex() {
  ColdIndex index;
  std::unordered_map<int64_t, uint32_t> model;
  std::mt19937_64 rng(2);
  CHECK(index.Find(5) == nullptr && !index.Erase(5, nullptr));
  const int64_t extremes[] = {INT64_MIN, INT64_MAX, 0, -1};
  auto key_of = [&](uint64_t r) {
    return r % 50 == 0 ? extremes[r / 50 % 4] : static_cast<int64_t>(r % 20000) - 10000;
  };
  for (int op = 0; op < 200000; ++op) {
    const int64_t key = key_of(rng());
    const uint64_t what = rng() % 10;
    if (what < 5) {
      bool added;
      ColdIndex::Slot* s = index.Upsert(key, &added);
      CHECK(added == (model.count(key) == 0));
      CHECK(s->key == key);
      s->segment = static_cast<uint32_t>(op % 1000);
      s->index = static_cast<uint32_t>(op);
      model[key] = static_cast<uint32_t>(op);
    } else if (what < 8 || op > 150000) {  // the last quarter mostly erases: shrinks
      ColdIndex::Slot old;
      const bool erased = index.Erase(key, &old);
      CHECK(erased == (model.count(key) == 1));
      if (erased) CHECK(old.key == key && old.index == model[key]);
      model.erase(key);
    } else {
      const ColdIndex::Slot* s = index.Find(key);
      CHECK((s != nullptr) == (model.count(key) == 1));
      if (s != nullptr) CHECK(s->index == model[key]);
    }
    CHECK(index.size() == model.size());
    CHECK(index.size() * 8 <= index.capacity() * 7);
  }
  size_t visited = 0;
  index.ForEach([&](const ColdIndex::Slot& s) {
    ++visited;
    CHECK(model.count(s.key) == 1 && model[s.key] == s.index);
  });
  CHECK(visited == model.size());
  CHECK(index.bytes() == index.capacity() * 32);
  std::printf("cold index: 32 B/slot, %zu slots for %zu keys\n", index.capacity(), model.size());
  // Erasing (nearly) everything shrinks it.
  const size_t big = index.capacity();
  for (auto& kv : model) index.Erase(kv.first, nullptr);
  CHECK(index.size() == 0 && index.capacity() < big && index.capacity() <= 64);
}

// Every field of key i's slot follows from i, so a slot moved by a rehash or
// a backward shift can be checked whole.
ColdIndex::Slot SlotOf(int64_t i) {
  ColdIndex::Slot s;
  s.key = i * 7919 - 100000000;  // negative and positive keys
  s.last_seen = i * 3 + 1;
  s.count = static_cast<uint32_t>(i % 1000) + 1;
  s.version = static_cast<uint32_t>(i) ^ 0x5A5Au;
  s.segment = static_cast<uint32_t>(i % 97) + 1;
  s.index = static_cast<uint32_t>(i);
  return s;
}

bool SameSlot(const ColdIndex::Slot& a, const ColdIndex::Slot& b) {
  return a.key == b.key && a.last_seen == b.last_seen && a.count == b.count &&
         a.version == b.version && a.segment == b.segment && a.index == b.index;
}

// Grows to 100k keys, erases 90% of them (the index shrinks on the way down),
// then every remaining key is still found with all its fields.
void TestGrowThenShrink() {
  const int64_t n = 100000;
  ColdIndex index;
  size_t peak = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ColdIndex::Slot want = SlotOf(i);
    bool added;
    ColdIndex::Slot* s = index.Upsert(want.key, &added);
    CHECK(added && s->key == want.key);
    *s = want;
    peak = std::max(peak, index.capacity());
  }
  CHECK(index.size() == static_cast<size_t>(n) && index.capacity() == peak);
  CHECK(peak * 7 >= static_cast<size_t>(n) * 8);  // grown past 7/8 load
  for (int64_t i = 0; i < n; ++i) {
    if (i % 10 == 0) continue;
    ColdIndex::Slot old;
    CHECK(index.Erase(SlotOf(i).key, &old));
    CHECK(SameSlot(old, SlotOf(i)));
  }
  const size_t left = static_cast<size_t>(n / 10);
  CHECK(index.size() == left);
  CHECK(index.capacity() < peak / 2);               // shrunk
  CHECK(index.capacity() <= 4 * index.size());      // not below 1/4 load
  CHECK(index.size() * 8 <= index.capacity() * 7);  // nor above 7/8
  for (int64_t i = 0; i < n; i += 10) {
    const ColdIndex::Slot* s = index.Find(SlotOf(i).key);
    CHECK(s != nullptr && SameSlot(*s, SlotOf(i)));
  }
  size_t visited = 0;
  index.ForEach([&](const ColdIndex::Slot& s) {
    ++visited;
    const int64_t i = static_cast<int64_t>(s.index);
    CHECK(i % 10 == 0 && SameSlot(s, SlotOf(i)));
  });
  CHECK(visited == left);
  // Erasing an absent key (erased above, or never there) returns false and
  // leaves the index and *old alone.
  ColdIndex::Slot old = SlotOf(7);
  for (int64_t key : {SlotOf(1).key, SlotOf(n - 1).key, SlotOf(n).key, int64_t{12345}}) {
    CHECK(!index.Erase(key, &old) && !index.Erase(key, nullptr));
    CHECK(index.Find(key) == nullptr);
  }
  CHECK(SameSlot(old, SlotOf(7)) && index.size() == left);
  // Upserting a remaining key finds it, fields intact.
  bool added;
  const ColdIndex::Slot* s = index.Upsert(SlotOf(50).key, &added);
  CHECK(!added && SameSlot(*s, SlotOf(50)) && index.size() == left);
}

}  // namespace

int main() {
  TestColdIndex();
  TestGrowThenShrink();
  return graphmod_test::TestExit("cold_index_test");
}
