// The disk tier's cold index (native/log_tier.h): each cold key's record
// location and the scores eviction needs, in memory, so choosing victims or
// exporting entries reads no disk.
#ifndef GRAPHMOD_NATIVE_COLD_INDEX_H_
#define GRAPHMOD_NATIVE_COLD_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "native/bits.h"
#include "native/memory.h"

namespace graphmod {

// The cold index: open addressing with Robin Hood linear probing and
// backward-shift deletion (no tombstones, short probes at high load: a probe
// for an absent key stops at the first slot nearer its home than the probe
// is to the key's). One 32-byte slot per key (two per cache line): key 8 |
// last_seen 8 | count 4 | version 4 | segment 4 | record index 4. It grows
// 1.5x past 7/8 load and shrinks below 1/4, so it holds 37-55 bytes per key
// (~43 on average) while growing, more after mass erases down to 1/4. (The
// design note's 24-byte slot would drop version and keep last_seen as 4
// bytes relative to a base; TierEntry keeps both whole, so 32.)
// Not thread-safe: LogTier's mutex guards it.
class ColdIndex {
 public:
  struct Slot {
    int64_t key;
    int64_t last_seen;
    uint32_t count;
    uint32_t version;
    uint32_t segment;  // kEmpty: a free slot
    uint32_t index;
  };
  static_assert(sizeof(Slot) == 32, "two slots per cache line");
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t bytes() const { return capacity_ * sizeof(Slot); }

  Slot* Find(int64_t key);
  const Slot* Find(int64_t key) const { return const_cast<ColdIndex*>(this)->Find(key); }
  // Brings key's home slot into cache. A probe is a cache miss (the index is
  // far bigger than the caches) followed by a branch on the loaded slot,
  // which keeps the next probe's miss from overlapping; batched callers
  // prefetch kPrefetchAhead keys ahead (1M keys: ~150 -> ~70 ns a probe).
  // always_inline: GCC 12 otherwise finds the out-of-line call free of side
  // effects and deletes it, prefetch and all.
  __attribute__((always_inline)) void Prefetch(int64_t key) const {
    if (capacity_ != 0) __builtin_prefetch(slots() + Home(key));
  }
  static constexpr size_t kPrefetchAhead = 8;
  // The key's slot, added (key set, *added = true, the rest the caller's to
  // fill) when absent. Valid until the index next changes.
  Slot* Upsert(int64_t key, bool* added);
  // Room for n keys without growing (may throw std::bad_alloc; then nothing changed).
  void Reserve(size_t n);
  // Removes key; its slot's old contents go to *old.
  bool Erase(int64_t key, Slot* old);
  void Clear();

  template <class Fn>
  void ForEach(Fn&& fn) const {
    const Slot* s = reinterpret_cast<const Slot*>(slots_.get());
    for (size_t i = 0; i < capacity_; ++i)
      if (s[i].segment != kEmpty) fn(s[i]);
  }

 private:
  Slot* slots() const { return reinterpret_cast<Slot*>(slots_.get()); }
  // HashKey's top bits choose the shard, so all keys of one shard share them:
  // mix once more before scaling the top bits onto [0, capacity).
  size_t Home(int64_t key) const {
    const uint64_t h = Mix(HashKey(key));
    return static_cast<size_t>((static_cast<unsigned __int128>(h) * capacity_) >> 64);
  }
  size_t Distance(size_t i) const;  // of slot i from its key's home
  Slot* Place(const Slot& slot);    // inserts a key known to be absent, with room
  void Rehash(size_t capacity);

  Memory slots_;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_COLD_INDEX_H_
