// Eviction strategies: which row a full table gives up for a new key
// (sampled LRU or LFU near the new key's index slot), and which rows a
// time-based Evict removes.
#ifndef GRAPHMOD_NATIVE_EVICTION_H_
#define GRAPHMOD_NATIVE_EVICTION_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "native/key_index.h"
#include "native/row_store.h"

namespace graphmod {

// What a training lookup of a new key does in a table at max_rows.
enum class CapacityPolicy {
  kRefuse,  // the key gets no row (reads the missing value, handle -1)
  kLru,     // evicts the least recently seen row nearby
  kLfu,     // evicts the least often seen row nearby
};

// Parses "refuse", "lru", "lfu".
bool ParseCapacityPolicy(const std::string& name, CapacityPolicy* out);

// Whether row a is a better victim than row b: LRU takes the least recently
// seen (then the least often), LFU the least often seen (then the least
// recently).
inline bool BetterVictim(CapacityPolicy policy, const RecordHeader& a, const RecordHeader& b) {
  return policy == CapacityPolicy::kLru
             ? (a.last_seen != b.last_seen ? a.last_seen < b.last_seen : a.count < b.count)
             : (a.count != b.count ? a.count < b.count : a.last_seen < b.last_seen);
}

// Rows the current step looked up (stamped with its clock and the version
// of its coming Apply) are spared: its gradients may still reach them by
// handle.
inline bool SparedThisStep(const RecordHeader& r, int64_t now, uint32_t step_version) {
  return r.last_seen >= now && r.version >= step_version;
}

// Whether a time-based Evict(before) removes the row.
inline bool Expired(const RecordHeader& r, int64_t before) { return r.last_seen < before; }

// Sampled LRU/LFU, as Redis and HierarchicalKV do it: the victim is the best
// (BetterVictim) of the live rows in the home group of the key with hash h
// and the groups after it (at least two groups and 8 candidates, at most 16
// groups), sparing this step's rows. Returns its index slot, or SIZE_MAX
// when every candidate is spared.
template <class Store>
size_t PickVictimNear(const KeyIndex& index, const Store& store, uint64_t h,
                      CapacityPolicy policy, int64_t now, uint32_t step_version) {
  if (index.groups() == 0) return SIZE_MAX;
  size_t victim = SIZE_MAX;
  const RecordHeader* worst = nullptr;
  int candidates = 0;
  size_t g = index.home_group(h);
  for (size_t step = 0; step < std::min<size_t>(index.groups(), 16) && (step < 2 || candidates < 8);
       ++step, g = index.next_group(g)) {
    for (size_t slot = g * KeyIndex::kGroup; slot < (g + 1) * KeyIndex::kGroup; ++slot) {
      if (!index.full(slot)) continue;
      const RecordHeader* r = Header(store.Record(index.row(slot)));
      if (SparedThisStep(*r, now, step_version)) continue;
      ++candidates;
      if (worst == nullptr || BetterVictim(policy, *r, *worst)) {
        worst = r;
        victim = slot;
      }
    }
  }
  return victim;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_EVICTION_H_
