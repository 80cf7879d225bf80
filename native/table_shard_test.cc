// Tests of native/table_shard.h: one shard's insert, bound, eviction, erase
// and reset keep its rows, the table's row count and the change log in
// agreement, for each layout.
#include <atomic>
#include <cstdint>
#include <set>

#include "native/bits.h"
#include "native/indexed_arena.h"
#include "native/row_buckets.h"
#include "native/table_shard.h"
#include "native/test_check.h"

using graphmod::WhenFull;
using graphmod::HashKey;
using graphmod::RecordLayout;
using graphmod::TableConfig;

namespace {

TableConfig Config(int64_t max_rows, WhenFull when_full) {
  TableConfig c;
  c.dim = 2;
  c.num_shards = 1;
  c.max_rows = max_rows;
  c.when_full = when_full;
  return c;
}

// A training insert of key at clock `now` in the step of `version`,
// stamping the row as the table does; returns the row or kNoRow.
template <class Shard>
uint32_t Train(Shard* s, int64_t key, int64_t now, uint32_t version) {
  const uint64_t h = HashKey(key);
  const uint32_t found = s->Find(key, h);
  if (found != Shard::kNoRow) return found;
  s->Reserve(1, version);
  bool evicted;
  const uint32_t row = s->Insert(key, h, now, version, &evicted);
  if (row != Shard::kNoRow) {
    graphmod::RecordHeader* r = s->HeaderOf(row);
    r->last_seen = now;
    r->count = 1;
    r->version = version;
  }
  return row;
}

template <class Shard>
void TestInsertAndFind() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(-1, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 1000; ++k) CHECK(Train(&s, k, 1, 1) != Shard::kNoRow);
  CHECK(s.rows.size() == 1000);
  CHECK(rows == 0);  // unbounded tables skip the shared count
  std::set<uint32_t> distinct;
  for (int64_t k = 0; k < 1000; ++k) {
    const uint32_t row = s.Find(k, HashKey(k));
    CHECK(row != Shard::kNoRow && s.HeaderOf(row)->key == k);
    distinct.insert(row);
  }
  CHECK(distinct.size() == 1000);
  CHECK(s.Find(5000, HashKey(5000)) == Shard::kNoRow);
  CHECK(s.Bytes() == s.rows.Bytes() + s.admission.Bytes());
}

template <class Shard>
void TestBoundRefuses() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(3, WhenFull::Refuse());
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 3; ++k) CHECK(Train(&s, k, 1, 1) != Shard::kNoRow);
  CHECK(rows == 3);
  CHECK(Train(&s, 3, 2, 2) == Shard::kNoRow);
  CHECK(rows == 3 && s.rows.size() == 3);  // the refused reservation is returned
}

template <class Shard>
void TestBoundEvictsLeastRecentButSparesThisStep() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(3, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  Train(&s, 10, 1, 1);
  Train(&s, 11, 3, 3);
  Train(&s, 12, 2, 2);
  CHECK(Train(&s, 13, 4, 4) != Shard::kNoRow);  // evicts 10, the least recent
  CHECK(s.Find(10, HashKey(10)) == Shard::kNoRow);
  CHECK(s.Find(12, HashKey(12)) != Shard::kNoRow && rows == 3);
  // All three rows now belong to step 5: a fourth key of that step is refused.
  for (int64_t k : {11, 12, 13}) {
    graphmod::RecordHeader* r = s.HeaderOf(s.Find(k, HashKey(k)));
    r->last_seen = 5;
    r->version = 5;
  }
  CHECK(Train(&s, 14, 5, 5) == Shard::kNoRow && rows == 3);
}

template <class Shard>
void TestEraseFreesAndNotes() {
  std::atomic<int64_t> rows{0}, version{7};
  const TableConfig c = Config(10, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  s.changes.Start(0);
  const uint32_t row = Train(&s, 42, 1, 1);
  const uint64_t handle = s.rows.HandleBits(row);
  uint32_t resolved;
  CHECK(s.rows.Resolve(handle, &resolved) && resolved == row);
  CHECK(s.Find(42, HashKey(42)) == row);
  s.Erase(row);
  CHECK(!s.rows.Resolve(handle, &resolved));  // its handle is stale
  CHECK(s.Find(42, HashKey(42)) == Shard::kNoRow);
  CHECK(rows == 0 && s.rows.size() == 0);
  CHECK(s.changes.removed().size() == 1 && s.changes.removed()[0].first == 42 &&
        s.changes.removed()[0].second == 7);
}

template <class Shard>
void TestResetNotesEveryKeyAndReturnsTheCount() {
  std::atomic<int64_t> rows{0}, version{3};
  const TableConfig c = Config(100, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  for (int64_t k = 0; k < 20; ++k) Train(&s, k, 1, 1);
  s.admission.exact.Set(500, graphmod::PendingCount{1, 1, 1});
  s.changes.Start(0);
  s.Reset();
  CHECK(rows == 0 && s.rows.size() == 0 && s.admission.exact.empty());
  CHECK(s.changes.removed().size() == 21);  // 20 rows and the pending key
  CHECK(Train(&s, 3, 2, 2) != Shard::kNoRow && rows == 1);  // usable again
}

template <class Shard>
void TestFindOrAddIgnoresTheBound() {
  std::atomic<int64_t> rows{0}, version{0};
  const TableConfig c = Config(2, WhenFull::Refuse());
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  bool added;
  for (int64_t k = 0; k < 5; ++k) {
    s.FindOrAdd(k, HashKey(k), &added);
    CHECK(added);
  }
  s.FindOrAdd(3, HashKey(3), &added);
  CHECK(!added && rows == 5 && s.rows.size() == 5);
}

template <class Shard>
void TestSketchSizedPerShard() {
  std::atomic<int64_t> rows{0}, version{0};
  TableConfig c = Config(-1, WhenFull::Evict(graphmod::LeastRecentlyUsed()));
  c.num_shards = 4;
  c.sketch_width = 1000;
  Shard s(RecordLayout::For(c.dim, 0), c, &rows, &version);
  CHECK(s.admission.sketch.size() == 4 * 250);
}

template <class Rows>
void RunAll() {
  using Shard = graphmod::TableShard<Rows>;
  TestInsertAndFind<Shard>();
  TestBoundRefuses<Shard>();
  TestBoundEvictsLeastRecentButSparesThisStep<Shard>();
  TestEraseFreesAndNotes<Shard>();
  TestResetNotesEveryKeyAndReturnsTheCount<Shard>();
  TestFindOrAddIgnoresTheBound<Shard>();
  TestSketchSizedPerShard<Shard>();
}

}  // namespace

int main() {
  RunAll<graphmod::IndexedArena>();
  RunAll<graphmod::RowBuckets>();
  return graphmod_test::TestExit("table_shard_test");
}
