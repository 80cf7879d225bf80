// Eviction strategies: which row a full table gives up for a new key
// (sampled LRU or LFU near the new key's place), and which rows a
// time-based Evict removes.
#ifndef GRAPHMOD_NATIVE_EVICTION_H_
#define GRAPHMOD_NATIVE_EVICTION_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

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
// (BetterVictim) of the live rows the layout visits near hash h (its
// VisitNear: until 8 candidates), sparing this step's rows.
// Returns the victim's ref, or Rows::kNoRow when every candidate is spared.
template <class Rows>
uint32_t PickVictimNear(const Rows& rows, uint64_t h, CapacityPolicy policy, int64_t now,
                        uint32_t step_version) {
  uint32_t victim = Rows::kNoRow;
  const RecordHeader* worst = nullptr;
  rows.VisitNear(h, [&](uint32_t ref, const char* rec) {
    const RecordHeader* r = Header(rec);
    if (SparedThisStep(*r, now, step_version)) return false;
    if (worst == nullptr || BetterVictim(policy, *r, *worst)) {
      worst = r;
      victim = ref;
    }
    return true;
  });
  return victim;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_EVICTION_H_
