#include "native/memory.h"

#include <new>

#include <sys/mman.h>

namespace graphmod {

// Big tables are read at random, so a lookup on 4 KB pages pays a TLB miss
// for the index and another for the record: big allocations ask for huge
// pages (a hint; the kernel may decline, which is harmless).
Memory AllocateAligned(size_t bytes) {
  void* p;
  if (bytes < kHugePage) {
    p = std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
  } else {
    bytes = (bytes + kHugePage - 1) & ~(kHugePage - 1);
    p = std::aligned_alloc(kHugePage, bytes);
#ifdef MADV_HUGEPAGE
    if (p != nullptr) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  }
  if (p == nullptr) throw std::bad_alloc();
  return Memory(static_cast<char*>(p));
}

}  // namespace graphmod
