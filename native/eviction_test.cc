// Tests of native/eviction.h: victim order under LRU and LFU, the rows a
// step spares, and the sampled search near a key's place (on each layout).
#include <cstdint>
#include <string>
#include <vector>

#include "native/bits.h"
#include "native/eviction.h"
#include "native/indexed_arena.h"
#include "native/row_buckets.h"
#include "native/test_check.h"

using graphmod::EvictionStrategy;
using graphmod::WhenFull;
using graphmod::HashKey;
using graphmod::RecordHeader;

namespace {

RecordHeader Row(int64_t last_seen, uint32_t count, uint32_t version = 0) {
  return RecordHeader{0, last_seen, count, version};
}

const EvictionStrategy& kLru = graphmod::LeastRecentlyUsed();
const EvictionStrategy& kLfu = graphmod::LeastFrequentlyUsed();

void TestParse() {
  WhenFull w = WhenFull::Refuse();
  CHECK(WhenFull::Parse("lfu", &w) && w.evict == &kLfu && std::string(w.name()) == "lfu");
  CHECK(WhenFull::Parse("lru", &w) && w.evict == &kLru);
  CHECK(WhenFull::Parse("refuse", &w) && w.evict == nullptr && std::string(w.name()) == "refuse");
  w = WhenFull::Evict(kLfu);
  CHECK(!WhenFull::Parse("fifo", &w) && w.evict == &kLfu);  // a failed parse changes nothing
  // Every strategy is found by its own name.
  CHECK(graphmod::FindEvictionStrategy("lru") == &kLru);
  CHECK(graphmod::FindEvictionStrategy("lfu") == &kLfu);
  CHECK(graphmod::FindEvictionStrategy("refuse") == nullptr);
  // A refusing table spills least recently used rows first; an evicting one
  // spills in its eviction order.
  CHECK(&WhenFull::Refuse().spill_order() == &kLru);
  CHECK(&WhenFull::Evict(kLfu).spill_order() == &kLfu);
}

void TestVictimOrder() {
  // LRU: older first, then fewer sightings.
  CHECK(kLru.Before(Row(1, 100), Row(2, 1)));
  CHECK(kLru.Before(Row(2, 1), Row(2, 5)));
  CHECK(!kLru.Before(Row(2, 5), Row(2, 5)));
  // LFU: fewer sightings first, then older.
  CHECK(kLfu.Before(Row(9, 1), Row(1, 2)));
  CHECK(kLfu.Before(Row(1, 2), Row(9, 2)));
  CHECK(!kLfu.Before(Row(1, 2), Row(1, 2)));
}

void TestSparedAndExpired() {
  // Spared: looked up at this step's clock and stamped with its version.
  CHECK(graphmod::SparedThisStep(Row(10, 1, 4), 10, 4));
  CHECK(!graphmod::SparedThisStep(Row(9, 1, 4), 10, 4));   // an earlier step
  CHECK(!graphmod::SparedThisStep(Row(10, 1, 3), 10, 4));  // same clock, older step
  CHECK(graphmod::Expired(Row(4, 1), 5) && !graphmod::Expired(Row(5, 1), 5));
}

// A shard's rows in a layout: keys 0..n-1 with last_seen/count from the callbacks.
template <class Rows>
struct Filled {
  Rows rows{graphmod::RecordLayout::For(2, 0)};
  template <class Seen, class Count>
  Filled(int n, Seen seen, Count count) {
    rows.Reserve(n, 1);
    for (int64_t k = 0; k < n; ++k) {
      CHECK(rows.Find(k, HashKey(k)) == Rows::kNoRow);
      const uint32_t row = rows.Insert(k, HashKey(k));
      RecordHeader* h = graphmod::Header(rows.Record(row));
      h->last_seen = seen(k);
      h->count = count(k);
      h->version = 1;
    }
  }
  // The candidates PickVictimNear looks at for hash h.
  std::vector<uint32_t> Candidates(uint64_t h) const {
    std::vector<uint32_t> refs;
    rows.VisitNear(h, [&](uint32_t ref, const char*) {
      refs.push_back(ref);
      return true;
    });
    return refs;
  }
};

template <class Rows>
void TestPicksTheBestCandidateNearTheKey() {
  Filled<Rows> t(2000, [](int64_t k) { return 1000 + (k * 37) % 101; },
                 [](int64_t k) { return static_cast<uint32_t>(1 + (k * 53) % 97); });
  for (int64_t probe = 5000; probe < 5200; ++probe) {
    const uint64_t h = HashKey(probe);
    for (const EvictionStrategy* order : {&kLru, &kLfu}) {
      const uint32_t victim = graphmod::PickVictimNear(t.rows, h, *order, 2000, 2);
      CHECK(victim != Rows::kNoRow);
      const RecordHeader& v = *graphmod::Header(t.rows.Record(victim));
      // No candidate is a strictly better victim than the one picked.
      const std::vector<uint32_t> candidates = t.Candidates(h);
      CHECK(candidates.size() >= 8);
      bool among = false;
      for (uint32_t ref : candidates) {
        among |= ref == victim;
        CHECK(!order->Before(*graphmod::Header(t.rows.Record(ref)), v));
      }
      CHECK(among);
    }
  }
}

// Most rows nearby were looked up this step: the search goes on past them
// until it has 8 candidates, so a victim is still found.
template <class Rows>
void TestLooksPastSparedRows() {
  Filled<Rows> t(4000, [](int64_t k) { return k % 10 == 0 ? 3 : 7; }, [](int64_t) { return 1u; });
  int found = 0;
  for (int64_t probe = 9000; probe < 9200; ++probe) {
    const uint32_t victim =
        graphmod::PickVictimNear(t.rows, HashKey(probe), kLru, 7, 1);
    if (victim == Rows::kNoRow) continue;
    ++found;
    CHECK(graphmod::Header(t.rows.Record(victim))->last_seen == 3);  // never a spared row
  }
  CHECK(found >= 198);
}

template <class Rows>
void TestSparesThisStepsRows() {
  // Every row was looked up in this step (clock 7, version 1): no victim.
  Filled<Rows> t(300, [](int64_t) { return 7; }, [](int64_t) { return 1u; });
  CHECK(graphmod::PickVictimNear(t.rows, HashKey(12345), kLru, 7, 1) ==
        Rows::kNoRow);
  // At the next step's clock they are all candidates again.
  CHECK(graphmod::PickVictimNear(t.rows, HashKey(12345), kLru, 8, 2) !=
        Rows::kNoRow);
  Rows empty{graphmod::RecordLayout::For(2, 0)};
  CHECK(graphmod::PickVictimNear(empty, 1, kLfu, 8, 2) == Rows::kNoRow);
}

}  // namespace

int main() {
  TestParse();
  TestVictimOrder();
  TestSparedAndExpired();
  TestPicksTheBestCandidateNearTheKey<graphmod::IndexedArena>();
  TestPicksTheBestCandidateNearTheKey<graphmod::RowBuckets>();
  TestLooksPastSparedRows<graphmod::IndexedArena>();
  TestLooksPastSparedRows<graphmod::RowBuckets>();
  TestSparesThisStepsRows<graphmod::IndexedArena>();
  TestSparesThisStepsRows<graphmod::RowBuckets>();
  return graphmod_test::TestExit("eviction_test");
}
