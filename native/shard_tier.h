// The disk layer of one table shard (TableConfig::memory_budget): the rows
// the shard keeps on disk (a LogTier), its memory budget, and the two moves
// between its layout (memory) and the disk:
//   Promote brings the cold rows of a batch's keys up into the layout before
//     a step reads or updates them (rows are read and updated in memory only);
//   Spill sends the shard's least valuable rows down once memory holds more
//     than the budget.
// A row moves as its record's bytes, whole (values, slots, count,
// last_seen, version), so a tiered table trains exactly as an all-in-memory
// one. Moves are neither changes nor removals: the change log does not see
// them, and deltas find changed cold rows by the version in their records'
// headers (ForEachSince, which reads the segments that may hold some).
//
// A shard without a budget has an empty layer: nothing is on disk, every
// move is a no-op and every query answers "not here", so the table above
// calls the layer unconditionally instead of branching on whether it exists.
//
// Not thread-safe: the shard's mutex guards it (as the rest of the shard).
#ifndef GRAPHMOD_NATIVE_SHARD_TIER_H_
#define GRAPHMOD_NATIVE_SHARD_TIER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "native/eviction.h"
#include "native/log_tier.h"
#include "native/row_store.h"
#include "native/table.h"

namespace graphmod {

template <class Rows>
struct TableShard;

template <class Rows>
class ShardTier {
 public:
  using Shard = TableShard<Rows>;
  static constexpr uint32_t kNoRow = Rows::kNoRow;

  // Rows a lookup stamped within this many table versions stay in memory:
  // their handles may still come with gradients (asynchronous workers' steps
  // overlap: other workers' applies advance the version between a lookup and
  // its own apply). The buckets layout keeps moved handles as long
  // (RowBuckets::kMovesKeptVersions). A budget smaller than what 16 steps
  // look up is exceeded by the difference (and by rows staged for the next
  // step).
  static constexpr int64_t kSparedVersions = 16;

  ShardTier(const TableConfig& config, const RecordLayout& layout)
      : stride_(layout.stride), spill_order_(config.when_full.spill_order()) {
    if (config.memory_budget > 1) {  // bytes of records, split evenly over the shards
      budget_rows_ = std::max<size_t>(
          1, static_cast<size_t>(config.memory_budget / layout.stride / config.num_shards));
    } else if (config.memory_budget > 0) {
      budget_fraction_ = config.memory_budget;
    }
  }

  // Opens the disk store in dir; "" or the error.
  std::string Open(const std::string& dir) {
    TierOptions options;
    options.dir = dir;
    options.record_bytes = stride_;
    // Shards already read side by side (the lookup's runner): two preads in
    // flight each keep a disk busy without a thread pool per core per shard.
    options.read_threads = 2;
    std::string error;
    store_ = LogTier::Open(options, &error);
    return error;
  }

  // Rows on disk.
  size_t rows() const { return store_ ? static_cast<size_t>(store_->counters().rows) : 0; }
  bool Holds(int64_t key) const { return store_ && store_->Contains(key); }
  // Rows memory may hold given `memory_rows` in it now: a fixed number, or
  // a fraction of the shard's rows in both layers.
  size_t BudgetRows(size_t memory_rows) const {
    if (budget_fraction_ <= 0) return budget_rows_;
    const double all = static_cast<double>(memory_rows + rows());
    return std::max<size_t>(1, static_cast<size_t>(std::ceil(budget_fraction_ * all)));
  }
  // How many of `n` imported rows go in before a spill: a quarter of the
  // budget (at least 1024), so an import holds the budget, not its share of
  // the checkpoint; all of them without a disk.
  int64_t ImportPiece(int64_t n, size_t memory_rows) const {
    if (!store_) return n;
    return std::min<int64_t>(n, std::max<int64_t>(1024, BudgetRows(memory_rows) / 4));
  }
  // Rows moved down by Spill, ever: a step that saw this count change since
  // its first promotion promotes again (a concurrent step spilled).
  int64_t spilled() const { return spilled_; }

  // Forgets the cold copies of n keys; returns how many were here.
  size_t Erase(const int64_t* keys, size_t n) { return store_ ? store_->Erase(keys, n) : 0; }
  // Erases the cold rows last seen before `before` (their scores are on
  // disk: the tier reads the segments that may hold some); fn(key) for each.
  // Returns how many. A segment that cannot be read keeps its rows (an
  // eviction is a clean-up, not a promise): the error goes to stderr.
  template <class Fn>
  size_t EvictBefore(int64_t before, Fn&& fn) {
    if (!store_) return 0;
    std::vector<int64_t> cold;
    const std::string error = store_->KeysSeenBefore(before, &cold);
    if (!error.empty())
      std::fprintf(stderr, "graphmod: a time eviction left cold rows on disk: %s\n",
                   error.c_str());
    store_->Erase(cold.data(), cold.size());
    for (int64_t key : cold) fn(key);
    return cold.size();
  }
  // fn(record) for each cold row with version >= min_version (every one:
  // min_version <= 0), read in segment order, 1 MB at a time; "" or the
  // first error (the tier's or fn's).
  std::string ForEachSince(int64_t min_version,
                           const std::function<std::string(const char*)>& fn) const {
    return store_ ? store_->ForEachSince(min_version, fn) : "";
  }
  // How many cold rows have version >= min_version (a scan for
  // min_version > 0); "" or the first read error.
  std::string CountSince(int64_t min_version, size_t* n) const {
    *n = 0;
    if (min_version <= 0) {
      *n = rows();
      return "";
    }
    return ForEachSince(min_version, [&](const char*) {
      ++*n;
      return std::string();
    });
  }
  template <class Fn>
  void ForEachKey(Fn&& fn) const {
    if (store_) store_->ForEachKey(fn);
  }
  // Reads n keys' records into out (n * stride); an absent key's record, or
  // one that could not be read, keeps a header whose key is not its own
  // (~key). "" or the first read error.
  std::string Read(const int64_t* keys, size_t n, char* out) const {
    for (size_t i = 0; i < n; ++i) Header(out + i * stride_)->key = ~keys[i];
    if (!store_ || n == 0) return "";
    std::unique_ptr<bool[]> found(new bool[n]());
    return store_->Read(keys, n, out, found.get());
  }
  // Brings the cold rows of n keys (memory misses among them; hashes h) into
  // the shard's layout, in one batched disk read. Keys whose record could
  // not be read stay on disk and go to *unreadable (the caller must not give
  // them a new row); returns "" or the first read error. With stage_for > 0
  // (a prefetch), stages the keys for the step stamping stage_for (see
  // Staged) and counts the moves as prefetched, else as promoted.
  std::string Promote(Shard& shard, const int64_t* keys, const uint64_t* h, size_t n,
                      int64_t version, std::vector<int64_t>* unreadable, int64_t stage_for = 0) {
    if (!store_ || store_->counters().rows == 0) return "";
    std::vector<std::pair<int64_t, uint64_t>> misses;  // (key, hash); an apply's keys repeat
    const int64_t spared_then = stage_for - kSparedVersions + 1;  // by that step's spill
    const auto sort_out = [&](int64_t i, uint32_t ref) {
      if (ref == kNoRow)
        misses.emplace_back(keys[i], h[i]);
      else if (stage_for > 0 && shard.HeaderOf(ref)->version < spared_then)
        staged_.push_back({keys[i], h[i], stage_for});
    };
    shard.FindEach(keys, h, static_cast<int64_t>(n), LookupKind::kRead, sort_out);
    std::sort(misses.begin(), misses.end());
    misses.erase(std::unique(misses.begin(), misses.end()), misses.end());
    std::vector<int64_t> cold(misses.size());
    for (size_t i = 0; i < misses.size(); ++i) cold[i] = misses[i].first;
    std::unique_ptr<bool[]> on_disk(new bool[misses.size()]);
    store_->Contains(cold.data(), cold.size(), on_disk.get());
    cold.clear();
    std::vector<uint64_t> cold_h;
    for (size_t i = 0; i < misses.size(); ++i) {
      if (on_disk[i]) {
        cold.push_back(misses[i].first);
        cold_h.push_back(misses[i].second);
      }
    }
    if (cold.empty()) return "";
    std::unique_ptr<char[]> buf(new char[cold.size() * stride_]);
    const std::string error = Read(cold.data(), cold.size(), buf.get());
    shard.Reserve(cold.size(), version);
    std::vector<int64_t> moved;
    for (size_t i = 0; i < cold.size(); ++i) {
      const char* rec = buf.get() + i * stride_;
      if (Header(rec)->key != cold[i]) {
        unreadable->push_back(cold[i]);
        continue;
      }
      const uint32_t ref = shard.rows.Insert(cold[i], cold_h[i]);
      std::memcpy(shard.rows.Record(ref), rec, stride_);
      // Changed since the last full save: a delta must list it (by ref now).
      if (shard.changes.tracking() && Header(rec)->version > shard.changes.mark())
        shard.changes.NoteDirty(ref);
      moved.push_back(cold[i]);
      if (stage_for > 0) staged_.push_back({cold[i], cold_h[i], stage_for});
    }
    store_->Erase(moved.data(), moved.size());
    (stage_for > 0 ? prefetched_ : promoted_) += static_cast<int64_t>(moved.size());
    return error;
  }

  // Brings up the cold rows of n keys the next step will look up (its
  // lookup then finds them in memory) and stages them for that step: moves
  // only, no row changes. table_version: the table's version now. "" or
  // the first read error (an unreadable row stays on disk; the step's
  // lookup fails on it as it would have).
  std::string Prefetch(Shard& shard, const int64_t* keys, const uint64_t* h, size_t n,
                       int64_t table_version) {
    if (!store_) return "";
    // The step under way stamps version + 1 (as a lookup would); the next one,
    // the step these keys are for, version + 2.
    const int64_t version = table_version + 1;
    DropStaged(version - 1);
    // Steps that do not advance the version (no apply) would let it grow:
    // a prefetch keeps at most the last few batches' worth (oldest go first).
    if (staged_.size() > 4 * n) staged_.erase(staged_.begin(), staged_.end() - 4 * n);
    std::vector<int64_t> unreadable;
    return Promote(shard, keys, h, n, version, &unreadable, version + 1);
  }

  // Moves rows to disk while memory holds more than the budget, down to 95%
  // of it (so spills come in batches), in when_full's spill order (least
  // recently used first; least often under "lfu"), never a row looked up by
  // the last kSparedVersions steps nor one staged for a coming step
  // (step_version: the step under way's; larger than every version spares
  // nothing). Returns "" or the write error; then the rows stay in memory.
  std::string Spill(Shard& shard, int64_t step_version) {
    if (!store_) return "";
    Rows& rows = shard.rows;
    const size_t budget = BudgetRows(rows.size());
    if (rows.size() <= budget) return "";
    const size_t keep = budget - budget / 20;
    const int64_t spared_from = step_version - kSparedVersions + 1;
    DropStaged(step_version - 1);
    std::vector<uint32_t> staged_refs;
    for (const Staged& s : staged_) {
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
    std::nth_element(
        candidates.begin(), candidates.begin() + (k - 1), candidates.end(),
        [&](const auto& a, const auto& b) { return spill_order_.Before(a.first, b.first); });
    std::unique_ptr<char[]> buf(new char[k * stride_]);
    for (size_t i = 0; i < k; ++i)
      std::memcpy(buf.get() + i * stride_, rows.Record(candidates[i].second), stride_);
    const std::string error = store_->Put(buf.get(), k);
    if (!error.empty()) return error;
    for (size_t i = 0; i < k; ++i) {
      // Version 0, as an erase: a delta skips the freed ref in its changed rows.
      shard.HeaderOf(candidates[i].second)->version = 0;
      rows.Erase(candidates[i].second);
    }
    shard.changes.Trim(rows.size(), [&](uint32_t ref) { return shard.HeaderOf(ref)->version; });
    spilled_ += static_cast<int64_t>(k);
    return "";
  }

  // Forgets every cold row and staged key.
  void Clear() {
    staged_.clear();
    if (store_) store_->Clear();
  }

  // Adds this layer's counters to c.
  void AddCounters(TableCounters* c) const {
    c->promoted += promoted_;
    c->prefetched += prefetched_;
    c->spilled += spilled_;
    if (!store_) return;
    const TierCounters t = store_->counters();
    c->cold_rows += t.rows;
    c->disk_file_bytes += t.file_bytes;
    c->disk_live_bytes += t.live_bytes;
    c->disk_reads += t.reads;
    c->disk_read_bytes += t.read_bytes;
    c->read_passes += t.read_passes;
    c->compactions += t.compactions;
    c->compaction_seconds += t.compaction_seconds;
  }
  // Memory the layer holds (the cold index).
  int64_t Bytes() const { return store_ ? static_cast<int64_t>(store_->index_bytes()) : 0; }

 private:
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

  // Forgets staged keys whose step is older than `from`.
  void DropStaged(int64_t from) {
    staged_.erase(std::remove_if(staged_.begin(), staged_.end(),
                                 [from](const Staged& s) { return s.version < from; }),
                  staged_.end());
  }

  const size_t stride_;  // record bytes
  const EvictionStrategy& spill_order_;
  std::unique_ptr<LogTier> store_;  // null: no disk (no budget, or not opened)
  size_t budget_rows_ = 0;
  double budget_fraction_ = 0;
  int64_t promoted_ = 0, spilled_ = 0;  // rows a step moved up / rows moved down, ever
  int64_t prefetched_ = 0;              // rows a prefetch moved up, ever
  std::vector<Staged> staged_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_SHARD_TIER_H_
