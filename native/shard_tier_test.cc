// Tests of native/shard_tier.h, a shard's disk layer, on each layout: the
// empty layer of a shard without a budget answers "nothing on disk" and
// moves nothing; with a budget, Spill moves the rows its strategy gives up
// first (never those a recent step stamped, nor staged ones) down whole, and
// Promote brings them back byte for byte, counted as promoted or prefetched.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "native/bits.h"
#include "native/indexed_arena.h"
#include "native/row_buckets.h"
#include "native/table_shard.h"
#include "native/test_check.h"
#include "native/test_dir.h"

using graphmod::HashKey;
using graphmod::RecordHeader;
using graphmod::RecordLayout;
using graphmod::TableConfig;
using graphmod::TableCounters;
using graphmod::WhenFull;

namespace {

std::string g_base;  // a fresh directory for the stores

TableConfig Config(float memory_budget, WhenFull when_full) {
  TableConfig c;
  c.dim = 4;
  c.num_shards = 1;
  c.memory_budget = memory_budget;
  c.when_full = when_full;
  return c;
}

// Inserts keys [0, n) with last_seen = 100 + key, count = n - key (so LRU
// and LFU orders differ: LRU gives up small keys first, LFU large ones),
// version 1, values derived from the key.
template <class Shard>
void Fill(Shard* s, int64_t n) {
  s->Reserve(static_cast<size_t>(n), 1);
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t row = s->rows.Insert(k, HashKey(k));
    RecordHeader* h = s->HeaderOf(row);
    h->last_seen = 100 + k;
    h->count = static_cast<uint32_t>(n - k);
    h->version = 1;
    float* v = graphmod::Values(s->rows.Record(row));
    for (int j = 0; j < 4; ++j) v[j] = static_cast<float>(k * 10 + j);
  }
}

template <class Shard>
bool InMemory(const Shard& s, int64_t key) {
  return s.Find(key, HashKey(key)) != Shard::kNoRow;
}

// The keys of the layer's cold rows with version >= v (checking that the
// scan read its segments without error and that CountSince agrees).
template <class Tier>
std::vector<int64_t> KeysSince(const Tier& disk, int64_t v) {
  std::vector<int64_t> keys;
  CHECK(disk.ForEachSince(v, [&](const char* rec) {
              keys.push_back(graphmod::Header(rec)->key);
              return std::string();
            }).empty());
  size_t n = 99;
  CHECK(disk.CountSince(v, &n).empty() && n == keys.size());
  return keys;
}

template <class Rows>
void TestEmptyLayer() {
  using Shard = graphmod::TableShard<Rows>;
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(0, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  Fill(&s, 50);
  auto& disk = s.disk;
  CHECK(disk.rows() == 0 && !disk.Holds(3));
  const int64_t keys[2] = {3, 999};
  CHECK(disk.Erase(keys, 2) == 0);
  CHECK(KeysSince(disk, 0).empty());
  CHECK(disk.ImportPiece(12345, s.rows.size()) == 12345);  // one piece: nothing to spill
  CHECK(disk.Spill(s, 1000).empty() && s.rows.size() == 50 && disk.spilled() == 0);
  std::vector<int64_t> unreadable;
  const uint64_t h[2] = {HashKey(3), HashKey(999)};
  CHECK(disk.Promote(s, keys, h, 2, 2, &unreadable).empty() && unreadable.empty());
  CHECK(disk.Prefetch(s, keys, h, 2, 1).empty());
  // Read marks every record absent (a header whose key is not its own).
  const size_t stride = RecordLayout::For(c.dim, 0).stride;
  std::vector<char> out(2 * stride);
  CHECK(disk.Read(keys, 2, out.data()).empty());
  CHECK(graphmod::Header(out.data())->key == ~int64_t{3});
  CHECK(graphmod::Header(out.data() + stride)->key == ~int64_t{999});
  CHECK(disk.ForEachSince(0, [](const char*) { return std::string("called"); }).empty());
  CHECK(disk.EvictBefore(1 << 30, [](int64_t) { CHECK(false); }) == 0);
  TableCounters counters;
  disk.AddCounters(&counters);
  CHECK(counters.cold_rows == 0 && counters.spilled == 0 && counters.promoted == 0 &&
        counters.prefetched == 0 && counters.disk_file_bytes == 0);
  CHECK(disk.Bytes() == 0 && s.size() == 50);
}

template <class Rows>
void TestSpillAndPromote(const char* layout, const graphmod::EvictionStrategy& order) {
  using Shard = graphmod::TableShard<Rows>;
  std::atomic<int64_t> rows{0}, version{0};
  const RecordLayout record = RecordLayout::For(4, 0);
  // A budget of 40 rows (bytes of records).
  const TableConfig c = Config(static_cast<float>(40 * record.stride), WhenFull::Evict(order));
  Shard s(record, c, &rows, &version);
  CHECK(s.disk.Open(g_base + "/" + layout + "-" + order.name()).empty());
  Fill(&s, 100);
  std::vector<char> before(100 * record.stride);
  for (int64_t k = 0; k < 100; ++k)
    std::memcpy(&before[k * record.stride], s.rows.Record(s.Find(k, HashKey(k))), record.stride);
  // Keys 10 and 90 were stamped by a recent step (version 20): spared.
  s.HeaderOf(s.Find(10, HashKey(10)))->version = 20;
  s.HeaderOf(s.Find(90, HashKey(90)))->version = 20;
  CHECK(s.disk.Spill(s, 21).empty());
  // Down to 95% of the budget: 38 rows stay, 62 went, all in order but the
  // spared ones.
  CHECK(s.rows.size() == 38 && s.disk.rows() == 62 && s.size() == 100);
  CHECK(s.disk.spilled() == 62);
  CHECK(InMemory(s, 10) && InMemory(s, 90));
  const bool lru = &order == &graphmod::LeastRecentlyUsed();
  for (int64_t k = 0; k < 100; ++k) {
    if (k == 10 || k == 90) continue;
    // LRU gives up the least recently seen (small keys), LFU the least
    // often seen (large keys): 62 of the 98 candidates.
    const bool gone = lru ? k < 63 : k > 36;
    CHECK(InMemory(s, k) != gone);
    CHECK(s.disk.Holds(k) == gone);
  }
  // Cold rows keep their version (deltas find them by it).
  CHECK(KeysSince(s.disk, 2).empty() && KeysSince(s.disk, 1).size() == 62);
  // A step needs keys 5 (cold under LRU), 70 (cold under LFU) and 1000 (new).
  const int64_t keys[3] = {5, 70, 1000};
  const uint64_t h[3] = {HashKey(5), HashKey(70), HashKey(1000)};
  std::vector<int64_t> unreadable;
  CHECK(s.disk.Promote(s, keys, h, 3, 22, &unreadable).empty() && unreadable.empty());
  const int64_t up = lru ? 5 : 70;
  CHECK(InMemory(s, up) && !s.disk.Holds(up) && s.disk.rows() == 61);
  CHECK(std::memcmp(s.rows.Record(s.Find(up, HashKey(up))), &before[up * record.stride],
                    record.stride) == 0);  // whole: values, count, last_seen, version
  CHECK(!InMemory(s, 1000));  // a new key is not the layer's to insert
  // A prefetch for the next step stages what it brings up: the next spill
  // (from a step before that one) spares it.
  const int64_t next = lru ? 6 : 71;
  const uint64_t next_h = HashKey(next);
  CHECK(s.disk.Prefetch(s, &next, &next_h, 1, /*table_version=*/22).empty());
  CHECK(InMemory(s, next));
  // Five new rows, seen late and often (the last choice of either order),
  // put memory over its budget: the spill of step 23 takes 7 rows, and the
  // staged one, first in order, is not among them.
  for (int64_t k = 2000; k < 2005; ++k) {
    s.Reserve(1, 23);
    RecordHeader* hd = s.HeaderOf(s.rows.Insert(k, HashKey(k)));
    hd->last_seen = 10000;
    hd->count = 1000;
    hd->version = 1;
  }
  CHECK(s.rows.size() == 45);
  CHECK(s.disk.Spill(s, 23).empty());
  CHECK(s.rows.size() == 38 && s.disk.spilled() == 69);
  CHECK(InMemory(s, next));
  for (int64_t k = 2000; k < 2005; ++k) CHECK(InMemory(s, k));
  TableCounters counters;
  s.disk.AddCounters(&counters);
  CHECK(counters.promoted == 1 && counters.prefetched == 1);
  CHECK(counters.cold_rows == static_cast<int64_t>(s.disk.rows()));
  CHECK(counters.disk_file_bytes > 0 && s.disk.Bytes() > 0);
  // ForEachSince streams every cold record as it was spilled (bit for
  // bit), and stops at fn's error.
  size_t seen = 0;
  CHECK(s.disk.ForEachSince(0, [&](const char* rec) {
    const int64_t key = graphmod::Header(rec)->key;
    CHECK(key >= 0 && key < 100 && !InMemory(s, key));
    CHECK(std::memcmp(rec, &before[key * record.stride], record.stride) == 0);
    ++seen;
    return std::string();
  }).empty());
  CHECK(seen == s.disk.rows() && seen > 0);
  CHECK(s.disk.ForEachSince(0, [](const char*) { return std::string("full"); }) == "full");
  // A time-based eviction of cold rows reads the segments that may hold
  // some and names each key.
  std::vector<int64_t> evicted;
  const size_t n = s.disk.EvictBefore(100 + 50, [&](int64_t key) { evicted.push_back(key); });
  CHECK(n == evicted.size() && n > 0);
  for (int64_t key : evicted) CHECK(key < 50 && !s.disk.Holds(key));
  // Reset forgets both layers.
  s.Reset();
  CHECK(s.size() == 0 && s.disk.rows() == 0);
}

}  // namespace

int main() {
  const graphmod_test::ScratchDir scratch("shard_tier_test");
  g_base = scratch.path();
  TestEmptyLayer<graphmod::IndexedArena>();
  TestEmptyLayer<graphmod::RowBuckets>();
  for (const graphmod::EvictionStrategy* order :
       {&graphmod::LeastRecentlyUsed(), &graphmod::LeastFrequentlyUsed()}) {
    TestSpillAndPromote<graphmod::IndexedArena>("arena", *order);
    TestSpillAndPromote<graphmod::RowBuckets>("buckets", *order);
  }
  return graphmod_test::TestExit("shard_tier_test");
}
