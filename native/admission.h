// Admission: how a shard counts sightings of keys that have no row yet, so a
// table with an access threshold gives a key its row on its threshold-th
// sighting (rare keys never cost a row).
//
// Two counters: ExactAdmission keeps a count per pending key (exact, memory
// grows with the rare keys); CountMinSketch keeps a fixed grid of counters
// (bounded memory, may overestimate, never underestimates). A shard holds
// both (AdmissionCounter): the sketch counts when the table has one; the
// exact map still holds counts restored from a checkpoint.
#ifndef GRAPHMOD_NATIVE_ADMISSION_H_
#define GRAPHMOD_NATIVE_ADMISSION_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "native/bits.h"

namespace graphmod {

struct PendingCount {
  uint32_t count;
  int64_t last_seen;
  int64_t version = 0;  // as a row's: the version of the step that last counted it
};

class ExactAdmission {
 public:
  using Map = std::unordered_map<int64_t, PendingCount>;

  // The key's entry, created with count 0 and last_seen `now` if absent.
  PendingCount& Entry(int64_t key, int64_t now) {
    return pending_.try_emplace(key, PendingCount{0, now}).first->second;
  }
  // One more sighting at `now` in the step of `version`; returns the count.
  static uint64_t Sight(PendingCount* p, int64_t now, int64_t version) {
    p->count = AddCount(p->count, 1);
    if (now > p->last_seen) p->last_seen = now;
    p->version = version;
    return p->count;
  }
  void Set(int64_t key, const PendingCount& p) { pending_[key] = p; }
  bool Erase(int64_t key) { return pending_.erase(key) > 0; }
  // Drops the keys last seen before `before`, calling on_drop(key) for each.
  template <class OnDrop>
  void DropSeenBefore(int64_t before, const OnDrop& on_drop) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.last_seen >= before) {
        ++it;
        continue;
      }
      on_drop(it->first);
      it = pending_.erase(it);
    }
  }
  void Clear() { pending_ = {}; }  // releases the buckets too
  size_t size() const { return pending_.size(); }
  bool empty() const { return pending_.empty(); }
  const Map& entries() const { return pending_; }
  // A pending key costs a hash node (key, count, last_seen, next pointer)
  // and a bucket pointer.
  int64_t Bytes() const { return static_cast<int64_t>(pending_.size() * (40 + sizeof(void*))); }

 private:
  Map pending_;
};

// kRows rows of `cols` counters; a key's count is the least of its kRows
// counters (one per row, at independent hashes).
class CountMinSketch {
 public:
  static constexpr int kRows = 4;

  // cols counters per row, all zero; 0 disables the sketch.
  void Resize(size_t cols) {
    cols_ = cols;
    cells_.assign(kRows * cols, 0u);
  }
  bool enabled() const { return !cells_.empty(); }
  // One more sighting of the key with hash h; returns its estimated count.
  // Conservative update (only the counters at the minimum grow) keeps the
  // overestimate as small as count-min allows.
  uint64_t Add(uint64_t h);
  // The key's estimated count, unchanged.
  uint64_t Estimate(uint64_t h) const;
  // Ages every count by half (eviction of old sightings).
  void Halve() {
    for (uint32_t& c : cells_) c >>= 1;
  }
  void Clear() { std::fill(cells_.begin(), cells_.end(), 0u); }
  size_t size() const { return cells_.size(); }
  const std::vector<uint32_t>& cells() const { return cells_; }
  std::vector<uint32_t>& cells() { return cells_; }
  int64_t Bytes() const { return static_cast<int64_t>(cells_.size() * sizeof(uint32_t)); }

 private:
  size_t Cell(uint64_t h, int r) const {
    return r * cols_ + Mix(h + 0x9e3779b97f4a7c15ULL * (r + 1)) % cols_;
  }
  size_t cols_ = 0;
  std::vector<uint32_t> cells_;
};

struct AdmissionCounter {
  ExactAdmission exact;
  CountMinSketch sketch;

  // One sighting of key (hash h) at `now` in the step of `version`; returns
  // its count so far. *entry caches the key's exact entry between the
  // occurrences of one batch (start it at nullptr).
  uint64_t Sight(int64_t key, uint64_t h, int64_t now, int64_t version, PendingCount** entry) {
    if (sketch.enabled()) return sketch.Add(h);
    if (*entry == nullptr) *entry = &exact.Entry(key, now);
    return ExactAdmission::Sight(*entry, now, version);
  }
  int64_t Bytes() const { return exact.Bytes() + sketch.Bytes(); }
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_ADMISSION_H_
