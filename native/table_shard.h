// One shard of a table: its rows (a layout behind shard_storage.h),
// admission counters and a change log, all guarded by one mutex (taken once per shard and batch,
// never per key), and the per-key steps that must keep them in agreement:
// insert (within the table's row bound, evicting when full), erase, reset.
//
// With a memory budget (TableConfig::memory_budget) the shard's rows live in
// two layers: its layout (memory) and its disk layer (shard_tier.h), which
// moves rows between them; without one the disk layer is empty.
#ifndef GRAPHMOD_NATIVE_TABLE_SHARD_H_
#define GRAPHMOD_NATIVE_TABLE_SHARD_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "native/admission.h"
#include "native/bits.h"
#include "native/change_log.h"
#include "native/eviction.h"
#include "native/shard_storage.h"
#include "native/shard_tier.h"
#include "native/table.h"

namespace graphmod {

template <class Rows>
struct TableShard {
  static_assert(CheckShardStorage<Rows>(), "see shard_storage.h");
  static constexpr uint32_t kNoRow = Rows::kNoRow;

  TableShard(const RecordLayout& layout, const TableConfig& config,
             std::atomic<int64_t>* table_rows, const std::atomic<int64_t>* table_version)
      : rows(layout),
        table_rows(table_rows),
        table_version(table_version),
        max_rows(config.max_rows),
        when_full(config.when_full),
        disk(config, layout) {
    if (config.sketch_width > 0)
      admission.sketch.Resize(std::max<int64_t>(1, config.sketch_width / config.num_shards));
  }

  mutable std::mutex mu;
  Rows rows;
  AdmissionCounter admission;
  ChangeLog changes;
  // Bounded tables (max_rows >= 0) keep an exact table-wide row count, which
  // every insert reserves from; unbounded ones skip that shared counter.
  std::atomic<int64_t>* const table_rows;
  const std::atomic<int64_t>* const table_version;
  const int64_t max_rows;
  const WhenFull when_full;
  ShardTier<Rows> disk;  // the rows on disk (empty without a memory budget)

  // Live rows in both layers.
  size_t size() const { return rows.size() + disk.rows(); }

  uint32_t Find(int64_t key, uint64_t h) const { return rows.Find(key, h); }
  // fn(i, Find(keys[i], h[i])) for i in [0, n), in order, each key found
  // just before its call (so keys an earlier call inserted are found).
  // Pipelined over three stages so a batch of cold keys waits on many cache
  // misses at once instead of one after another: the layout's stage A
  // prefetch runs for key i + 2*kAhead, stage B (which may read what A
  // fetched) for key i + kAhead, and key i is then probed for real, its
  // lines already in cache (shard_storage.h). A training lookup's fn makes
  // the rows' handles: stage B fetches what they read too.
  template <class Fn>
  void FindEach(const int64_t* keys, const uint64_t* h, int64_t n, LookupKind kind,
                Fn&& fn) const {
    constexpr int64_t kAhead = 8;
    for (int64_t i = 0; i < std::min(n, 2 * kAhead); ++i) rows.PrefetchA(h[i]);
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) rows.PrefetchB(h[i], kind);
    for (int64_t i = 0; i < n; ++i) {
      if (i + 2 * kAhead < n) rows.PrefetchA(h[i + 2 * kAhead]);
      if (i + kAhead < n) rows.PrefetchB(h[i + kAhead], kind);
      fn(i, rows.Find(keys[i], h[i]));
    }
  }
  RecordHeader* HeaderOf(uint32_t ref) const { return Header(rows.Record(ref)); }
  void NoteRemoved(int64_t key) {
    changes.NoteRemoved(key, table_version->load(std::memory_order_relaxed));
  }

  // Room for `extra` more keys (the one point where the layout may move
  // rows: handles already made follow them). The change log names rows by
  // ref: after a move, its changed rows are listed anew.
  void Reserve(size_t extra, int64_t version) {
    if (!rows.Reserve(extra, version) || !changes.tracking()) return;
    changes.ClearDirty();
    const int64_t mark = changes.mark();
    rows.ForEachLive([&](uint32_t ref, const char* rec) {
      if (Header(rec)->version > mark) changes.NoteDirty(ref);
    });
  }

  // A training lookup's insert of absent key. A bounded table at max_rows
  // first makes room per when_full (sparing rows this step looked up);
  // returns kNoRow when it may not. *evicted tells whether a row was evicted.
  uint32_t Insert(int64_t key, uint64_t h, int64_t now, uint32_t step_version, bool* evicted) {
    *evicted = false;
    if (max_rows >= 0 && table_rows->fetch_add(1) >= max_rows) {
      const uint32_t victim = when_full.evict == nullptr
                                  ? kNoRow
                                  : PickVictimNear(rows, h, *when_full.evict, now, step_version);
      if (victim == kNoRow) {
        table_rows->fetch_sub(1);
        return kNoRow;
      }
      Erase(victim);
      *evicted = true;
    }
    Reserve(1, step_version);
    return rows.Insert(key, h);
  }

  // Import's insert: bounds are not enforced (a restore brings back every row).
  uint32_t FindOrAdd(int64_t key, uint64_t h, bool* added) {
    const uint32_t ref = rows.Find(key, h);
    *added = ref == kNoRow;
    if (!*added) return ref;
    if (max_rows >= 0) table_rows->fetch_add(1);
    Reserve(1, table_version->load(std::memory_order_relaxed) + 1);
    return rows.Insert(key, h);
  }

  void Erase(uint32_t ref) {
    RecordHeader* h = HeaderOf(ref);
    NoteRemoved(h->key);
    // Version 0 is below any delta's min_version: a delta's export skips a
    // freed row it finds among the changed ones without looking it up.
    h->version = 0;
    rows.Erase(ref);
    if (max_rows >= 0) table_rows->fetch_sub(1);
  }

  // Removes key from whichever layer holds it (memory, disk, or waiting for
  // admission: its count starts over). Returns whether it had a row.
  bool Remove(int64_t key, uint64_t h) {
    const uint32_t row = Find(key, h);
    if (row != kNoRow) {
      Erase(row);
      return true;
    }
    if (disk.Erase(&key, 1) == 1) {
      NoteRemoved(key);
      if (max_rows >= 0) table_rows->fetch_sub(1);
      return true;
    }
    if (admission.exact.Erase(key)) NoteRemoved(key);
    return false;
  }

  // A time-based eviction: removes the rows (in both layers) and the pending
  // keys last seen before `before`, and ages the admission sketch. Returns
  // the rows removed.
  int64_t Evict(int64_t before) {
    std::vector<uint32_t> expired;
    rows.ForEachLive([&](uint32_t row, const char* rec) {
      if (Expired(*Header(rec), before)) expired.push_back(row);
    });
    for (uint32_t row : expired) Erase(row);  // frees only: the other refs stay
    const size_t cold = disk.EvictBefore(before, [&](int64_t key) { NoteRemoved(key); });
    if (max_rows >= 0) table_rows->fetch_sub(static_cast<int64_t>(cold));
    admission.exact.DropSeenBefore(before, [&](int64_t key) { NoteRemoved(key); });
    admission.sketch.Halve();
    return static_cast<int64_t>(expired.size() + cold);
  }

  void Reset() {
    if (changes.tracking()) {
      rows.ForEachLive([&](uint32_t, const char* rec) { NoteRemoved(Header(rec)->key); });
      for (const auto& entry : admission.exact.entries()) NoteRemoved(entry.first);
      disk.ForEachKey([&](int64_t key) { NoteRemoved(key); });
    }
    changes.ClearDirty();
    if (max_rows >= 0) table_rows->fetch_sub(static_cast<int64_t>(size()));
    disk.Clear();
    rows.Reset();
    admission.exact.Clear();
    admission.sketch.Clear();
  }

  int64_t Bytes() const {
    return rows.Bytes() + admission.Bytes() + disk.Bytes();
  }
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_SHARD_H_
