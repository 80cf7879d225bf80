#include "native/key_index.h"

namespace graphmod {

Memory KeyIndex::EmptyGroups(size_t groups) {
  Memory memory = AllocateAligned(groups * sizeof(Group));
  Group* g = reinterpret_cast<Group*>(memory.get());
  for (size_t i = 0; i < groups; ++i) std::memset(g[i].ctrl, kEmpty, sizeof(g[i].ctrl));
  return memory;
}

}  // namespace graphmod
