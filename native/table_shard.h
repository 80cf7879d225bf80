// One shard of a table: a key index, a row store, admission counters and a
// change log, all guarded by one mutex (taken once per shard and batch,
// never per key), and the per-key steps that must keep them in agreement:
// insert (within the table's row bound, evicting when full), erase, reset.
#ifndef GRAPHMOD_NATIVE_TABLE_SHARD_H_
#define GRAPHMOD_NATIVE_TABLE_SHARD_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "native/admission.h"
#include "native/bits.h"
#include "native/change_log.h"
#include "native/eviction.h"
#include "native/key_index.h"
#include "native/row_store.h"
#include "native/table.h"

namespace graphmod {

template <class Store>
struct TableShard {
  static_assert(CheckRowStore<Store>(), "see row_store.h");
  static constexpr uint32_t kNoRow = KeyIndex::kNoRow;

  TableShard(const RecordLayout& layout, const TableConfig& config,
             std::atomic<int64_t>* table_rows, const std::atomic<int64_t>* table_version)
      : store(layout),
        table_rows(table_rows),
        table_version(table_version),
        max_rows(config.max_rows),
        when_full(config.when_full) {
    if (config.sketch_width > 0)
      admission.sketch.Resize(std::max<int64_t>(1, config.sketch_width / config.num_shards));
  }

  mutable std::mutex mu;
  KeyIndex index;
  Store store;
  AdmissionCounter admission;
  ChangeLog changes;
  // Bounded tables (max_rows >= 0) keep an exact table-wide row count, which
  // every insert reserves from; unbounded ones skip that shared counter.
  std::atomic<int64_t>* const table_rows;
  const std::atomic<int64_t>* const table_version;
  const int64_t max_rows;
  const CapacityPolicy when_full;

  size_t Probe(int64_t key, uint64_t h, bool* found) const {
    return index.Probe(key, h, [this](uint32_t row) { return store.Key(row); }, found);
  }
  uint32_t FindRow(int64_t key, uint64_t h) const {
    return index.FindRow(key, h, [this](uint32_t row) { return store.Key(row); });
  }
  void PrefetchCandidate(uint64_t h) const {
    index.PrefetchCandidate(h, [this](uint32_t row) { store.Prefetch(row); });
  }
  // The index's rebuilds read every live row's key from the store.
  auto LiveRows() const {
    return [this](const auto& fn) {
      store.ForEachLive(
          [&](uint32_t row, const char* rec) { fn(row, HashKey(Header(rec)->key)); });
    };
  }
  RecordHeader* HeaderOf(uint32_t row) const { return Header(store.Record(row)); }
  void NoteRemoved(int64_t key) {
    changes.NoteRemoved(key, table_version->load(std::memory_order_relaxed));
  }

  // Adds absent key with a fresh (uninitialized) record at `slot`, the free
  // slot its probe returned; bounds are the caller's business.
  uint32_t Add(int64_t key, uint64_t h, size_t slot) {
    if (!index.HasRoomForOne()) {
      index.ReserveOne(LiveRows());
      bool found;
      slot = Probe(key, h, &found);
    }
    const uint32_t row = store.Allocate(key);
    index.Fill(slot, h, row);
    return row;
  }

  // A training lookup's insert of absent key. A bounded table at max_rows
  // first makes room per when_full (sparing rows this step looked up);
  // returns kNoRow when it may not. *evicted tells whether a row was evicted.
  uint32_t Insert(int64_t key, uint64_t h, size_t slot, int64_t now, uint32_t step_version,
                  bool* evicted) {
    *evicted = false;
    if (max_rows >= 0 && table_rows->fetch_add(1) >= max_rows) {
      const size_t victim = when_full == CapacityPolicy::kRefuse
                                ? SIZE_MAX
                                : PickVictimNear(index, store, h, when_full, now, step_version);
      if (victim == SIZE_MAX) {
        table_rows->fetch_sub(1);
        return kNoRow;
      }
      Erase(victim);
      *evicted = true;
    }
    return Add(key, h, slot);
  }

  // Import's insert: bounds are not enforced (a restore brings back every row).
  uint32_t FindOrAdd(int64_t key, uint64_t h, bool* added) {
    bool found;
    const size_t slot = Probe(key, h, &found);
    *added = !found;
    if (found) return index.row(slot);
    if (max_rows >= 0) table_rows->fetch_add(1);
    return Add(key, h, slot);
  }

  void Erase(size_t slot) {
    const uint32_t row = index.row(slot);
    RecordHeader* h = HeaderOf(row);
    NoteRemoved(h->key);
    // Version 0 is below any delta's min_version: a delta's export skips a
    // freed row it finds among the changed ones without looking it up.
    h->version = 0;
    store.Free(row);
    index.Erase(slot);
    if (max_rows >= 0) table_rows->fetch_sub(1);
  }

  void Reset() {
    if (changes.tracking()) {
      for (size_t slot = 0; slot < index.slots(); ++slot)
        if (index.full(slot)) NoteRemoved(store.Key(index.row(slot)));
      for (const auto& entry : admission.exact.entries()) NoteRemoved(entry.first);
    }
    changes.ClearDirty();
    if (max_rows >= 0) table_rows->fetch_sub(static_cast<int64_t>(index.used()));
    index.Reset();
    store.Reset();
    admission.exact.Clear();
    admission.sketch.Clear();
  }

  int64_t Bytes() const { return index.bytes() + store.Bytes() + admission.Bytes(); }
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_SHARD_H_
