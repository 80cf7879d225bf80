// Tests of native/eviction.h: victim order under LRU and LFU, the rows a
// step spares, and the sampled search near a key's index slot (on a real
// key index and arena row store).
#include <cstdint>
#include <vector>

#include "native/arena_row_store.h"
#include "native/bits.h"
#include "native/eviction.h"
#include "native/key_index.h"
#include "native/test_check.h"

using graphmod::ArenaRowStore;
using graphmod::CapacityPolicy;
using graphmod::HashKey;
using graphmod::KeyIndex;
using graphmod::RecordHeader;

namespace {

RecordHeader Row(int64_t last_seen, uint32_t count, uint32_t version = 0) {
  return RecordHeader{0, last_seen, count, version};
}

void TestParse() {
  CapacityPolicy p;
  CHECK(graphmod::ParseCapacityPolicy("lfu", &p) && p == CapacityPolicy::kLfu);
  CHECK(graphmod::ParseCapacityPolicy("refuse", &p) && p == CapacityPolicy::kRefuse);
  CHECK(!graphmod::ParseCapacityPolicy("fifo", &p));
}

void TestVictimOrder() {
  const CapacityPolicy lru = CapacityPolicy::kLru, lfu = CapacityPolicy::kLfu;
  // LRU: older first, then fewer sightings.
  CHECK(graphmod::BetterVictim(lru, Row(1, 100), Row(2, 1)));
  CHECK(graphmod::BetterVictim(lru, Row(2, 1), Row(2, 5)));
  CHECK(!graphmod::BetterVictim(lru, Row(2, 5), Row(2, 5)));
  // LFU: fewer sightings first, then older.
  CHECK(graphmod::BetterVictim(lfu, Row(9, 1), Row(1, 2)));
  CHECK(graphmod::BetterVictim(lfu, Row(1, 2), Row(9, 2)));
}

void TestSparedAndExpired() {
  // Spared: looked up at this step's clock and stamped with its version.
  CHECK(graphmod::SparedThisStep(Row(10, 1, 4), 10, 4));
  CHECK(!graphmod::SparedThisStep(Row(9, 1, 4), 10, 4));   // an earlier step
  CHECK(!graphmod::SparedThisStep(Row(10, 1, 3), 10, 4));  // same clock, older step
  CHECK(graphmod::Expired(Row(4, 1), 5) && !graphmod::Expired(Row(5, 1), 5));
}

// A shard-like pair: keys 0..n-1 with last_seen/count from the callbacks.
struct Filled {
  KeyIndex index;
  ArenaRowStore store{graphmod::RecordLayout::For(2, 0)};
  template <class Seen, class Count>
  Filled(int n, Seen seen, Count count) {
    auto key_of = [this](uint32_t row) { return store.Key(row); };
    auto live = [this](const auto& fn) {
      store.ForEachLive([&](uint32_t row, const char* rec) {
        fn(row, HashKey(graphmod::Header(rec)->key));
      });
    };
    for (int64_t k = 0; k < n; ++k) {
      if (!index.HasRoomForOne()) index.ReserveOne(live);
      bool found;
      const size_t slot = index.Probe(k, HashKey(k), key_of, &found);
      const uint32_t row = store.Allocate(k);
      RecordHeader* h = graphmod::Header(store.Record(row));
      h->last_seen = seen(k);
      h->count = count(k);
      h->version = 1;
      index.Fill(slot, HashKey(k), row);
    }
  }
  // The candidates PickVictimNear looks at for hash h: the live rows of the
  // first groups from h's home group on (as many as it scans).
  std::vector<uint32_t> Candidates(uint64_t h) const {
    std::vector<uint32_t> rows;
    size_t g = index.home_group(h);
    for (size_t step = 0; step < std::min<size_t>(index.groups(), 16) &&
                          (step < 2 || rows.size() < 8);
         ++step, g = index.next_group(g))
      for (size_t s = g * KeyIndex::kGroup; s < (g + 1) * KeyIndex::kGroup; ++s)
        if (index.full(s)) rows.push_back(index.row(s));
    return rows;
  }
};

void TestPicksTheBestCandidateNearTheKey() {
  Filled t(2000, [](int64_t k) { return 1000 + (k * 37) % 101; },
           [](int64_t k) { return static_cast<uint32_t>(1 + (k * 53) % 97); });
  for (int64_t probe = 5000; probe < 5200; ++probe) {
    const uint64_t h = HashKey(probe);
    for (CapacityPolicy policy : {CapacityPolicy::kLru, CapacityPolicy::kLfu}) {
      const size_t victim = graphmod::PickVictimNear(t.index, t.store, h, policy, 2000, 2);
      CHECK(victim != SIZE_MAX && t.index.full(victim));
      const RecordHeader& v = *graphmod::Header(t.store.Record(t.index.row(victim)));
      // No candidate is a strictly better victim than the one picked.
      const std::vector<uint32_t> candidates = t.Candidates(h);
      CHECK(candidates.size() >= 8);
      bool among = false;
      for (uint32_t row : candidates) {
        among |= row == t.index.row(victim);
        CHECK(!graphmod::BetterVictim(policy, *graphmod::Header(t.store.Record(row)), v));
      }
      CHECK(among);
    }
  }
}

void TestSparesThisStepsRows() {
  // Every row was looked up in this step (clock 7, version 1): no victim.
  Filled t(300, [](int64_t) { return 7; }, [](int64_t) { return 1u; });
  CHECK(graphmod::PickVictimNear(t.index, t.store, HashKey(12345), CapacityPolicy::kLru, 7, 1) ==
        SIZE_MAX);
  // At the next step's clock they are all candidates again.
  CHECK(graphmod::PickVictimNear(t.index, t.store, HashKey(12345), CapacityPolicy::kLru, 8, 2) !=
        SIZE_MAX);
  KeyIndex empty;
  CHECK(graphmod::PickVictimNear(empty, t.store, 1, CapacityPolicy::kLfu, 8, 2) == SIZE_MAX);
}

}  // namespace

int main() {
  TestParse();
  TestVictimOrder();
  TestSparedAndExpired();
  TestPicksTheBestCandidateNearTheKey();
  TestSparesThisStepsRows();
  return graphmod_test::TestExit("eviction_test");
}
