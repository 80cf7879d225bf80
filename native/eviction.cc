#include "native/eviction.h"

namespace graphmod {

namespace {

class Lru final : public EvictionStrategy {
 public:
  const char* name() const override { return "lru"; }
  bool Before(const RecordHeader& a, const RecordHeader& b) const override {
    return a.last_seen != b.last_seen ? a.last_seen < b.last_seen : a.count < b.count;
  }
};

class Lfu final : public EvictionStrategy {
 public:
  const char* name() const override { return "lfu"; }
  bool Before(const RecordHeader& a, const RecordHeader& b) const override {
    return a.count != b.count ? a.count < b.count : a.last_seen < b.last_seen;
  }
};

const Lru kLru;
const Lfu kLfu;
// Every strategy a table can be configured with.
const EvictionStrategy* const kStrategies[] = {&kLru, &kLfu};

}  // namespace

const EvictionStrategy& LeastRecentlyUsed() { return kLru; }
const EvictionStrategy& LeastFrequentlyUsed() { return kLfu; }

const EvictionStrategy* FindEvictionStrategy(const std::string& name) {
  for (const EvictionStrategy* s : kStrategies)
    if (name == s->name()) return s;
  return nullptr;
}

bool WhenFull::Parse(const std::string& name, WhenFull* out) {
  if (name == "refuse") {
    *out = Refuse();
    return true;
  }
  const EvictionStrategy* s = FindEvictionStrategy(name);
  if (s == nullptr) return false;
  *out = Evict(*s);
  return true;
}

}  // namespace graphmod
