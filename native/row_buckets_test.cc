// Tests of the shard layouts (shard_storage.h): the conformance checks for
// both, and what is particular to RowBuckets: handles that follow moved
// rows (and when they stop), the stash, placement at full load.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "native/bits.h"
#include "native/indexed_arena.h"
#include "native/row_buckets.h"
#include "native/shard_storage_conformance.h"
#include "native/test_check.h"

using graphmod::HashKey;
using graphmod::IndexedArena;
using graphmod::RecordLayout;
using graphmod::RowBuckets;

namespace {

void TestConformance() {
  // Strides of 32, 152 and 48 bytes: records that fill, overrun and share
  // cache lines.
  for (const RecordLayout& layout :
       {RecordLayout::For(2, 0), RecordLayout::For(16, 1), RecordLayout::For(5, 1)}) {
    graphmod_test::ShardStorageConformance<IndexedArena>(layout, 400, 1);
    graphmod_test::ShardStorageConformance<RowBuckets>(layout, 400, 2);
  }
}

// Inserts keys [from, to) (room reserved first, at `version`); returns
// their handles.
std::vector<uint64_t> Add(RowBuckets* rows, int64_t from, int64_t to, int64_t version) {
  rows->Reserve(static_cast<size_t>(to - from), version);
  std::vector<uint64_t> handles;
  for (int64_t k = from; k < to; ++k) {
    uint32_t ref = rows->Find(k, HashKey(k));
    if (ref == RowBuckets::kNoRow) ref = rows->Insert(k, HashKey(k));
    graphmod::Values(rows->Record(ref))[0] = static_cast<float>(k);
    handles.push_back(rows->HandleBits(ref));
  }
  return handles;
}

bool Reaches(const RowBuckets& rows, uint64_t bits, int64_t key) {
  uint32_t ref;
  return rows.Resolve(bits, &ref) && graphmod::Header(rows.Record(ref))->key == key &&
         graphmod::Values(rows.Record(ref))[0] == static_cast<float>(key);
}

// Several lookups of one step, each growing the shard: the first lookup's
// handles follow every rebuild; the moves are forgotten kMovesKeptVersions
// versions after the rebuild.
void TestHandlesFollowMoves() {
  RowBuckets rows(RecordLayout::For(1, 0));
  const std::vector<uint64_t> first = Add(&rows, 0, 100, 5);
  const uint8_t epoch = rows.epoch();
  Add(&rows, 100, 1000, 5);  // same version: grows, moves the first 100
  CHECK(rows.epoch() != epoch);
  Add(&rows, 1000, 10000, 5);
  for (int64_t k = 0; k < 100; ++k) CHECK(Reaches(rows, first[k], k));
  // Six rebuilds at the same version (no Apply between): still followed.
  for (int64_t n = 10000; rows.epoch() != static_cast<uint8_t>(epoch + 6); n *= 2)
    Add(&rows, n, 2 * n, 5);
  for (int64_t k = 0; k < 100; ++k) CHECK(Reaches(rows, first[k], k));
  // A handle made after the last rebuild survives the next one at the next
  // version, and is forgotten kMovesKeptVersions versions after that rebuild.
  const std::vector<uint64_t> late = Add(&rows, 0, 10, 6);
  const uint8_t before = rows.epoch();
  for (int64_t n = rows.size(); rows.epoch() == before; n *= 2) Add(&rows, n, 2 * n, 7);
  for (int64_t k = 0; k < 10; ++k) CHECK(Reaches(rows, late[k], k));
  rows.Reserve(0, 7 + RowBuckets::kMovesKeptVersions - 1);
  for (int64_t k = 0; k < 10; ++k) CHECK(Reaches(rows, late[k], k));
  rows.Reserve(0, 7 + RowBuckets::kMovesKeptVersions);
  uint32_t ref;
  for (int64_t k = 0; k < 10; ++k) CHECK(!rows.Resolve(late[k], &ref));
  // A current handle of a freed and reused slot is stale.
  const std::vector<uint64_t> now = Add(&rows, 0, 1, 100);
  rows.Erase(rows.Find(0, HashKey(0)));
  Add(&rows, 0, 1, 100);
  CHECK(!rows.Resolve(now[0], &ref));
}

// Keys beyond the reserved room go to the stash; they are found, counted,
// erasable, and the next Reserve moves them into the buckets.
void TestStash() {
  RowBuckets rows(RecordLayout::For(2, 0));
  rows.Reserve(8, 1);
  std::vector<uint64_t> handles;
  for (int64_t k = 0; k < 500; ++k) {
    const uint32_t ref = rows.Insert(k, HashKey(k));
    graphmod::Values(rows.Record(ref))[0] = static_cast<float>(k);
    handles.push_back(rows.HandleBits(ref));
  }
  CHECK(rows.stash_rows() > 400 && rows.size() == 500);
  for (int64_t k = 0; k < 500; ++k) CHECK(Reaches(rows, handles[k], k));
  rows.Erase(rows.Find(3, HashKey(3)));
  CHECK(rows.Find(3, HashKey(3)) == RowBuckets::kNoRow);
  CHECK(rows.Reserve(0, 2));  // the stash outgrew its bound: rebuilt
  CHECK(rows.stash_rows() < 5 && rows.size() == 499);
  for (int64_t k = 0; k < 500; ++k) CHECK(k == 3 || Reaches(rows, handles[k], k));
  size_t live = 0;
  rows.ForEachLive([&](uint32_t, const char*) { ++live; });
  CHECK(live == 499);
}

// At the highest load before a rebuild, most keys sit at their preferred
// slot (one memory miss) and few reach the stash.
void TestPlacementAtFullLoad() {
  RowBuckets rows(RecordLayout::For(16, 0));
  rows.Reserve(200000, 1);
  const size_t fill = static_cast<size_t>(RowBuckets::kMaxLoad * rows.buckets() * 8);
  for (int64_t k = 0; static_cast<size_t>(k) < fill; ++k) rows.Insert(k * 7919, HashKey(k * 7919));
  size_t preferred, home, second;
  rows.CountPlacement(&preferred, &home, &second);
  const double n = static_cast<double>(rows.size());
  std::printf("load %.2f: preferred slot %.1f%%, home bucket %.1f%%, second bucket %.1f%%, "
              "stash %zu\n",
              n / (rows.buckets() * 8), 100 * preferred / n, 100 * home / n, 100 * second / n,
              rows.stash_rows());
  CHECK(preferred + home + second + rows.stash_rows() == rows.size());
  CHECK(preferred > n / 2 && rows.stash_rows() < rows.size() / 50);
}

}  // namespace

int main() {
  TestConformance();
  TestHandlesFollowMoves();
  TestStash();
  TestPlacementAtFullLoad();
  return graphmod_test::TestExit("row_buckets_test");
}
