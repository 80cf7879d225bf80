// graphmod's embedding table: int64 key -> float row of `dim` values plus
// `num_slots` optimizer-slot rows and per-key metadata.
//
// This file knows nothing of TensorFlow; native/kernels.cc adapts it.
//
// The table is split into shards (power of two, chosen by the top bits of
// the key's hash) so one batch spreads over threads with one lock taken per
// shard and batch, never per key. Each shard (native/sharded_table.h) has
//   - a key index (key_index.h): Swiss-table style groups of control bytes
//     and row numbers, rebuilt larger as keys arrive;
//   - a row store (row_store.h, the interface; arena_row_store.h, the
//     in-memory store): records that never move once allocated, so a row's
//     handle stays valid while the index grows;
//   - admission counters (admission.h): exact per pending key, or a
//     count-min sketch, so a key gets its row on its threshold-th sighting;
//   - eviction (eviction.h): a full table evicts the least recently or least
//     often used of the rows near the new key's index slot;
//   - a change log (change_log.h) of removed keys and changed rows for
//     incremental checkpoints.
// Optimizer updates are in optimizer_math.h, initial rows in initializer.h,
// batch dedup, partitioning and gradient summing in batch.h.
// Lookups are pipelined (group, then candidate record, then compare) so cold
// keys overlap their cache misses; big allocations ask for huge pages.
#ifndef GRAPHMOD_NATIVE_TABLE_H_
#define GRAPHMOD_NATIVE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "native/batch.h"
#include "native/eviction.h"
#include "native/initializer.h"
#include "native/optimizer_math.h"
#include "native/row_store.h"

namespace graphmod {

class TableImpl;  // native/sharded_table.h

struct TableConfig {
  std::string name;  // used in every error message
  int dim = 0;
  int num_slots = 0;
  std::vector<float> slot_init;  // initial value of each slot row, size num_slots
  Initializer init = Initializer::kTruncatedNormal;
  float init_a = 0.f;   // constant value | uniform low  | normal mean
  float init_b = 0.05f; // (unused)       | uniform high | normal stddev
  uint64_t seed = 0;
  int num_shards = 16;  // power of two
  // What a read-only Find returns for a key that has no row: the row the key
  // would be initialized with (true), or `default_value` in every element.
  bool missing_is_initializer = true;
  float default_value = 0.f;
  // At most this many rows (-1: no bound). What a training lookup of a new
  // key does in a full table is `when_full`; restores bring back every row
  // regardless.
  int64_t max_rows = -1;
  WhenFull when_full = WhenFull::Evict(LeastRecentlyUsed());
  // How sightings of keys without a row are counted for admission: 0 = exactly,
  // per key; else in a count-min sketch of 4 rows of this many counters
  // (spread over the shards), bounded memory at a stated error (see docs/tables.md).
  int64_t sketch_width = 0;
  // Where a shard keeps its rows (shard_storage.h): "buckets" (records
  // inline in hash buckets, one memory miss per key) or "arena" (a key index
  // over packed records: two dependent misses, fewer bytes per key).
  std::string layout = "arena";
  // A disk tier (log_tier.h) behind a memory budget: with memory_budget > 0
  // each shard keeps at most its share of the budget in memory and moves the
  // least recently used rows (least often under when_full "lfu") to files
  // under storage_path, bringing them back when a training lookup needs
  // them. In (0, 1]: a fraction of the table's rows; above 1: bytes of
  // records (indexes come on top). 0: every row in memory.
  double memory_budget = 0;
  std::string storage_path;  // a local directory; the table's files go in a fresh subdirectory
  // How records store the values and the slot rows (row_codec.h): float32,
  // or float16, bfloat16 or row-wise int8 (fewer bytes a row; lookups
  // decode, updates run in float32 and round the result to the form).
  StorageType values_type = StorageType::kFloat32;
  StorageType slots_type = StorageType::kFloat32;
};

// Returns "" when the config is usable, else what is wrong with it.
std::string ValidateConfig(const TableConfig& config);

// The initial values row `key` gets (deterministic in key and seed).
void InitialRow(const TableConfig& config, int64_t key, float* out);
// What a key without a row reads (see TableConfig::missing_is_initializer).
void MissingRow(const TableConfig& config, int64_t key, float* out);

// Table-wide counts since the table was created.
struct TableCounters {
  int64_t rows = 0;      // live rows
  int64_t admitted = 0;  // rows training lookups created
  int64_t rejected = 0;  // lookups of keys that got no row (not admitted yet, or table full)
  int64_t evicted = 0;   // rows removed by Evict or to make room in a full table
  int64_t pending = 0;   // keys counted towards admission that have no row yet
  int64_t latest = 0;    // the largest `now` a training lookup has passed
  int64_t stale = 0;     // by-address gradients dropped: their row was removed (or reused)
  // Ids training lookups were given, every occurrence, and the distinct ids
  // among them per call: their ratio is how much a batch repeats its ids.
  int64_t ids_looked_up = 0;
  int64_t lookups = 0;
  // With a disk tier: rows on disk now, and rows moved to disk / back, ever.
  int64_t cold_rows = 0;
  int64_t spilled = 0;
  int64_t promoted = 0;    // by training steps' lookups and applies
  int64_t prefetched = 0;  // by Prefetch, ahead of the step
  // 1 - promoted / lookups is the memory tier's hit ratio. The disk tier's
  // own counters (log_tier.h TierCounters), summed over the shards:
  int64_t disk_file_bytes = 0;
  int64_t disk_live_bytes = 0;
  int64_t disk_reads = 0;
  int64_t disk_read_bytes = 0;
  int64_t read_passes = 0;
  int64_t compactions = 0;
  double compaction_seconds = 0;
};

// Pending keys as Export/ImportPending see them; sketch holds the count-min
// counters of a sketch-counting table (empty otherwise).
struct PendingBuffers {
  int64_t* keys = nullptr;
  int64_t* counts = nullptr;
  int64_t* last_seen = nullptr;
  int32_t* sketch = nullptr;
};
// Where pending keys go, given how many and how many sketch counters; a
// failed allocation returns no buffers (having said why).
using PendingAlloc = std::function<PendingBuffers(int64_t n, int64_t sketch)>;

// Where Export writes; filled by the caller's allocator once the row count is
// known. Rows go out as the table stores them (row_codec.h): values holds a
// RowBytes(values_type, dim) block per row, slots num_slots blocks of
// RowBytes(slots_type, dim) (float32: dim and num_slots*dim floats).
struct ExportBuffers {
  int64_t* keys = nullptr;
  void* values = nullptr;
  void* slots = nullptr;
  int64_t* counts = nullptr;
  int64_t* last_seen = nullptr;
  int64_t* versions = nullptr;
};

class EmbeddingTable {
 public:
  // The config must have passed ValidateConfig. A table with a disk tier
  // opens its files here: check open_error() before any other call.
  explicit EmbeddingTable(TableConfig config);
  // "" or why the disk tier could not be opened (the table is then unusable).
  const std::string& open_error() const { return open_error_; }
  // The directory of the table's disk tier ("" without one).
  const std::string& tier_dir() const { return tier_dir_; }
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const TableConfig& config() const { return config_; }
  int64_t size() const;
  // Bytes held by indexes and row arenas.
  int64_t memory_bytes() const;
  // Apply calls so far; rows updated by the n-th call, or looked up by
  // training lookups since the (n-1)-th, carry version n.
  int64_t version() const;

  TableCounters counters() const;

  // Training read: copies the row of every key into values (n*dim), inserting
  // rows for new keys; counts one access per occurrence and stamps last_seen
  // with `now`. handles (n, may be null) receive the row handles. With
  // access_threshold > 1 a new key gets its row on its access_threshold-th
  // sighting (counted over calls); before that it reads the missing value and
  // gets handle -1, as does a new key a full kRefuse table has no room for.
  // Returns "" or an error of the disk tier (a cold row that could not be
  // read: it stays on disk, untouched; or a spill that could not be written:
  // its rows stay in memory). Then values and handles are not to be used.
  std::string FindOrInsert(const int64_t* keys, int64_t n, int64_t now,
                           int64_t access_threshold, float* values, int64_t* handles,
                           const Runner& run);
  // Read-only: keys without a row get the missing value (see TableConfig).
  // Cold rows are read where they are. "" or the disk tier's error.
  std::string Find(const int64_t* keys, int64_t n, float* values, const Runner& run) const;
  // A hint for a table with a disk tier (else nothing): brings up the cold
  // rows of keys the next training step will look up, and keeps them in
  // memory until it has. Rows move whole and none changes, so training is
  // the same with or without it. "" or the disk tier's read error.
  std::string Prefetch(const int64_t* keys, int64_t n, const Runner& run);
  // Sparse update. ids are keys, or handles from FindOrInsert when
  // ids_are_handles. Gradients of duplicate ids are summed first; gradients
  // of keys without a row (and of handle -1) are dropped, as are those of
  // stale handles (counted in counters().stale). Every id is checked before
  // any row changes: a handle of another table (or never handed out) is an
  // error and the call then updates nothing. Returns "" or the error.
  std::string Apply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                    const float* grads, int64_t n, const Runner& run);
  // The checks Apply makes before it changes anything: "" when Apply would
  // accept these ids, else the error (a fused apply of many tables checks
  // them all first, so a bad table changes no table).
  std::string CheckApply(const Optimizer& opt, const int64_t* ids, bool ids_are_handles,
                         int64_t n, const Runner& run = SerialRunner) const;
  // Removes the keys' rows, or the admission counts of keys without one
  // (absent keys are ignored); returns rows removed.
  int64_t Remove(const int64_t* keys, int64_t n);
  // Removes every row and pending key last seen before `before`; returns the
  // rows removed. A sketch's counters are halved instead (they age).
  int64_t Evict(int64_t before, const Runner& run = SerialRunner);
  void Clear();
  // Writes every row whose version >= min_version. alloc(n) is called once,
  // under the table's locks, with the number of rows to write. Once removals
  // are tracked (below), a min_version above the last delta's mark reads only
  // the rows changed since that mark. With shard >= 0 (< num_shards), reads
  // that shard only, holding its lock only.
  // Cold rows are read from disk in batches. Returns "" or the disk tier's
  // error (the buffers are then incomplete).
  std::string Export(int64_t min_version, const std::function<ExportBuffers(int64_t n)>& alloc,
                     int shard = -1) const;
  // What a save writes (native/save_kernel.cc): the pending keys
  // ExportPending(min_version) writes (pending(n, counters) as its alloc),
  // then the rows Export(min_version) writes in chunks of at most chunk_rows
  // rows: for each chunk, alloc(total, n) gives where its n rows go (total:
  // the rows of the whole export), then emit(n) takes them ("" or an error
  // that stops the export and is returned). One empty chunk when there are
  // no rows. Every shard's lock is taken before anything is counted and
  // each is released once its rows are copied: a step of another worker
  // (asynchronous training) waits for the shard rather than change it
  // between the count and the copy, so each key's values, slots, count and
  // version are of one moment and a key a concurrent step inserts is in
  // the snapshot or not, whole.
  std::string Snapshot(int64_t min_version, int64_t chunk_rows, const PendingAlloc& pending,
                       const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
                       const std::function<std::string(int64_t n)>& emit) const;
  // How many rows Export would write now.
  int64_t CountRows(int64_t min_version, int shard = -1) const;
  // Inserts or overwrites rows, given as the table stores them (as Export
  // writes them); slots/counts/last_seen/versions may be null (slots then
  // start from slot_init, metadata from zero). With replace, the table is
  // cleared first. Returns "" or the error.
  std::string Import(const int64_t* keys, const void* values, const void* slots,
                     const int64_t* counts, const int64_t* last_seen,
                     const int64_t* versions, int64_t n, bool replace,
                     const Runner& run = SerialRunner);
  // Writes every pending key counted at version >= min_version (0: all) and
  // the sketch's counters (shard by shard, each shard's sketch_size() /
  // num_shards of them); alloc(n, counters) as for Export, and `shard` too.
  void ExportPending(int64_t min_version, const PendingAlloc& alloc, int shard = -1) const;
  // How many pending keys ExportPending would write now.
  int64_t CountPending(int64_t min_version, int shard = -1) const;
  // Incremental checkpoints. From TrackRemovals() on (it returns version()),
  // every key that loses its row or pending count (Remove, Evict, eviction
  // when full, Clear) is noted with the version then. ExportRemoved(since)
  // writes the keys noted at version >= since (a delta's tombstones after a
  // save made at version `since`) and forgets older notes, which that save
  // holds (and so do the changed rows it lists for Export: `since` becomes
  // the mark); alloc(n) returns where to write, or null after a failure.
  int64_t TrackRemovals();
  void ExportRemoved(int64_t since, const std::function<int64_t*(int64_t n)>& alloc);
  // Sets the admission counts of keys that have no row (keys with a row are
  // skipped) and, when sketch_count > 0, the sketch's counters (sketch_count
  // must then be this table's sketch_size(); a table without a sketch ignores
  // them). Returns "" or the error.
  std::string ImportPending(const int64_t* keys, const int64_t* counts,
                            const int64_t* last_seen, int64_t n, const int32_t* sketch,
                            int64_t sketch_count);
  // Counters in the admission sketch (0 when counting exactly).
  int64_t sketch_size() const;

  // The initial values row `key` gets (deterministic in key and seed).
  void InitialRow(int64_t key, float* out) const { graphmod::InitialRow(config_, key, out); }
  // What a key without a row reads (see TableConfig::missing_is_initializer).
  void MissingRow(int64_t key, float* out) const { graphmod::MissingRow(config_, key, out); }

 private:
  TableConfig config_;
  std::string tier_dir_, open_error_;
  // The shards and their row store; one virtual call per batch.
  std::unique_ptr<TableImpl> impl_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_H_
