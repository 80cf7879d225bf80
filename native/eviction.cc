#include "native/eviction.h"

namespace graphmod {

bool ParseCapacityPolicy(const std::string& name, CapacityPolicy* out) {
  if (name == "refuse") *out = CapacityPolicy::kRefuse;
  else if (name == "lru") *out = CapacityPolicy::kLru;
  else if (name == "lfu") *out = CapacityPolicy::kLfu;
  else return false;
  return true;
}

}  // namespace graphmod
