// graphmod's embedding table: int64 key -> float row of `dim` values plus
// `num_slots` optimizer-slot rows and per-key metadata.
//
// This file knows nothing of TensorFlow; native/kernels.cc adapts it.
//
// Layout. The table is split into shards (power of two, chosen by the top bits
// of the key's hash) so one batch spreads over threads with one lock taken per
// shard and batch, never per key. Each shard has
//   - an index: Swiss-table style open addressing over groups of 12 slots,
//     each group one 64-byte cache line of control bytes (7-bit hash tag, or
//     empty/deleted, matched 16 at a time with one SIMD compare) and 32-bit
//     row numbers; it is rebuilt 1.5x larger as keys arrive;
//   - a row arena: blocks that never move once allocated, so a row's address
//     (its "handle") stays valid while the index grows. Blocks grow
//     geometrically up to 512 rows, so small tables stay small and large ones
//     waste at most one partly used block per shard.
// A record is [key | last_seen | count | version | values[dim] | slots[S*dim]].
// Admission: with an access threshold, keys without a row are counted (in a
// per-shard map of pending keys) and get a row on their threshold-th sighting.
// Eviction: Evict removes rows last seen before a time; a bounded table
// (max_rows) full of rows makes room for a new key by evicting, among the rows
// near the new key's index slot, the least recently or least frequently used.
// Keeping the key in the record (not in the index) makes the index about 5
// bytes per slot; the record is fetched anyway to copy the values out.
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

#include "native/initializer.h"
#include "native/optimizer_math.h"

namespace graphmod {

// What a training lookup of a new key does in a table at max_rows.
enum class CapacityPolicy {
  kRefuse,  // the key gets no row (reads the missing value, handle -1)
  kLru,     // evicts the least recently seen row nearby
  kLfu,     // evicts the least often seen row nearby
};

// Parses "refuse", "lru", "lfu".
bool ParseCapacityPolicy(const std::string& name, CapacityPolicy* out);

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
  CapacityPolicy when_full = CapacityPolicy::kLru;
  // How sightings of keys without a row are counted for admission: 0 = exactly,
  // per key; else in a count-min sketch of 4 rows of this many counters
  // (spread over the shards), bounded memory at a stated error (see README).
  int64_t sketch_width = 0;
};

// Returns "" when the config is usable, else what is wrong with it.
std::string ValidateConfig(const TableConfig& config);

// Runs fn(begin, end) over [0, n) in parallel. cost_per_unit is a rough count
// of cycles per unit, so the runner can decide how finely to split.
using Runner = std::function<void(int64_t n, int64_t cost_per_unit,
                                  const std::function<void(int64_t, int64_t)>& fn)>;
// Runs everything on the calling thread.
void SerialRunner(int64_t n, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn);

// Row handle: shard number in bits 48..62, the row's generation in bits 40..47
// and its row number in the low 40 bits. A row's generation advances each time
// the row is freed, so a handle kept past its row's removal (and the row's
// reuse by another key) is recognised as stale instead of updating that key.
constexpr int kHandleRowBits = 40;
constexpr int kHandleGenerationBits = 8;
constexpr int kHandleShardShift = kHandleRowBits + kHandleGenerationBits;

// Table-wide counts since the table was created.
struct TableCounters {
  int64_t rows = 0;      // live rows
  int64_t admitted = 0;  // rows training lookups created
  int64_t rejected = 0;  // lookups of keys that got no row (not admitted yet, or table full)
  int64_t evicted = 0;   // rows removed by Evict or to make room in a full table
  int64_t pending = 0;   // keys counted towards admission that have no row yet
  int64_t latest = 0;    // the largest `now` a training lookup has passed
  int64_t stale = 0;     // by-address gradients dropped: their row was removed (or reused)
};

// Pending keys as Export/ImportPending see them; sketch holds the count-min
// counters of a sketch-counting table (empty otherwise).
struct PendingBuffers {
  int64_t* keys = nullptr;
  int64_t* counts = nullptr;
  int64_t* last_seen = nullptr;
  int32_t* sketch = nullptr;
};

// Where Export writes; filled by the caller's allocator once the row count is
// known. slots holds num_slots*dim floats per row.
struct ExportBuffers {
  int64_t* keys = nullptr;
  float* values = nullptr;
  float* slots = nullptr;
  int64_t* counts = nullptr;
  int64_t* last_seen = nullptr;
  int64_t* versions = nullptr;
};

class EmbeddingTable {
 public:
  // The config must have passed ValidateConfig.
  explicit EmbeddingTable(TableConfig config);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const TableConfig& config() const { return config_; }
  int64_t size() const;
  // Bytes held by indexes and row arenas.
  int64_t memory_bytes() const;
  // Apply calls so far; rows updated by the n-th call, or looked up by
  // training lookups since the (n-1)-th, carry version n.
  int64_t version() const { return version_.load(); }

  TableCounters counters() const;

  // Training read: copies the row of every key into values (n*dim), inserting
  // rows for new keys; counts one access per occurrence and stamps last_seen
  // with `now`. handles (n, may be null) receive the row handles. With
  // access_threshold > 1 a new key gets its row on its access_threshold-th
  // sighting (counted over calls); before that it reads the missing value and
  // gets handle -1, as does a new key a full kRefuse table has no room for.
  void FindOrInsert(const int64_t* keys, int64_t n, int64_t now, int64_t access_threshold,
                    float* values, int64_t* handles, const Runner& run);
  // Read-only: keys without a row get the missing value (see TableConfig).
  void Find(const int64_t* keys, int64_t n, float* values, const Runner& run) const;
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
                         int64_t n) const;
  // Removes the keys' rows, or the admission counts of keys without one
  // (absent keys are ignored); returns rows removed.
  int64_t Remove(const int64_t* keys, int64_t n);
  // Removes every row and pending key last seen before `before`; returns the
  // rows removed. A sketch's counters are halved instead (they age).
  int64_t Evict(int64_t before);
  void Clear();
  // Writes every row whose version >= min_version. alloc(n) is called once,
  // under the table's locks, with the number of rows to write. Once removals
  // are tracked (below), a min_version above the last delta's mark reads only
  // the rows changed since that mark. With shard >= 0 (< num_shards), reads
  // that shard only, holding its lock only (a save copies a large table one
  // shard at a time).
  void Export(int64_t min_version, const std::function<ExportBuffers(int64_t n)>& alloc,
              int shard = -1) const;
  // How many rows Export would write now.
  int64_t CountRows(int64_t min_version, int shard = -1) const;
  // Inserts or overwrites rows; slots/counts/last_seen/versions may be null
  // (slots then start from slot_init, metadata from zero). With replace, the
  // table is cleared first. Returns "" or the error.
  std::string Import(const int64_t* keys, const float* values, const float* slots,
                     const int64_t* counts, const int64_t* last_seen,
                     const int64_t* versions, int64_t n, bool replace,
                     const Runner& run = SerialRunner);
  // Writes every pending key counted at version >= min_version (0: all) and
  // the sketch's counters (shard by shard, each shard's sketch_size() /
  // num_shards of them); alloc(n, counters) as for Export, and `shard` too.
  void ExportPending(int64_t min_version,
                     const std::function<PendingBuffers(int64_t n, int64_t sketch)>& alloc,
                     int shard = -1) const;
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
  void InitialRow(int64_t key, float* out) const;
  // What a key without a row reads (see TableConfig::missing_is_initializer).
  void MissingRow(int64_t key, float* out) const;

 private:
  struct Shard;
  struct Batch;
  void AdvanceLatest(int64_t now);
  // Shard `shard`, or every shard when it is negative: [first, last).
  std::pair<size_t, size_t> ShardRange(int shard) const;
  // The rows Export writes of a shard whose lock the caller holds.
  std::vector<uint32_t> PickRows(const Shard& s, int64_t min_version) const;
  Batch Partition(const int64_t* ids, int64_t n, bool ids_are_handles,
                  const Runner& run) const;
  // Calls fn(p, row or Shard::kNoRow, slot) for shard s's keys of the batch
  // (p indexes the batch's partition order), slot being the key's index slot
  // or, when absent, the free slot an insert would take (each key is
  // resolved just before its call, so keys an earlier call inserted are found).
  template <typename Fn>
  void ForEachResolved(const Shard& shard, const Batch& batch, int64_t s, Fn&& fn) const;

  TableConfig config_;
  int shard_bits_;
  size_t stride_;  // bytes per record
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<int64_t> version_{0};
  std::atomic<int64_t> rows_{0};  // live rows of a bounded table (max_rows >= 0)
  std::atomic<int64_t> admitted_{0}, rejected_{0}, evicted_{0}, stale_{0};
  std::atomic<int64_t> latest_{0};
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_H_
