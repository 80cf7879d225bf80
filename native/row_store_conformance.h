// The checks every row store must pass (the contract in row_store.h), as a
// template: a store's own test calls RowStoreConformance<ItsStore>(), so a
// new store (a different layout, a disk tier) is held to the same promises
// the table relies on. Test-only; uses CHECK from test_check.h.
#ifndef GRAPHMOD_NATIVE_ROW_STORE_CONFORMANCE_H_
#define GRAPHMOD_NATIVE_ROW_STORE_CONFORMANCE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "native/row_store.h"
#include "native/test_check.h"

namespace graphmod_test {

// Fills a record's payload with a pattern derived from its key.
inline void Stamp(char* rec, const graphmod::RecordLayout& layout, int64_t key) {
  float* v = graphmod::Values(rec);
  for (int j = 0; j < layout.dim * (1 + layout.num_slots); ++j) v[j] = key * 0.5f + j;
}
inline bool HasStamp(const char* rec, const graphmod::RecordLayout& layout, int64_t key) {
  const float* v = graphmod::Values(rec);
  for (int j = 0; j < layout.dim * (1 + layout.num_slots); ++j)
    if (v[j] != key * 0.5f + j) return false;
  return true;
}

template <class Store>
void RowStoreConformance(const graphmod::RecordLayout& layout, int rows) {
  static_assert(graphmod::CheckRowStore<Store>(), "see row_store.h");
  Store store(layout);
  CHECK(store.Bytes() >= 0);
  const int64_t empty_bytes = store.Bytes();

  // Allocate: distinct rows, key set, the whole record writable.
  std::map<int64_t, uint32_t> row_of;
  std::map<int64_t, char*> address_of;
  for (int64_t key = 0; key < rows; ++key) {
    const uint32_t row = store.Allocate(key * 3 + 1);
    CHECK(row_of.emplace(key * 3 + 1, row).second);
    char* rec = store.Record(row);
    CHECK(store.Key(row) == key * 3 + 1);
    CHECK(graphmod::Header(rec)->key == key * 3 + 1);
    CHECK(reinterpret_cast<uintptr_t>(rec) % 8 == 0);  // the header's alignment
    Stamp(rec, layout, key * 3 + 1);
    address_of[key * 3 + 1] = rec;
    store.Prefetch(row);
  }
  CHECK(store.Bytes() > empty_bytes);
  std::set<uint32_t> distinct;
  for (const auto& [key, row] : row_of) distinct.insert(row);
  CHECK(distinct.size() == row_of.size());

  // Records never move and keep their contents while others come and go.
  for (const auto& [key, row] : row_of) {
    CHECK(store.Record(row) == address_of[key]);
    CHECK(HasStamp(store.Record(row), layout, key));
    CHECK(store.IsCurrent(row, store.Generation(row)));
    CHECK(row < store.RowBound());
  }

  // Free: the row's generation advances, so its old handle is stale; the
  // other rows are untouched.
  std::map<int64_t, uint8_t> old_generation;
  for (const auto& [key, row] : row_of) old_generation[key] = store.Generation(row);
  std::set<uint32_t> freed;
  for (const auto& [key, row] : row_of)
    if (key % 2 == 0) {
      store.Free(row);
      freed.insert(row);
    }
  for (const auto& [key, row] : row_of) {
    const bool was_freed = freed.count(row) > 0;
    CHECK(store.IsCurrent(row, old_generation[key]) == !was_freed);
    if (!was_freed) CHECK(HasStamp(store.Record(row), layout, key));
  }

  // ForEachLive: exactly the live rows, in row order, with their records.
  std::vector<uint32_t> seen;
  store.ForEachLive([&](uint32_t row, const char* rec) {
    seen.push_back(row);
    CHECK(rec == store.Record(row));
    CHECK(freed.count(row) == 0);
  });
  CHECK(seen.size() == row_of.size() - freed.size());
  for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i - 1] < seen[i]);

  // A freed row may be handed out again, under a new generation.
  const uint64_t bound = store.RowBound();
  for (size_t i = 0; i < freed.size(); ++i) {
    const uint32_t row = store.Allocate(-1 - static_cast<int64_t>(i));
    CHECK(store.Key(row) == -1 - static_cast<int64_t>(i));
    CHECK(store.IsCurrent(row, store.Generation(row)));
  }
  CHECK(store.RowBound() >= bound);

  // Reset: every old handle turns stale, nothing is live, the bound stays.
  std::map<uint32_t, uint8_t> live_generation;
  store.ForEachLive([&](uint32_t row, const char*) { live_generation[row] = store.Generation(row); });
  store.Reset();
  for (const auto& [row, generation] : live_generation) CHECK(!store.IsCurrent(row, generation));
  int live_after = 0;
  store.ForEachLive([&](uint32_t, const char*) { ++live_after; });
  CHECK(live_after == 0);
  CHECK(store.RowBound() >= bound);
  CHECK(store.Bytes() < static_cast<int64_t>(rows) * static_cast<int64_t>(layout.stride));
  // And it works again after the reset.
  const uint32_t row = store.Allocate(77);
  Stamp(store.Record(row), layout, 77);
  CHECK(store.Key(row) == 77 && HasStamp(store.Record(row), layout, 77));
}

}  // namespace graphmod_test

#endif  // GRAPHMOD_NATIVE_ROW_STORE_CONFORMANCE_H_
