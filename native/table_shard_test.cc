// Tests of native/table_shard.h: one shard's insert, bound, eviction, erase
// and reset keep the index, the row store, the table's row count and the
// change log in agreement.
#include <atomic>
#include <cstdint>
#include <set>

#include "native/arena_row_store.h"
#include "native/bits.h"
#include "native/table_shard.h"
#include "native/test_check.h"

using graphmod::ArenaRowStore;
using graphmod::CapacityPolicy;
using graphmod::HashKey;
using graphmod::RecordLayout;
using graphmod::TableConfig;
using Shard = graphmod::TableShard<ArenaRowStore>;

namespace {

TableConfig Config(int64_t max_rows, CapacityPolicy when_full) {
  TableConfig c;
  c.dim = 2;
  c.num_shards = 1;
  c.max_rows = max_rows;
  c.when_full = when_full;
  return c;
}

// A training insert of key at clock `now` in the step of `version`,
// stamping the row as the table does; returns the row or kNoRow.
uint32_t Train(Shard* s, int64_t key, int64_t now, uint32_t version) {
  const uint64_t h = HashKey(key);
  bool found;
  const size_t slot = s->Probe(key, h, &found);
  if (found) return s->index.row(slot);
  bool evicted;
  const uint32_t row = s->Insert(key, h, slot, now, version, &evicted);
  if (row != Shard::kNoRow) {
    graphmod::RecordHeader* r = s->HeaderOf(row);
    r->last_seen = now;
    r->count = 1;
    r->version = version;
  }
  return row;
}

void TestInsertAndFind() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(-1, CapacityPolicy::kLru);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 1000; ++k) CHECK(Train(&s, k, 1, 1) != Shard::kNoRow);
  CHECK(s.index.used() == 1000);
  CHECK(rows == 0);  // unbounded tables skip the shared count
  std::set<uint32_t> distinct;
  for (int64_t k = 0; k < 1000; ++k) {
    const uint32_t row = s.FindRow(k, HashKey(k));
    CHECK(row != Shard::kNoRow && s.store.Key(row) == k);
    distinct.insert(row);
  }
  CHECK(distinct.size() == 1000);
  CHECK(s.FindRow(5000, HashKey(5000)) == Shard::kNoRow);
  CHECK(s.Bytes() == s.index.bytes() + s.store.Bytes() + s.admission.Bytes());
}

void TestBoundRefuses() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(3, CapacityPolicy::kRefuse);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 3; ++k) CHECK(Train(&s, k, 1, 1) != Shard::kNoRow);
  CHECK(rows == 3);
  CHECK(Train(&s, 3, 2, 2) == Shard::kNoRow);
  CHECK(rows == 3 && s.index.used() == 3);  // the refused reservation is returned
}

void TestBoundEvictsLeastRecentButSparesThisStep() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(3, CapacityPolicy::kLru);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  Train(&s, 10, 1, 1);
  Train(&s, 11, 3, 3);
  Train(&s, 12, 2, 2);
  CHECK(Train(&s, 13, 4, 4) != Shard::kNoRow);  // evicts 10, the least recent
  CHECK(s.FindRow(10, HashKey(10)) == Shard::kNoRow);
  CHECK(s.FindRow(12, HashKey(12)) != Shard::kNoRow && rows == 3);
  // All three rows now belong to step 5: a fourth key of that step is refused.
  for (int64_t k : {11, 12, 13}) {
    graphmod::RecordHeader* r = s.HeaderOf(s.FindRow(k, HashKey(k)));
    r->last_seen = 5;
    r->version = 5;
  }
  CHECK(Train(&s, 14, 5, 5) == Shard::kNoRow && rows == 3);
}

void TestEraseFreesAndNotes() {
  std::atomic<int64_t> rows{0}, version{7};
  const TableConfig c = Config(10, CapacityPolicy::kLru);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  s.changes.Start(0);
  const uint32_t row = Train(&s, 42, 1, 1);
  const uint8_t generation = s.store.Generation(row);
  bool found;
  const size_t slot = s.Probe(42, HashKey(42), &found);
  CHECK(found);
  s.Erase(slot);
  CHECK(!s.store.IsCurrent(row, generation));  // its handle is stale
  CHECK(s.FindRow(42, HashKey(42)) == Shard::kNoRow);
  CHECK(rows == 0 && s.index.used() == 0);
  CHECK(s.changes.removed().size() == 1 && s.changes.removed()[0].first == 42 &&
        s.changes.removed()[0].second == 7);
}

void TestResetNotesEveryKeyAndReturnsTheCount() {
  std::atomic<int64_t> rows{0}, version{3};
  const TableConfig c = Config(100, CapacityPolicy::kLru);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 20; ++k) Train(&s, k, 1, 1);
  s.admission.exact.Set(500, graphmod::PendingCount{1, 1, 1});
  s.changes.Start(0);
  s.Reset();
  CHECK(rows == 0 && s.index.used() == 0 && s.admission.exact.empty());
  CHECK(s.changes.removed().size() == 21);  // 20 rows and the pending key
  CHECK(Train(&s, 3, 2, 2) != Shard::kNoRow && rows == 1);  // usable again
}

void TestFindOrAddIgnoresTheBound() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(2, CapacityPolicy::kRefuse);
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  bool added;
  for (int64_t k = 0; k < 5; ++k) {
    s.FindOrAdd(k, HashKey(k), &added);
    CHECK(added);
  }
  s.FindOrAdd(3, HashKey(3), &added);
  CHECK(!added && rows == 5 && s.index.used() == 5);
}

void TestSketchSizedPerShard() {
  std::atomic<int64_t> rows{0}, version{0};
  TableConfig c = Config(-1, CapacityPolicy::kLru);
  c.num_shards = 4;
  c.sketch_width = 1000;
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  CHECK(s.admission.sketch.size() == 4 * 250);
}

}  // namespace

int main() {
  TestInsertAndFind();
  TestBoundRefuses();
  TestBoundEvictsLeastRecentButSparesThisStep();
  TestEraseFreesAndNotes();
  TestResetNotesEveryKeyAndReturnsTheCount();
  TestFindOrAddIgnoresTheBound();
  TestSketchSizedPerShard();
  return graphmod_test::TestExit("table_shard_test");
}
