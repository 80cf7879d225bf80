// One shard of a table: its rows (a layout behind shard_storage.h),
// admission counters and a change log, all guarded by one mutex (taken once per shard and batch,
// never per key), and the per-key steps that must keep them in agreement:
// insert (within the table's row bound, evicting when full), erase, reset.
//
// With a disk tier (TableConfig::memory_budget) the shard's rows live in two
// places: its layout (memory) and a LogTier (disk). Rows are read and updated
// only in memory: a batch promotes the cold rows it needs first (Promote),
// and the shard spills its least valuable rows back (Spill) once memory holds
// more than its budget. A row moves between tiers as its record's bytes,
// whole (values, slots, count, last_seen, version), so a tiered table trains
// exactly as an all-in-memory one. Moves are neither changes nor removals:
// the change log does not see them, and deltas find changed cold rows by
// their version in the tier's index.
#ifndef GRAPHMOD_NATIVE_TABLE_SHARD_H_
#define GRAPHMOD_NATIVE_TABLE_SHARD_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "native/admission.h"
#include "native/bits.h"
#include "native/change_log.h"
#include "native/eviction.h"
#include "native/log_tier.h"
#include "native/shard_storage.h"
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
        stride(layout.stride) {
    if (config.sketch_width > 0)
      admission.sketch.Resize(std::max<int64_t>(1, config.sketch_width / config.num_shards));
    if (config.memory_budget > 1) {  // bytes of records, split evenly over the shards
      budget_rows = std::max<size_t>(
          1, static_cast<size_t>(config.memory_budget / layout.stride / config.num_shards));
    } else if (config.memory_budget > 0) {
      budget_fraction = config.memory_budget;
    }
  }

  // Opens the shard's disk tier in dir; "" or the error.
  std::string OpenTier(const std::string& dir) {
    TierOptions options;
    options.dir = dir;
    options.record_bytes = stride;
    // Shards already read side by side (the lookup's runner): two preads in
    // flight each keep a disk busy without a thread pool per core per shard.
    options.read_threads = 2;
    std::string error;
    tier = LogTier::Open(options, &error);
    return error;
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
  const size_t stride;  // record bytes

  // The disk tier (null: every row in memory) and the memory budget: a
  // fixed number of rows, or a fraction of the shard's rows in both tiers.
  std::unique_ptr<LogTier> tier;
  size_t budget_rows = 0;
  double budget_fraction = 0;
  int64_t promoted = 0, spilled = 0;  // rows a step moved up / rows moved down, ever
  int64_t prefetched = 0;              // rows a prefetch moved up, ever

  // Rows a prefetch brought up for the next step, with the version that
  // step's lookup will stamp: spills spare them until that step (and one
  // more, for workers' steps that overlap) has looked them up, so the
  // step under way cannot send them back to disk first. Keys found in memory
  // are staged only when no recent step stamped them (spills spare those
  // anyway, and each staged key costs every spill a probe).
  struct Staged {
    int64_t key;
    uint64_t hash;
    int64_t version;
  };
  std::vector<Staged> staged;

  size_t ColdRows() const { return tier ? static_cast<size_t>(tier->counters().rows) : 0; }
  size_t BudgetRows() const {
    if (budget_fraction <= 0) return budget_rows;
    const double all = static_cast<double>(rows.size() + ColdRows());
    return std::max<size_t>(1, static_cast<size_t>(std::ceil(budget_fraction * all)));
  }

  uint32_t Find(int64_t key, uint64_t h) const { return rows.Find(key, h); }
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

  // Brings the cold rows of n keys (memory misses among them; hashes h) into
  // memory, in one batched disk read. Keys whose record could not be read
  // stay on disk and go to *unreadable (the caller must not give them a new
  // row); returns "" or the first read error. Adds the rows moved to
  // *moved_up (promoted, or prefetched). With stage_for > 0 (a prefetch),
  // stages the keys for the step stamping stage_for (see Staged).
  std::string Promote(const int64_t* keys, const uint64_t* h, size_t n, int64_t version,
                      std::vector<int64_t>* unreadable, int64_t* moved_up,
                      int64_t stage_for = 0) {
    if (!tier || tier->counters().rows == 0) return "";
    std::vector<std::pair<int64_t, uint64_t>> misses;  // (key, hash); an apply's keys repeat
    const int64_t spared_then = stage_for - kSparedVersions + 1;  // by that step's spill
    for (size_t i = 0; i < n; ++i) {
      const uint32_t ref = rows.Find(keys[i], h[i]);
      if (ref == kNoRow)
        misses.emplace_back(keys[i], h[i]);
      else if (stage_for > 0 && HeaderOf(ref)->version < spared_then)
        staged.push_back({keys[i], h[i], stage_for});
    }
    std::sort(misses.begin(), misses.end());
    misses.erase(std::unique(misses.begin(), misses.end()), misses.end());
    std::vector<int64_t> cold;
    std::vector<uint64_t> cold_h;
    for (const auto& [key, hash] : misses) {
      TierEntry entry;
      if (tier->Find(key, &entry)) {
        cold.push_back(key);
        cold_h.push_back(hash);
      }
    }
    if (cold.empty()) return "";
    std::unique_ptr<char[]> buf(new char[cold.size() * stride]);
    std::unique_ptr<bool[]> found(new bool[cold.size()]());
    // A record that failed to read is left unwritten: each header starts
    // with a key other than its own, so such a record is told apart.
    for (size_t i = 0; i < cold.size(); ++i) Header(buf.get() + i * stride)->key = ~cold[i];
    const std::string error = tier->Read(cold.data(), cold.size(), buf.get(), found.get());
    Reserve(cold.size(), version);
    std::vector<int64_t> moved;
    for (size_t i = 0; i < cold.size(); ++i) {
      const char* rec = buf.get() + i * stride;
      if (!found[i]) continue;  // erased meanwhile (cannot happen under the shard's lock)
      if (Header(rec)->key != cold[i]) {
        unreadable->push_back(cold[i]);
        continue;
      }
      const uint32_t ref = rows.Insert(cold[i], cold_h[i]);
      std::memcpy(rows.Record(ref), rec, stride);
      // Changed since the last full save: a delta must list it (by ref now).
      if (changes.tracking() && Header(rec)->version > changes.mark()) changes.NoteDirty(ref);
      moved.push_back(cold[i]);
      if (stage_for > 0) staged.push_back({cold[i], cold_h[i], stage_for});
    }
    tier->Erase(moved.data(), moved.size());
    *moved_up += static_cast<int64_t>(moved.size());
    return error;
  }

  // Brings up the cold rows of n keys the next step will look up (its
  // lookup then finds them in memory) and stages them for that step: moves
  // only, no row changes. "" or the first read error (an unreadable
  // row stays on disk; the step's lookup fails on it as it would have).
  std::string Prefetch(const int64_t* keys, const uint64_t* h, size_t n) {
    if (!tier) return "";
    // The step under way stamps version + 1 (as a lookup would); the next one,
    // the step these keys are for, version + 2.
    const int64_t version = table_version->load(std::memory_order_relaxed) + 1;
    DropStaged(version - 1);
    // Steps that do not advance the version (no apply) would let it grow:
    // a prefetch keeps at most the last few batches' worth (oldest go first).
    if (staged.size() > 4 * n) staged.erase(staged.begin(), staged.end() - 4 * n);
    std::vector<int64_t> unreadable;
    return Promote(keys, h, n, version, &unreadable, &prefetched, version + 1);
  }

  // Rows a lookup stamped within this many table versions stay in memory:
  // their handles may still come with gradients (asynchronous workers' steps
  // overlap: other workers' applies advance the version between a lookup and
  // its own apply). The buckets layout keeps moved handles as long
  // (RowBuckets::kMovesKeptVersions). A budget smaller than what 16 steps
  // look up is exceeded by the difference (and by rows staged for the next
  // step).
  static constexpr int64_t kSparedVersions = 16;

  // Moves rows to disk while memory holds more than the budget, down to 95%
  // of it (so spills come in batches): the least recently used first (least
  // often under when_full "lfu": when_full's spill order), never a row looked up by the last
  // kSparedVersions steps nor one staged for a coming step (step_version:
  // the step under way's; larger than every version spares nothing).
  // Returns "" or the write error; then the rows stay in memory.
  std::string Spill(int64_t step_version) {
    if (!tier) return "";
    const size_t budget = BudgetRows();
    if (rows.size() <= budget) return "";
    const size_t keep = budget - budget / 20;
    const int64_t spared_from = step_version - kSparedVersions + 1;
    DropStaged(step_version - 1);
    std::vector<uint32_t> staged_refs;
    for (const Staged& s : staged) {
      const uint32_t ref = rows.Find(s.key, s.hash);
      if (ref != kNoRow) staged_refs.push_back(ref);
    }
    std::sort(staged_refs.begin(), staged_refs.end());
    std::vector<std::pair<RecordHeader, uint32_t>> candidates;
    candidates.reserve(rows.size());
    rows.ForEachLive([&](uint32_t ref, const char* rec) {
      if (Header(rec)->version < spared_from &&
          !std::binary_search(staged_refs.begin(), staged_refs.end(), ref))
        candidates.emplace_back(*Header(rec), ref);
    });
    const size_t k = std::min(candidates.size(), rows.size() - keep);
    if (k == 0) return "";
    const EvictionStrategy& order = when_full.spill_order();
    std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(),
                     [&](const auto& a, const auto& b) { return order.Before(a.first, b.first); });
    std::unique_ptr<char[]> buf(new char[k * stride]);
    for (size_t i = 0; i < k; ++i)
      std::memcpy(buf.get() + i * stride, rows.Record(candidates[i].second), stride);
    const std::string error = tier->Put(buf.get(), k);
    if (!error.empty()) return error;
    for (size_t i = 0; i < k; ++i) {
      // Version 0, as Erase: a delta skips the freed ref in its changed rows.
      HeaderOf(candidates[i].second)->version = 0;
      rows.Erase(candidates[i].second);
    }
    spilled += static_cast<int64_t>(k);
    return "";
  }

  // Forgets staged keys whose step is older than `from`.
  void DropStaged(int64_t from) {
    staged.erase(std::remove_if(staged.begin(), staged.end(),
                                [from](const Staged& s) { return s.version < from; }),
                 staged.end());
  }

  void Reset() {
    staged.clear();
    if (changes.tracking()) {
      rows.ForEachLive([&](uint32_t, const char* rec) { NoteRemoved(Header(rec)->key); });
      for (const auto& entry : admission.exact.entries()) NoteRemoved(entry.first);
      if (tier) tier->ForEachEntry([&](const TierEntry& e) { NoteRemoved(e.key); });
    }
    changes.ClearDirty();
    if (max_rows >= 0)
      table_rows->fetch_sub(static_cast<int64_t>(rows.size() + ColdRows()));
    if (tier) tier->Clear();
    rows.Reset();
    admission.exact.Clear();
    admission.sketch.Clear();
  }

  int64_t Bytes() const {
    return rows.Bytes() + admission.Bytes() + (tier ? static_cast<int64_t>(tier->index_bytes()) : 0);
  }
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_SHARD_H_
