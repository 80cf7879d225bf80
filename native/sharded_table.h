// The table's machinery behind EmbeddingTable: the shards (table_shard.h)
// and the batch operations over them.
//
// ShardedTable is a template over the shard's layout (shard_storage.h), so
// the per-key path (probe, record access, copy) inlines the layout's
// methods; EmbeddingTable reaches it through TableImpl, one virtual call per
// batch. Only table.cc includes this file: it instantiates ShardedTable for
// the layouts a TableConfig can ask for.
#ifndef GRAPHMOD_NATIVE_SHARDED_TABLE_H_
#define GRAPHMOD_NATIVE_SHARDED_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "native/admission.h"
#include "native/batch.h"
#include "native/bits.h"
#include "native/change_log.h"
#include "native/eviction.h"
#include "native/memory.h"
#include "native/optimizer_math.h"
#include "native/row_store.h"
#include "native/shard_storage.h"
#include "native/table.h"
#include "native/table_shard.h"

namespace graphmod {

// EmbeddingTable's operations (see table.h for what each does), implemented
// once per layout.
class TableImpl {
 public:
  virtual ~TableImpl() = default;
  virtual int64_t size() const = 0;
  virtual int64_t memory_bytes() const = 0;
  virtual int64_t version() const = 0;
  virtual TableCounters counters() const = 0;
  virtual std::string FindOrInsert(const int64_t* keys, int64_t n, int64_t now,
                                   int64_t access_threshold, float* values, int64_t* handles,
                                   const Runner& run) = 0;
  virtual std::string Find(const int64_t* keys, int64_t n, float* values,
                           const Runner& run) const = 0;
  virtual std::string Prefetch(const int64_t* keys, int64_t n, const Runner& run) = 0;
  virtual std::string Apply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                            const float* grads, int64_t n, const Runner& run) = 0;
  virtual std::string CheckApply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                                 int64_t n, const Runner& run) const = 0;
  virtual int64_t Remove(const int64_t* keys, int64_t n) = 0;
  virtual int64_t Evict(int64_t before, const Runner& run) = 0;
  virtual void Clear() = 0;
  // The rows (and, with `pending`, first the pending keys) of shard `shard`
  // (-1: every shard), all under the locks of the shards read, taken once.
  virtual std::string Export(int64_t min_version, int shard, int64_t chunk_rows,
                             const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
                             const std::function<std::string(int64_t n)>& emit,
                             const PendingAlloc* pending) const = 0;
  // Opens the shards' disk tiers under dir (TableConfig::memory_budget > 0);
  // "" or the error.
  virtual std::string OpenTiers(const std::string& dir) = 0;
  virtual int64_t CountRows(int64_t min_version, int shard) const = 0;
  virtual std::string Import(const int64_t* keys, const void* values, const void* slots,
                             const int64_t* counts, const int64_t* last_seen,
                             const int64_t* versions, int64_t n, bool replace,
                             const Runner& run) = 0;
  virtual void ExportPending(int64_t min_version, const PendingAlloc& alloc, int shard) const = 0;
  virtual int64_t CountPending(int64_t min_version, int shard) const = 0;
  virtual int64_t TrackRemovals() = 0;
  virtual void ExportRemoved(int64_t since, const std::function<int64_t*(int64_t n)>& alloc) = 0;
  virtual std::string ImportPending(const int64_t* keys, const int64_t* counts,
                                    const int64_t* last_seen, int64_t n, const int32_t* sketch,
                                    int64_t sketch_count) = 0;
  virtual int64_t sketch_size() const = 0;
};

// The first error of calls running side by side ("" none).
class FirstError {
 public:
  void Note(const std::string& error) {
    if (error.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = error;
  }
  std::string Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(error_);
  }

 private:
  std::mutex mu_;
  std::string error_;
};

// Where a lookup's rows go. Straight out: each distinct id's row to its
// first position in the caller's batch, its repeats copied from there (the
// shard's pass does both). Gathered, when a batch repeats its ids (more than
// one in 8 a repeat): each distinct row once into a buffer (at its entry's
// position in the grouped batch: the shards' parts stay dense), then every
// position reads its row from there in batch order, writing sequentially
// (straight out, a Zipf batch wrote its output at random, a cache line a
// row: 20-30% more time in a C++ driver).
struct OutputMode {
  OutputMode(Batch& batch, int64_t n, int64_t distinct, int d, float* values, int64_t* handles)
      : gather(distinct < n - n / 8),
        batch(batch),
        n(n),
        d(d),
        values(values),
        handles(handles),
        rows(gather ? batch.Rows(n, d) : nullptr) {}
  // Where distinct position p's row goes.
  float* Out(int64_t p) const { return gather ? rows + p * d : values + batch.order[p] * d; }
  // Distinct position p's handle (-1: no row).
  void Handle(int64_t p, int64_t handle) const {
    batch.found[p] = handle;
    if (!gather && handles != nullptr) handles[batch.order[p]] = handle;
  }
  // Gathered: every position's row (and handle) from its id's.
  void GatherOut(const Runner& run) const {
    run(n, 4 * d + 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t j = batch.index[i];
        CopyRow(values + i * d, rows + j * d, d);
        if (handles != nullptr) handles[i] = batch.found[j];
      }
    });
  }
  const bool gather;
  Batch& batch;
  const int64_t n;
  const int d;
  float* const values;
  int64_t* const handles;
  float* const rows;
};

template <class Rows>
class ShardedTable final : public TableImpl {
 public:
  using Shard = TableShard<Rows>;
  static constexpr uint32_t kNoRow = Shard::kNoRow;

  explicit ShardedTable(const TableConfig& config)
      : config_(config),
        layout_(RecordLayout::For(config.dim, config.num_slots, config.values_type,
                                  config.slots_type)) {
    shard_bits_ = 0;
    while ((1 << shard_bits_) < config_.num_shards) ++shard_bits_;
    for (int i = 0; i < config_.num_shards; ++i)
      shards_.emplace_back(new Shard(layout_, config_, &rows_, &version_));
  }

  int64_t size() const override {
    int64_t n = 0;
    for (const auto& s : shards_) n += static_cast<int64_t>(s->size());
    return n;
  }
  int64_t memory_bytes() const override {
    int64_t n = 0;
    for (const auto& s : shards_) {
      std::lock_guard<std::mutex> lock(s->mu);
      n += s->Bytes();
    }
    return n;
  }
  int64_t version() const override { return version_.load(); }
  TableCounters counters() const override;
  std::string FindOrInsert(const int64_t* keys, int64_t n, int64_t now, int64_t access_threshold,
                           float* values, int64_t* handles, const Runner& run) override;
  std::string Find(const int64_t* keys, int64_t n, float* values,
                   const Runner& run) const override;
  std::string Prefetch(const int64_t* keys, int64_t n, const Runner& run) override;
  std::string Apply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                    const float* grads, int64_t n, const Runner& run) override;
  std::string CheckApply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                         int64_t n, const Runner& run) const override;
  int64_t Remove(const int64_t* keys, int64_t n) override;
  int64_t Evict(int64_t before, const Runner& run) override;
  void Clear() override {
    for (auto& s : shards_) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->Reset();
    }
  }
  std::string Export(int64_t min_version, int shard, int64_t chunk_rows,
                     const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
                     const std::function<std::string(int64_t n)>& emit,
                     const PendingAlloc* pending) const override;
  std::string OpenTiers(const std::string& dir) override {
    for (size_t s = 0; s < shards_.size(); ++s) {
      const std::string error = shards_[s]->disk.Open(dir + "/shard-" + std::to_string(s));
      if (!error.empty()) return error;
    }
    return "";
  }
  int64_t CountRows(int64_t min_version, int shard) const override;
  std::string Import(const int64_t* keys, const void* values, const void* slots,
                     const int64_t* counts, const int64_t* last_seen, const int64_t* versions,
                     int64_t n, bool replace, const Runner& run) override;
  void ExportPending(int64_t min_version, const PendingAlloc& alloc, int shard) const override;
  int64_t CountPending(int64_t min_version, int shard) const override;
  int64_t TrackRemovals() override;
  void ExportRemoved(int64_t since, const std::function<int64_t*(int64_t n)>& alloc) override;
  std::string ImportPending(const int64_t* keys, const int64_t* counts, const int64_t* last_seen,
                            int64_t n, const int32_t* sketch, int64_t sketch_count) override;
  int64_t sketch_size() const override {
    return static_cast<int64_t>(shards_[0]->admission.sketch.size()) * config_.num_shards;
  }

 private:
  // Tallies of one thread's part of a training lookup.
  struct Tally {
    int64_t admitted = 0, rejected = 0, evicted = 0;
  };

  Shard& ShardOf(uint64_t h) const {
    return *shards_[shard_bits_ == 0 ? 0 : h >> (64 - shard_bits_)];
  }
  bool tiered() const { return config_.memory_budget > 0; }
  void AdvanceLatest(int64_t now) {
    for (int64_t seen = latest_.load(); now > seen && !latest_.compare_exchange_weak(seen, now);) {
    }
  }
  // Locks shards [s0, s1), in shard order (as every call that holds several).
  std::vector<std::unique_lock<std::mutex>> LockShards(size_t s0, size_t s1) const {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (size_t si = s0; si < s1; ++si) locks.emplace_back(shards_[si]->mu);
    return locks;
  }
  // Export's and ExportPending's work on shards [s0, s1), whose locks the
  // caller holds; ExportRows releases each shard's lock once its rows are
  // copied (a training step waiting for that shard goes on).
  std::string ExportRows(int64_t min_version, size_t s0, size_t s1, int64_t chunk_rows,
                         const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
                         const std::function<std::string(int64_t n)>& emit,
                         std::vector<std::unique_lock<std::mutex>>* locks) const;
  void ExportPendingLocked(int64_t min_version, const PendingAlloc& alloc, size_t s0,
                           size_t s1) const;
  // Shard `shard`, or every shard when it is negative: [first, last).
  std::pair<size_t, size_t> ShardRange(int shard) const {
    if (shard < 0) return {0, shards_.size()};
    return {static_cast<size_t>(shard), static_cast<size_t>(shard) + 1};
  }
  // Admits key (hash h, absent), seen
  // `occurrences` times in this batch: occurrence by occurrence, as separate
  // lookups would, each is one more sighting, and the threshold-th gets a row
  // (room permitting). Returns the row or kNoRow; *refused counts the
  // occurrences that got no row, *sightings the count the new row starts with.
  uint32_t Admit(Shard& shard, int64_t key, uint64_t h, uint32_t occurrences,
                 int64_t now, int64_t version, int64_t access_threshold, Tally* tally,
                 uint32_t* refused, uint64_t* sightings);
  // CheckApply's checks; with handles (batch not null), the batch is
  // grouped by their shards on the way, as Apply then needs it.
  std::string CheckApplyTo(const Optimizer& opt, Batch* batch, const int64_t* handles, int64_t n,
                           const Runner& run) const;
  // The rows Export writes of a shard whose lock the caller holds that are
  // in memory (refs; those on disk: disk.ForEachSince).
  std::vector<uint32_t> PickRows(const Shard& s, int64_t min_version) const;
  // Brings up the cold rows of a batch's keys in every shard, before a
  // lookup or an apply by key changes anything (a read error then changes no
  // row). (*spills)[s] is shard s's spill count after: the pass that follows
  // under the shard's lock again promotes anew only if a concurrent step
  // spilled meanwhile. "" or the first error.
  // With dedup, each shard's ids are deduplicated first (Batch::Dedup).
  std::string PromoteBatch(Batch* batch, bool dedup, int64_t version,
                           std::vector<int64_t>* spills, const Runner& run);
  // The pass's own promotion of shard s (lock held), if one is needed.
  std::string PromoteAgain(Shard& shard, int64_t s, const Batch& batch, int64_t version,
                           const std::vector<int64_t>& spills,
                           std::vector<int64_t>* unreadable) {
    // (No first pass ran, spills empty: a table without a disk.)
    if (spills.empty() || shard.disk.spilled() == spills[s]) return "";
    const int64_t b = batch.begin[s];
    return ShardError(s, shard.disk.Promote(shard, batch.id + b, batch.hash + b,
                                            batch.distinct(s), version, unreadable));
  }
  // Find's read of the rows of batch positions `misses` that are on disk.
  std::string ReadCold(const Shard& shard, const Batch& batch, const std::vector<int64_t>& misses,
                       const OutputMode& mode) const;
  // Deduplicates each shard's ids of the batch, side by side.
  void Dedup(Batch* batch, const Runner& run) const;
  // "shard s: error" (an error of shard s's disk tier; "" stays "").
  static std::string ShardError(int64_t s, const std::string& error) {
    return error.empty() ? error : "shard " + std::to_string(s) + ": " + error;
  }
  // Calls fn(p, row or kNoRow) for shard s's distinct keys of the batch (p
  // indexes the batch's partition order; each key is resolved just before
  // its call, so keys an earlier call inserted are found; Shard::FindEach).
  template <typename Fn>
  void ForEachResolved(const Shard& shard, const Batch& batch, int64_t s, LookupKind kind,
                       Fn&& fn) const;
  // Records hold rows in the layout's forms (row_codec.h). `scratch`: floats
  // a call may use, kept by the caller from row to row.
  // A row's values, decoded (d floats).
  void ReadValues(const char* rec, float* out) const {
    DecodeRow(layout_.values_type, layout_.ValueBlock(rec), config_.dim, out);
  }
  // A new row: key's initial values, and every slot row at its initial value.
  void InitRecord(int64_t key, char* rec, std::vector<float>* scratch) const {
    if (layout_.values_type == StorageType::kFloat32) {
      InitialRow(config_, key, Values(rec));
    } else {
      scratch->resize(config_.dim);
      InitialRow(config_, key, scratch->data());
      EncodeRow(layout_.values_type, scratch->data(), config_.dim, layout_.ValueBlock(rec));
    }
    InitSlots(rec, scratch);
  }
  void InitSlots(char* rec, std::vector<float>* scratch) const {
    const int d = config_.dim;
    scratch->resize(d);
    char* slot = layout_.SlotBlocks(rec);
    for (int k = 0; k < config_.num_slots; ++k, slot += layout_.slot_bytes) {
      std::fill(scratch->begin(), scratch->end(), config_.slot_init[k]);
      EncodeRow(layout_.slots_type, scratch->data(), d, slot);
    }
  }
  // A record's lines, for writing, ahead of its update: its first 192
  // bytes (at most 4 lines), so a dim-16 record (56-152 B) whole and a
  // longer one's start, which the L2 streamer follows with the rest (every
  // line of four records ahead would overfill the core's fill buffers).
  GRAPHMOD_PREFETCHER void PrefetchForUpdate(const char* rec) const {
    constexpr size_t kMostBytes = 192;
    PrefetchLines</*kForWrite=*/1>(rec, std::min(layout_.stride, kMostBytes));
  }
  // One optimizer step on a record: in place in float32, else decoded into
  // scratch, updated in float32 and encoded back.
  void UpdateRecord(const Optimizer& opt, char* rec, const float* grad,
                    std::vector<float>* scratch) const {
    const int d = config_.dim;
    if (layout_.float32()) {
      UpdateRow(opt, Values(rec), Values(rec) + d, grad, d);
      return;
    }
    scratch->resize(static_cast<size_t>(d) * (1 + config_.num_slots));
    float* row = scratch->data();
    ReadValues(rec, row);
    char* slot = layout_.SlotBlocks(rec);
    for (int k = 0; k < config_.num_slots; ++k, slot += layout_.slot_bytes)
      DecodeRow(layout_.slots_type, slot, d, row + d * (k + 1));
    UpdateRow(opt, row, row + d, grad, d);
    EncodeRow(layout_.values_type, row, d, layout_.ValueBlock(rec));
    slot = layout_.SlotBlocks(rec);
    for (int k = 0; k < config_.num_slots; ++k, slot += layout_.slot_bytes)
      EncodeRow(layout_.slots_type, row + d * (k + 1), d, slot);
  }

  const TableConfig config_;
  const RecordLayout layout_;
  int shard_bits_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<int64_t> version_{0};
  std::atomic<int64_t> rows_{0};  // live rows of a bounded table (max_rows >= 0)
  std::atomic<int64_t> admitted_{0}, rejected_{0}, evicted_{0}, stale_{0}, lookups_{0},
      ids_looked_up_{0};
  std::atomic<int64_t> latest_{0};
  mutable BatchPool batches_;  // their buffers, kept between calls
};

template <class Rows>
template <typename Fn>
void ShardedTable<Rows>::ForEachResolved(const Shard& shard, const Batch& batch, int64_t s,
                                          LookupKind kind, Fn&& fn) const {
  const int64_t b = batch.begin[s];
  shard.FindEach(batch.id + b, batch.hash + b, batch.distinct_end[s] - b, kind,
                 [&](int64_t i, uint32_t row) { fn(b + i, row); });
}

template <class Rows>
TableCounters ShardedTable<Rows>::counters() const {
  TableCounters c;
  c.rows = size();
  c.admitted = admitted_.load();
  c.rejected = rejected_.load();
  c.evicted = evicted_.load();
  c.latest = latest_.load();
  c.stale = stale_.load();
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    c.pending += static_cast<int64_t>(s->admission.exact.size());
    s->disk.AddCounters(&c);
  }
  c.lookups = lookups_.load();
  c.ids_looked_up = ids_looked_up_.load();
  return c;
}

template <class Rows>
uint32_t ShardedTable<Rows>::Admit(Shard& shard, int64_t key, uint64_t h, uint32_t occurrences,
                                   int64_t now, int64_t version, int64_t access_threshold,
                                   Tally* tally, uint32_t* refused, uint64_t* sightings) {
  const uint64_t threshold = static_cast<uint64_t>(std::max<int64_t>(access_threshold, 1));
  PendingCount* pending = nullptr;
  uint32_t row = kNoRow;
  uint32_t k = 0;
  for (; k < occurrences && row == kNoRow; ++k) {
    const uint64_t seen =
        access_threshold > 1 ? shard.admission.Sight(key, h, now, version, &pending) : 1;
    if (seen < threshold) continue;
    bool made_room = false;
    row = shard.Insert(key, h, now, static_cast<uint32_t>(version), &made_room);
    if (row == kNoRow) continue;  // no room: refused, as is the next try
    tally->evicted += made_room;
    *sightings = seen + (occurrences - k - 1);
  }
  if (row == kNoRow) {  // every occurrence refused: no row, no gradient
    *refused = occurrences;
    return kNoRow;
  }
  *refused = k - 1;
  if (pending != nullptr) shard.admission.exact.Erase(key);
  ++tally->admitted;
  return row;
}

template <class Rows>
void ShardedTable<Rows>::Dedup(Batch* batch, const Runner& run) const {
  const int64_t n = batch->begin[config_.num_shards];
  run(config_.num_shards, (n / config_.num_shards + 1) * 30, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) batch->Dedup(s);
  });
}

template <class Rows>
std::string ShardedTable<Rows>::FindOrInsert(const int64_t* keys, int64_t n, int64_t now,
                                              int64_t access_threshold, float* values,
                                              int64_t* handles, const Runner& run) {
  if (n == 0) return "";
  AdvanceLatest(now);
  // Every id before the distinct ones (counted below): counters() reads
  // lookups_ first, so a read racing this call never sees fewer ids than
  // distinct ones.
  ids_looked_up_ += n;
  const BatchPool::Lease lease = batches_.Take();
  Batch& batch = *lease;
  batch.Partition(keys, n, false, true, config_.num_shards, run);
  const int d = config_.dim;
  // Rows looked up carry the version the next Apply will stamp: an
  // incremental export of "everything after version v" includes rows
  // inserted (or counted, or stamped) after v, and a full table spares them.
  const int64_t version = version_.load() + 1;
  std::vector<int64_t> spills;
  if (tiered()) {  // (which deduplicates each shard's ids first)
    const std::string failed = PromoteBatch(&batch, true, version, &spills, run);
    if (!failed.empty()) return failed;
  } else {
    Dedup(&batch, run);
  }
  const int64_t u = batch.Distinct();
  lookups_ += u;
  const OutputMode mode(batch, n, u, d, values, handles);
  std::atomic<bool> any_refused{false};
  FirstError error;
  run(config_.num_shards, (n / config_.num_shards + 1) * 150, [&](int64_t s0, int64_t s1) {
    Tally tally;
    std::vector<int64_t> unreadable;
    std::vector<float> scratch;
    for (int64_t s = s0; s < s1; ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      shard.Reserve(0, version);  // lets a layout forget moves no handle follows any more
      unreadable.clear();
      // (A read failing here, after a concurrent spill, fails the call with
      // the other keys' rows looked up: unlike the first pass, rarely.)
      error.Note(PromoteAgain(shard, s, batch, version, spills, &unreadable));
      ForEachResolved(shard, batch, s, LookupKind::kTrain, [&](int64_t p, uint32_t row) {
        const int64_t key = batch.id[p];
        const uint32_t occurrences = batch.count[p];
        float* out = mode.Out(p);
        // Sightings the row's access count gets: every occurrence, plus
        // those counted while the key waited for admission.
        uint64_t sightings = occurrences;
        uint32_t refused = 0;  // of the id's first occurrences, those that got no row
        const bool added = row == kNoRow;
        if (added && !unreadable.empty() &&
            std::find(unreadable.begin(), unreadable.end(), key) != unreadable.end()) {
          refused = occurrences;  // its row is on disk, unread: the call fails
        } else if (added) {
          row = Admit(shard, key, batch.hash[p], occurrences, now, version, access_threshold,
                      &tally, &refused, &sightings);
          tally.rejected += refused;
        }
        batch.refused[p] = refused;
        if (refused > 0) any_refused = true;
        if (row == kNoRow) {  // every occurrence reads the missing value
          MissingRow(config_, key, out);
          mode.Handle(p, -1);
          return;
        }
        char* rec = shard.rows.Record(row);
        RecordHeader* h = Header(rec);
        if (added) {
          InitRecord(key, rec, &scratch);
          h->count = 0;
          h->last_seen = now;
        }
        h->count = AddCount(h->count, sightings);
        h->last_seen = std::max(h->last_seen, now);  // batches may come out of time order
        shard.changes.NoteChanged(row, h->version, added);
        h->version = static_cast<uint32_t>(version);
        // Straight out, the first occurrence reads the missing value if it
        // was refused; gathered, the fix-up below sees to that.
        if (!mode.gather && refused > 0) {
          MissingRow(config_, key, out);
          batch.found[p] = ShardHandle(s, shard.rows.HandleBits(row));
          if (handles != nullptr) handles[batch.order[p]] = -1;
          return;
        }
        ReadValues(rec, out);
        mode.Handle(p, ShardHandle(s, shard.rows.HandleBits(row)));
      });
      if (!mode.gather) {
        // The repeats: an id refused its first occurrences reads the missing
        // value there and its row from then on (found by handle: a later
        // insert of this pass may have moved it).
        for (int64_t q = batch.distinct_end[s]; q < batch.begin[s + 1]; ++q) {
          const uint32_t f = batch.first[q];
          float* out = values + batch.order[q] * d;
          int64_t handle = batch.found[f];
          uint32_t ref;
          if (batch.count[q] < batch.refused[f]) {
            MissingRow(config_, batch.id[q], out);
            handle = -1;
          } else if (batch.refused[f] == 0) {
            CopyRow(out, values + batch.order[f] * d, d);
          } else if (shard.rows.Resolve(HandleBitsOf(handle), &ref)) {
            ReadValues(shard.rows.Record(ref), out);
          } else {  // (a layout keeps a lookup's handles resolvable: not seen)
            MissingRow(config_, batch.id[q], out);
            handle = -1;
          }
          if (handles != nullptr) handles[batch.order[q]] = handle;
        }
      }
      // Over its memory budget, the shard moves rows this step did not use to disk.
      error.Note(ShardError(s, shard.disk.Spill(shard, version)));
    }
    admitted_ += tally.admitted;
    rejected_ += tally.rejected;
    evicted_ += tally.evicted;
  });
  if (!mode.gather) return error.Take();
  mode.GatherOut(run);
  if (!any_refused) return error.Take();
  // An id refused its first occurrences reads the missing value (handle -1)
  // there and its row from then on.
  run(config_.num_shards, (n / config_.num_shards + 1) * 10, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      for (int64_t p = batch.begin[s]; p < batch.begin[s + 1]; ++p) {
        const bool repeat = p >= batch.distinct_end[s];
        const uint32_t j = repeat ? batch.first[p] : static_cast<uint32_t>(p);
        if ((repeat ? batch.count[p] : 0) >= batch.refused[j]) continue;
        MissingRow(config_, batch.id[p], values + batch.order[p] * d);
        if (handles != nullptr) handles[batch.order[p]] = -1;
      }
    }
  });
  return error.Take();
}

template <class Rows>
std::string ShardedTable<Rows>::Find(const int64_t* keys, int64_t n, float* values,
                                      const Runner& run) const {
  if (n == 0) return "";
  const BatchPool::Lease lease = batches_.Take();
  Batch& batch = *lease;
  batch.Partition(keys, n, false, true, config_.num_shards, run);
  Dedup(&batch, run);
  const int d = config_.dim;
  const OutputMode mode(batch, n, batch.Distinct(), d, values, nullptr);
  FirstError error;
  run(config_.num_shards, (n / config_.num_shards + 1) * 100, [&](int64_t s0, int64_t s1) {
    std::vector<int64_t> misses;  // batch positions without a row in memory
    for (int64_t s = s0; s < s1; ++s) {
      const Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      misses.clear();
      ForEachResolved(shard, batch, s, LookupKind::kRead, [&](int64_t p, uint32_t row) {
        float* out = mode.Out(p);
        if (row != kNoRow) {
          ReadValues(shard.rows.Record(row), out);
        } else {
          misses.push_back(p);  // on disk, or missing
        }
      });
      if (!misses.empty()) error.Note(ShardError(s, ReadCold(shard, batch, misses, mode)));
      if (mode.gather) continue;
      for (int64_t q = batch.distinct_end[s]; q < batch.begin[s + 1]; ++q)
        CopyRow(values + batch.order[q] * d, values + batch.order[batch.first[q]] * d, d);
    }
  });
  if (mode.gather) mode.GatherOut(run);
  return error.Take();
}

template <class Rows>
std::string ShardedTable<Rows>::ReadCold(const Shard& shard, const Batch& batch,
                                         const std::vector<int64_t>& misses,
                                         const OutputMode& mode) const {
  // A read-only lookup reads cold rows where they are (nothing moves).
  if (shard.disk.rows() == 0) {  // (every table without a disk)
    for (int64_t p : misses) MissingRow(config_, batch.id[p], mode.Out(p));
    return "";
  }
  const size_t stride = layout_.stride;
  std::vector<int64_t> keys(misses.size());
  for (size_t i = 0; i < misses.size(); ++i) keys[i] = batch.id[misses[i]];
  std::unique_ptr<char[]> buf(new char[keys.size() * stride]);
  const std::string error = shard.disk.Read(keys.data(), keys.size(), buf.get());
  for (size_t i = 0; i < keys.size(); ++i) {
    float* out = mode.Out(misses[i]);
    const char* rec = buf.get() + i * stride;
    if (Header(rec)->key == keys[i]) {
      ReadValues(rec, out);
    } else {
      MissingRow(config_, keys[i], out);  // absent (or unreadable: the call fails)
    }
  }
  return error;
}

template <class Rows>
std::string ShardedTable<Rows>::CheckApply(const Optimizer& opt, const int64_t* ids,
                                            bool ids_are_handles, int64_t n,
                                            const Runner& run) const {
  if (!ids_are_handles) return CheckApplyTo(opt, nullptr, nullptr, 0, run);
  const BatchPool::Lease lease = batches_.Take();
  return CheckApplyTo(opt, &*lease, ids, n, run);
}

template <class Rows>
std::string ShardedTable<Rows>::CheckApplyTo(const Optimizer& opt, Batch* batch,
                                              const int64_t* handles, int64_t n,
                                              const Runner& run) const {
  if (SlotsNeeded(opt.kind) > config_.num_slots)
    return "the optimizer needs " + std::to_string(SlotsNeeded(opt.kind)) +
           " slot rows per key but the table was created with " +
           std::to_string(config_.num_slots);
  if (batch == nullptr) return "";
  // A handle the layout cannot have made comes from elsewhere (a reset
  // shard's old handles are stale instead, and dropped by Apply). Checked in
  // parallel, the first wrong position is reported (the smallest).
  std::atomic<int64_t> first_wrong{n};
  auto wrong = [&](int64_t i) {
    for (int64_t seen = first_wrong.load(); i < seen && !first_wrong.compare_exchange_weak(seen, i);) {
    }
  };
  run(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)  // (a lookup that got no row is -1)
      if (handles[i] >= 0 && HandleShard(handles[i]) >= static_cast<uint64_t>(config_.num_shards))
        return wrong(i);
  });
  if (first_wrong.load() == n) {
    batch->Partition(handles, n, true, false, config_.num_shards, run);
    // Shard by shard, each under its own lock only.
    run(config_.num_shards, (n / config_.num_shards + 1) * 10, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        std::lock_guard<std::mutex> lock(shards_[s]->mu);
        for (int64_t p = batch->begin[s]; p < batch->begin[s + 1]; ++p)
          if (!shards_[s]->rows.MayOwn(HandleBitsOf(batch->id[p]))) wrong(batch->order[p]);
      }
    });
  }
  const int64_t i = first_wrong.load();
  if (i == n) return "";
  return "row handle " + std::to_string(handles[i]) + " at position " + std::to_string(i) +
         " does not belong to this table";
}

template <class Rows>
std::string ShardedTable<Rows>::Apply(const Optimizer& opt, const int64_t* ids,
                                       bool ids_are_handles, const float* grads, int64_t n,
                                       const Runner& run) {
  const BatchPool::Lease lease = batches_.Take();
  Batch& batch = *lease;
  // Every id is checked before any row changes, so a bad one updates nothing
  // (handles are grouped by shard on the way).
  const std::string bad = CheckApplyTo(opt, ids_are_handles ? &batch : nullptr, ids, n, run);
  if (!bad.empty()) return bad;
  if (!ids_are_handles) batch.Partition(ids, n, false, false, config_.num_shards, run);
  // Rows are updated in memory only: the keys' cold rows come up first.
  std::vector<int64_t> spills;
  if (!ids_are_handles && tiered()) {
    const std::string failed = PromoteBatch(&batch, false, version_.load() + 1, &spills, run);
    if (!failed.empty()) return failed;
  }
  FirstError error;
  const uint32_t version = static_cast<uint32_t>(++version_);
  if (n == 0) return "";
  const int d = config_.dim;
  std::atomic<int64_t> stale{0};
  const int64_t per_shard = n / config_.num_shards + 1;
  run(config_.num_shards, per_shard * (200 + 10 * d), [&](int64_t s0, int64_t s1) {
    std::vector<float> scratch;
    for (int64_t s = s0; s < s1; ++s) {
      RowGroups& groups = batch.groups[s];
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      groups.Reset(batch.begin[s + 1] - batch.begin[s], d);
      int64_t dropped = 0;
      if (ids_are_handles) {
        // What each Resolve reads is fetched a few handles ahead: its line
        // (a generation, a bucket header) is a miss at random.
        constexpr int64_t kHandlesAhead = 8;
        const int64_t end = batch.begin[s + 1];
        for (int64_t p = batch.begin[s]; p < std::min(end, batch.begin[s] + kHandlesAhead); ++p)
          shard.rows.PrefetchHandle(HandleBitsOf(batch.id[p]));
        for (int64_t p = batch.begin[s]; p < end; ++p) {
          if (p + kHandlesAhead < end)
            shard.rows.PrefetchHandle(HandleBitsOf(batch.id[p + kHandlesAhead]));
          // Freed since the lookup (removed, evicted, cleared): another key
          // may hold the row now.
          uint32_t row;
          if (!shard.rows.Resolve(HandleBitsOf(batch.id[p]), &row)) {
            ++dropped;
            continue;
          }
          groups.Add(row, grads + batch.order[p] * d);
        }
      } else {  // keys, resolved with the lookups' prefetching pipeline
        std::vector<int64_t> unreadable;  // stay on disk: their gradients are not applied
        error.Note(PromoteAgain(shard, s, batch, version, spills, &unreadable));
        ForEachResolved(shard, batch, s, LookupKind::kRead, [&](int64_t p, uint32_t row) {
          if (row != kNoRow) groups.Add(row, grads + batch.order[p] * d);
        });
      }
      stale += dropped;
      // Each row is updated once, with the sum of its gradients (what TF's
      // sparse apply does); records are prefetched a few rows ahead.
      constexpr size_t kRowsAhead = 4;
      const size_t rows = groups.size();
      for (size_t k = 0; k < std::min(kRowsAhead, rows); ++k)
        PrefetchForUpdate(shard.rows.Record(groups.row(k)));
      for (size_t k = 0; k < rows; ++k) {
        if (k + kRowsAhead < rows)
          PrefetchForUpdate(shard.rows.Record(groups.row(k + kRowsAhead)));
        char* rec = shard.rows.Record(groups.row(k));
        UpdateRecord(opt, rec, groups.grad(k), &scratch);
        shard.changes.NoteChanged(groups.row(k), Header(rec)->version, false);
        Header(rec)->version = version;
      }
    }
  });
  stale_ += stale.load();
  return error.Take();
}

template <class Rows>
int64_t ShardedTable<Rows>::Remove(const int64_t* keys, int64_t n) {
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = HashKey(keys[i]);
    Shard& shard = ShardOf(h);
    std::lock_guard<std::mutex> lock(shard.mu);
    removed += shard.Remove(keys[i], h);
  }
  return removed;
}

template <class Rows>
int64_t ShardedTable<Rows>::Evict(int64_t before, const Runner& run) {
  // Shards side by side: each scans its own rows (a pass over the table).
  std::atomic<int64_t> removed{0};
  run(config_.num_shards, static_cast<int64_t>(size() / config_.num_shards + 1) * 20,
      [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          Shard& shard = *shards_[s];
          std::lock_guard<std::mutex> lock(shard.mu);
          removed += shard.Evict(before);
        }
      });
  evicted_ += removed.load();
  return removed.load();
}

template <class Rows>
std::vector<uint32_t> ShardedTable<Rows>::PickRows(const Shard& s, int64_t min_version) const {
  // Live rows with version >= min_version. A shard tracking changes since a
  // mark below min_version finds them among its changed rows (a delta costs
  // what changed, not the table); those freed since have version 0 (Erase),
  // and a row freed and reused holds its new key.
  std::vector<uint32_t> rows;
  if (s.changes.tracking() && min_version > s.changes.mark()) {
    rows = s.changes.DirtyRows();
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](uint32_t row) { return s.HeaderOf(row)->version < min_version; }),
               rows.end());
  } else {
    s.rows.ForEachLive([&](uint32_t row, const char* rec) {
      if (Header(rec)->version >= min_version) rows.push_back(row);
    });
  }
  return rows;
}

template <class Rows>
std::string ShardedTable<Rows>::Prefetch(const int64_t* keys, int64_t n, const Runner& run) {
  if (!tiered() || n == 0) return "";
  const BatchPool::Lease lease = batches_.Take();
  Batch& batch = *lease;
  batch.Partition(keys, n, false, true, config_.num_shards, run);
  FirstError error;
  run(config_.num_shards, (n / config_.num_shards + 1) * 50, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      batch.Dedup(s);
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      const int64_t b = batch.begin[s];
      error.Note(ShardError(s, shard.disk.Prefetch(shard, batch.id + b, batch.hash + b,
                                                   batch.distinct(s), version_.load())));
    }
  });
  return error.Take();
}

template <class Rows>
std::string ShardedTable<Rows>::PromoteBatch(Batch* batch, bool dedup, int64_t version,
                                              std::vector<int64_t>* spills, const Runner& run) {
  spills->assign(config_.num_shards, 0);
  FirstError error;
  const int64_t per_shard = batch->begin[config_.num_shards] / config_.num_shards + 1;
  run(config_.num_shards, per_shard * 50, [&](int64_t s0, int64_t s1) {
    std::vector<int64_t> unreadable;
    for (int64_t s = s0; s < s1; ++s) {
      if (dedup) batch->Dedup(s);
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      const int64_t b = batch->begin[s];
      error.Note(ShardError(s, shard.disk.Promote(shard, batch->id + b, batch->hash + b,
                                                  batch->distinct(s), version, &unreadable)));
      (*spills)[s] = shard.disk.spilled();
    }
  });
  return error.Take();
}

template <class Rows>
int64_t ShardedTable<Rows>::CountRows(int64_t min_version, int shard) const {
  int64_t n = 0;
  const auto [s0, s1] = ShardRange(shard);
  for (size_t si = s0; si < s1; ++si) {
    const Shard& s = *shards_[si];
    std::lock_guard<std::mutex> lock(s.mu);
    // Every live row has a version >= 0: no need to visit them.
    if (min_version <= 0) {
      n += static_cast<int64_t>(s.size());
      continue;
    }
    // A cold segment that cannot be read is not counted: the export that
    // follows reads it again and fails with its error.
    size_t cold = 0;
    s.disk.CountSince(min_version, &cold);
    n += static_cast<int64_t>(PickRows(s, min_version).size() + cold);
  }
  return n;
}

template <class Rows>
std::string ShardedTable<Rows>::Export(
    int64_t min_version, int shard, int64_t chunk_rows,
    const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
    const std::function<std::string(int64_t n)>& emit, const PendingAlloc* pending) const {
  // Every shard read is locked before anything is counted, so the counts and
  // the rows agree although other workers' steps run meanwhile (they wait
  // for a shard until its rows are copied).
  const auto [s0, s1] = ShardRange(shard);
  std::vector<std::unique_lock<std::mutex>> locks = LockShards(s0, s1);
  if (pending != nullptr) ExportPendingLocked(min_version, *pending, s0, s1);
  return ExportRows(min_version, s0, s1, chunk_rows, alloc, emit, &locks);
}

template <class Rows>
std::string ShardedTable<Rows>::ExportRows(
    int64_t min_version, size_t s0, size_t s1, int64_t chunk_rows,
    const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
    const std::function<std::string(int64_t n)>& emit,
    std::vector<std::unique_lock<std::mutex>>* locks) const {
  std::vector<std::vector<uint32_t>> picked;
  int64_t total = 0;
  for (size_t si = s0; si < s1; ++si) {
    picked.push_back(PickRows(*shards_[si], min_version));
    size_t cold = 0;
    const std::string error = shards_[si]->disk.CountSince(min_version, &cold);
    if (!error.empty()) return ShardError(static_cast<int64_t>(si), error);
    total += static_cast<int64_t>(picked.back().size() + cold);
  }
  // Rows go out in chunks of chunk_rows: the caller's buffers hold a chunk,
  // not the shard (whose cold rows are not in memory at all).
  chunk_rows = std::max<int64_t>(1, chunk_rows);
  const size_t values_bytes = layout_.values_bytes,
               slots_bytes = layout_.slot_bytes * config_.num_slots;
  ExportBuffers out;
  int64_t done = 0, n = 0, i = 0;  // rows emitted, this chunk's size, rows in it
  auto begin_chunk = [&] {
    n = std::min(chunk_rows, total - done);
    i = 0;
    out = alloc(total, n);
  };
  begin_chunk();
  // Copies one record into the chunk; emits a full chunk that is not the last.
  auto write = [&](const char* rec) -> std::string {
    const RecordHeader* h = Header(rec);
    if (out.keys) out.keys[i] = h->key;
    // The rows as stored (a checkpoint keeps a table's forms).
    if (out.values)
      std::memcpy(static_cast<char*>(out.values) + i * values_bytes, layout_.ValueBlock(rec),
                  values_bytes);
    if (out.slots)
      std::memcpy(static_cast<char*>(out.slots) + i * slots_bytes, layout_.SlotBlocks(rec),
                  slots_bytes);
    if (out.counts) out.counts[i] = h->count;
    if (out.last_seen) out.last_seen[i] = h->last_seen;
    if (out.versions) out.versions[i] = h->version;
    if (++i < n || done + n == total) return "";
    done += n;
    const std::string error = emit(n);
    if (error.empty()) begin_chunk();
    return error;
  };
  for (size_t si = s0; si < s1; ++si) {
    const Shard& s = *shards_[si];
    for (uint32_t row : picked[si - s0]) {
      const std::string error = write(s.rows.Record(row));
      if (!error.empty()) return error;
    }
    // Cold rows are read in segment order, 1 MB at a time: memory holds a
    // scan buffer, not the disk, and the disk is read once, in order.
    std::string emitted;
    const std::string error = s.disk.ForEachSince(min_version, [&](const char* rec) {
      emitted = write(rec);
      return emitted;
    });
    if (!emitted.empty()) return emitted;
    if (!error.empty()) return ShardError(static_cast<int64_t>(si), error);
    (*locks)[si - s0].unlock();  // its rows are in the chunks (copies, not pointers)
  }
  return emit(n);  // the last chunk (empty when there are no rows)
}

template <class Rows>
std::string ShardedTable<Rows>::Import(const int64_t* keys, const void* values,
                                        const void* slots, const int64_t* counts,
                                        const int64_t* last_seen, const int64_t* versions,
                                        int64_t n, bool replace, const Runner& run) {
  for (int64_t i = 0; counts != nullptr && i < n; ++i)
    if (counts[i] < 0) return "negative access count " + std::to_string(counts[i]) +
                              " for key " + std::to_string(keys[i]);
  if (replace) Clear();
  const size_t values_bytes = layout_.values_bytes,
               slots_bytes = layout_.slot_bytes * config_.num_slots;
  std::mutex mu;  // guards the two maxima below
  int64_t max_version = 0, max_seen = 0;
  const BatchPool::Lease lease = batches_.Take();
  Batch& batch = *lease;
  batch.Partition(keys, n, false, false, config_.num_shards, run);
  // Shards import side by side (a restore of a large table).
  FirstError error;
  run(config_.num_shards, (n / config_.num_shards + 1) * 200, [&](int64_t s0, int64_t s1) {
    int64_t top_version = 0, top_seen = 0;
    std::vector<float> scratch;
    for (int64_t s = s0; s < s1; ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      // A shard with a disk imports in pieces of a quarter of its budget and
      // spills after each, so memory holds its budget, not its share of the
      // checkpoint. Any row may go (an import runs between steps; a handle
      // of this step whose row goes turns stale, as after a Remove).
      // (A budget that is a fraction grows with the rows: the piece with it.)
      const int64_t b = batch.begin[s], e = batch.begin[s + 1];
      for (int64_t c = b, c_end; c < e; c = c_end) {
        c_end = c + shard.disk.ImportPiece(e - c, shard.rows.size());
        shard.Reserve(static_cast<size_t>(c_end - c), version_.load() + 1);
        // An imported row replaces its cold copy (counted again below).
        const size_t gone = shard.disk.Erase(batch.id + c, c_end - c);
        if (shard.max_rows >= 0) rows_.fetch_sub(static_cast<int64_t>(gone));
        for (int64_t p = c; p < c_end; ++p) {
          const int64_t i = batch.order[p];
          bool added;
          // A restore brings back every row, even beyond max_rows.
          const uint32_t row = shard.FindOrAdd(keys[i], batch.hash[p], &added);
          char* rec = shard.rows.Record(row);
          if (!shard.admission.exact.empty()) shard.admission.exact.Erase(keys[i]);
          RecordHeader* h = Header(rec);
          shard.changes.NoteChanged(row, h->version, added);
          std::memcpy(layout_.ValueBlock(rec), static_cast<const char*>(values) + i * values_bytes,
                      values_bytes);
          if (slots != nullptr) {
            std::memcpy(layout_.SlotBlocks(rec),
                        static_cast<const char*>(slots) + i * slots_bytes, slots_bytes);
          } else {
            InitSlots(rec, &scratch);
          }
          h->count = counts ? AddCount(0, counts[i]) : 0;
          h->last_seen = last_seen ? last_seen[i] : 0;
          h->version = versions ? static_cast<uint32_t>(versions[i]) : 0;
          top_version = std::max<int64_t>(top_version, h->version);
          top_seen = std::max(top_seen, h->last_seen);
        }
        error.Note(ShardError(s, shard.disk.Spill(shard, std::numeric_limits<int64_t>::max())));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    max_version = std::max(max_version, top_version);
    max_seen = std::max(max_seen, top_seen);
  });
  AdvanceLatest(max_seen);
  // Later updates must carry versions above every imported one.
  int64_t cur = version_.load();
  while (cur < max_version && !version_.compare_exchange_weak(cur, max_version)) {
  }
  return error.Take();
}

template <class Rows>
int64_t ShardedTable<Rows>::CountPending(int64_t min_version, int shard) const {
  int64_t n = 0;
  const auto [s0, s1] = ShardRange(shard);
  for (size_t si = s0; si < s1; ++si) {
    std::lock_guard<std::mutex> lock(shards_[si]->mu);
    for (const auto& entry : shards_[si]->admission.exact.entries())
      n += entry.second.version >= min_version;
  }
  return n;
}

template <class Rows>
void ShardedTable<Rows>::ExportPending(int64_t min_version, const PendingAlloc& alloc,
                                       int shard) const {
  const auto [s0, s1] = ShardRange(shard);
  const auto locks = LockShards(s0, s1);  // a consistent count and contents
  ExportPendingLocked(min_version, alloc, s0, s1);
}

template <class Rows>
void ShardedTable<Rows>::ExportPendingLocked(int64_t min_version, const PendingAlloc& alloc,
                                             size_t s0, size_t s1) const {
  int64_t n = 0;
  for (size_t si = s0; si < s1; ++si) {
    for (const auto& entry : shards_[si]->admission.exact.entries())
      n += entry.second.version >= min_version;
  }
  const int64_t sketch = static_cast<int64_t>(shards_[0]->admission.sketch.size() * (s1 - s0));
  const PendingBuffers out = alloc(n, sketch);
  // A failed allocator said so and returned no buffers.
  if ((n > 0 && out.keys == nullptr) || (sketch > 0 && out.sketch == nullptr)) return;
  int64_t i = 0, c = 0;
  for (size_t si = s0; si < s1; ++si) {
    const Shard& s = *shards_[si];
    for (const auto& [key, p] : s.admission.exact.entries()) {
      if (p.version < min_version) continue;
      out.keys[i] = key;
      out.counts[i] = p.count;
      out.last_seen[i] = p.last_seen;
      ++i;
    }
    for (uint32_t v : s.admission.sketch.cells())
      out.sketch[c++] = static_cast<int32_t>(std::min<uint32_t>(v, INT32_MAX));
  }
}

template <class Rows>
std::string ShardedTable<Rows>::ImportPending(const int64_t* keys, const int64_t* counts,
                                               const int64_t* last_seen, int64_t n,
                                               const int32_t* sketch, int64_t sketch_count) {
  for (int64_t i = 0; i < n; ++i)
    if (counts[i] < 0) return "negative admission count " + std::to_string(counts[i]) +
                              " for key " + std::to_string(keys[i]);
  // A table that counts exactly (or only reads, as in evaluation) has no use
  // for a saved sketch; one with another sketch cannot map its counters.
  if (sketch_size() == 0) sketch_count = 0;
  if (sketch_count != 0 && sketch_count != sketch_size())
    return "the admission sketch has " + std::to_string(sketch_count) +
           " counters but this table's has " + std::to_string(sketch_size()) +
           " (sketch_width or num_shards differ)";
  int64_t max_seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = HashKey(keys[i]);
    Shard& shard = ShardOf(h);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.Find(keys[i], h) != kNoRow || shard.disk.Holds(keys[i])) continue;
    // Counted now, as far as incremental checkpoints go (see PendingCount::version).
    shard.admission.exact.Set(
        keys[i], PendingCount{AddCount(0, counts[i]), last_seen[i], version_.load() + 1});
    max_seen = std::max(max_seen, last_seen[i]);
  }
  AdvanceLatest(max_seen);
  int64_t c = 0;  // sketch_count is 0 or every shard's counters, in shard order
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    for (uint32_t& v : s->admission.sketch.cells()) {
      if (c == sketch_count) break;
      v = static_cast<uint32_t>(std::max<int32_t>(sketch[c++], 0));
    }
  }
  return "";
}

template <class Rows>
int64_t ShardedTable<Rows>::TrackRemovals() {
  std::vector<std::unique_lock<std::mutex>> locks;  // no change goes unnoted or half-noted
  for (auto& s : shards_) locks.emplace_back(s->mu);
  const int64_t version = version_.load();
  for (auto& s : shards_) {
    if (s->changes.tracking()) continue;
    s->changes.Start(version);
    Shard& shard = *s;
    shard.rows.ForEachLive([&](uint32_t row, const char* rec) {  // changed since, if any
      if (Header(rec)->version > version) shard.changes.NoteDirty(row);
    });
  }
  return version;
}

template <class Rows>
void ShardedTable<Rows>::ExportRemoved(int64_t since,
                                        const std::function<int64_t*(int64_t n)>& alloc) {
  std::vector<std::unique_lock<std::mutex>> locks;
  int64_t n = 0;
  for (auto& s : shards_) {
    locks.emplace_back(s->mu);
    // Notes from before `since` are in the save made at `since`: forget them,
    // and the changed rows it holds (version <= since).
    const Shard& shard = *s;
    s->changes.Forget(since, [&](uint32_t row) { return shard.HeaderOf(row)->version; });
    n += static_cast<int64_t>(s->changes.removed().size());
  }
  int64_t* out = alloc(n);
  if (out == nullptr) return;  // a failed allocator said so
  for (const auto& s : shards_)
    for (const auto& e : s->changes.removed()) *out++ = e.first;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_SHARDED_TABLE_H_
