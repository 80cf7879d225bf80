// Bit-level helpers every part of the table shares: the key hash (shards,
// index groups, sketch counters and batch dedup all derive from it, so they
// must agree) and saturating 32-bit counters (access counts, admission counts).
#ifndef GRAPHMOD_NATIVE_BITS_H_
#define GRAPHMOD_NATIVE_BITS_H_

#include <cstdint>
#include <limits>

namespace graphmod {

// Murmur3's 64-bit finalizer: every input bit reaches every output bit, so
// sequential or strided ids spread evenly over shards and groups.
inline uint64_t Mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}
inline uint64_t HashKey(int64_t key) { return Mix(static_cast<uint64_t>(key)); }

// count + inc, held at 2^32-1 instead of wrapping: a hot key's count must
// never fall back to a cold one's.
inline uint32_t AddCount(uint32_t count, uint64_t inc) {
  const uint64_t c = count + inc;
  return c > std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max()
                                                  : static_cast<uint32_t>(c);
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_BITS_H_
