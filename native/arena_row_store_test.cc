// Tests of native/arena_row_store.h: the row store contract (the shared
// conformance suite) and the arena's own geometry and memory use.
#include <cstdint>
#include <set>

#include "native/arena_row_store.h"
#include "native/row_store_conformance.h"
#include "native/test_check.h"

using graphmod::ArenaRowStore;
using graphmod::RecordLayout;

namespace {

void TestConformance() {
  // Small and wide records, across the geometric blocks and past a huge page.
  graphmod_test::RowStoreConformance<ArenaRowStore>(RecordLayout::For(1, 0), 100);
  graphmod_test::RowStoreConformance<ArenaRowStore>(RecordLayout::For(16, 2), 5000);
  graphmod_test::RowStoreConformance<ArenaRowStore>(RecordLayout::For(300, 1), 3000);
}

void TestLayout() {
  const RecordLayout l = RecordLayout::For(3, 1);  // 24 + 6 floats = 48 bytes
  CHECK(l.stride == 48);
  CHECK(RecordLayout::For(1, 0).stride == 32);  // 28 rounded up to 8
}

void TestBlockGeometry() {
  // 64, 128, 256, then 512 rows per block; rows fill blocks in order.
  CHECK(ArenaRowStore::BlockRows(0) == 64 && ArenaRowStore::BlockRows(1) == 128);
  CHECK(ArenaRowStore::BlockRows(2) == 256 && ArenaRowStore::BlockRows(3) == 512);
  CHECK(ArenaRowStore::BlockRows(40) == 512);
  uint64_t row = 0;
  for (size_t b = 0; b < 8; ++b)
    for (uint64_t i = 0; i < ArenaRowStore::BlockRows(b); ++i, ++row) {
      size_t block;
      uint64_t offset;
      ArenaRowStore::LocateRow(row, &block, &offset);
      CHECK(block == b && offset == i);
    }
}

void TestFreedRowsComeBackFirst() {
  ArenaRowStore store(RecordLayout::For(4, 0));
  for (int64_t k = 0; k < 10; ++k) store.Allocate(k);
  store.Free(3);
  store.Free(7);
  const std::set<uint32_t> reused = {store.Allocate(100), store.Allocate(101)};
  CHECK(reused == (std::set<uint32_t>{3, 7}));
  CHECK(store.Allocate(102) == 10);
}

void TestSmallTablesStaySmall() {
  ArenaRowStore store(RecordLayout::For(8, 0));
  store.Allocate(1);
  // One 64-row block of 56-byte records plus bookkeeping.
  CHECK(store.Bytes() < 64 * 56 + 1024);
  // A large store carves blocks from huge-page slabs: at most one partly
  // used slab and block beyond what its rows need.
  ArenaRowStore big(RecordLayout::For(8, 0));
  for (int64_t k = 0; k < 200000; ++k) big.Allocate(k);
  CHECK(big.Bytes() < 200000 * 56 + 2 * (int64_t{2} << 20) + 200000 * 2);
}

}  // namespace

int main() {
  TestConformance();
  TestLayout();
  TestBlockGeometry();
  TestFreedRowsComeBackFirst();
  TestSmallTablesStaySmall();
  return graphmod_test::TestExit("arena_row_store_test");
}
