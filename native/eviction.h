// Eviction strategies: which row a full table gives up for a new key
// (sampled near the new key's place, in a strategy's order), which rows a
// disk tier spills first, and which rows a time-based Evict removes.
#ifndef GRAPHMOD_NATIVE_EVICTION_H_
#define GRAPHMOD_NATIVE_EVICTION_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "native/row_store.h"

namespace graphmod {

// An eviction strategy orders rows by how readily the table gives them up:
// which row a full table evicts for a new key (sampled near it, see
// PickVictimNear) and which rows a disk tier spills first. A strategy is a
// stateless singleton found by name (FindEvictionStrategy), so a new one is
// a class and a line in eviction.cc's list; the table compares candidates
// only through Before (as HierarchicalKV's strategies are score functors).
class EvictionStrategy {
 public:
  // The name TableConfig/TableSettings use ("lru", "lfu").
  virtual const char* name() const = 0;
  // Whether row a goes before row b (a strict weak order).
  virtual bool Before(const RecordHeader& a, const RecordHeader& b) const = 0;

 protected:
  ~EvictionStrategy() = default;
};

// The least recently seen first (then the least often).
const EvictionStrategy& LeastRecentlyUsed();
// The least often seen first (then the least recently).
const EvictionStrategy& LeastFrequentlyUsed();
// The strategy called `name`, or nullptr.
const EvictionStrategy* FindEvictionStrategy(const std::string& name);

// What a training lookup of a new key does in a table at max_rows: evict a
// row in the order of a strategy, or refuse the key (it gets no row, reads
// the missing value, handle -1).
struct WhenFull {
  const EvictionStrategy* evict;  // nullptr: refuse

  // "refuse", or a strategy's name.
  static bool Parse(const std::string& name, WhenFull* out);
  static WhenFull Refuse() { return WhenFull{nullptr}; }
  static WhenFull Evict(const EvictionStrategy& s) { return WhenFull{&s}; }
  const char* name() const { return evict == nullptr ? "refuse" : evict->name(); }
  // The order a disk tier spills in: the eviction order (least recently
  // used when refusing).
  const EvictionStrategy& spill_order() const {
    return evict != nullptr ? *evict : LeastRecentlyUsed();
  }
  bool operator==(const WhenFull& o) const { return evict == o.evict; }
  bool operator!=(const WhenFull& o) const { return evict != o.evict; }
};

// Rows the current step looked up (stamped with its clock and the version
// of its coming Apply) are spared: its gradients may still reach them by
// handle.
inline bool SparedThisStep(const RecordHeader& r, int64_t now, uint32_t step_version) {
  return r.last_seen >= now && r.version >= step_version;
}

// Whether a time-based Evict(before) removes the row.
inline bool Expired(const RecordHeader& r, int64_t before) { return r.last_seen < before; }

// Sampled eviction, as Redis and HierarchicalKV do it: the victim is the
// first in `order` of the live rows the layout visits near hash h (its
// VisitNear: until 8 candidates), sparing this step's rows.
// Returns the victim's ref, or Rows::kNoRow when every candidate is spared.
template <class Rows>
uint32_t PickVictimNear(const Rows& rows, uint64_t h, const EvictionStrategy& order,
                        int64_t now, uint32_t step_version) {
  uint32_t victim = Rows::kNoRow;
  const RecordHeader* worst = nullptr;
  rows.VisitNear(h, [&](uint32_t ref, const char* rec) {
    const RecordHeader* r = Header(rec);
    if (SparedThisStep(*r, now, step_version)) return false;
    if (worst == nullptr || order.Before(*r, *worst)) {
      worst = r;
      victim = ref;
    }
    return true;
  });
  return victim;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_EVICTION_H_
