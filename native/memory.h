// Cache-line and huge-page aligned allocations for the index and the row
// arena (both read at random, where TLB misses cost as much as cache misses).
#ifndef GRAPHMOD_NATIVE_MEMORY_H_
#define GRAPHMOD_NATIVE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

// For functions whose only effect is a prefetch: GCC takes an out-of-line
// one for side-effect free and deletes its calls (seen with GCC 12: the
// buckets layout's lookups ran with no prefetch at all).
#define GRAPHMOD_PREFETCHER inline __attribute__((always_inline))

namespace graphmod {

// Every 64-byte line of [p, p + bytes): a record packed at its stride may
// straddle lines, and a prefetch of its first line only leaves the rest to
// miss. kForWrite: the lines are about to be written.
template <int kForWrite = 0>
GRAPHMOD_PREFETCHER void PrefetchLines(const void* p, size_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  for (uintptr_t line = start & ~uintptr_t{63}; line < start + bytes; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), kForWrite);
}

constexpr size_t kHugePage = size_t{2} << 20;

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using Memory = std::unique_ptr<char, FreeDeleter>;

// At least `bytes`, aligned to 64 (whole cache lines); from 2 MB on, rounded
// up to and aligned on 2 MB and offered to transparent huge pages. Throws
// std::bad_alloc when the system has no memory to give.
Memory AllocateAligned(size_t bytes);

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_MEMORY_H_
