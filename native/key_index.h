// The key index of one shard: key -> row number, Swiss-table style.
//
// Open addressing over groups of 12 slots, each group one 64-byte cache line:
// 16 control bytes (a 7-bit hash tag, or empty/deleted; 12 used, 4 masked
// off) matched at once with one SIMD compare, then the 12 slots' 32-bit row
// numbers. The index holds no keys: a candidate's key is read from its
// record through the row store (the record is fetched anyway to copy the
// values out), which keeps the index at about 5 bytes per slot. The index may
// be rebuilt (rows are re-placed, never moved: the row store owns them).
//
// Not thread-safe: the shard's mutex guards it. The probe takes the store's
// key lookup as a template argument so the hot path inlines it.
#ifndef GRAPHMOD_NATIVE_KEY_INDEX_H_
#define GRAPHMOD_NATIVE_KEY_INDEX_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "native/memory.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace graphmod {

class KeyIndex {
 public:
  static constexpr size_t kGroup = 12;
  static constexpr uint32_t kNoRow = 0xFFFFFFFFu;

  size_t groups() const { return groups_; }
  size_t slots() const { return groups_ * kGroup; }
  // Full slots == live rows. Written only under the shard's mutex, read
  // unlocked by EmbeddingTable::size(): relaxed loads and stores suffice, and
  // avoid a locked instruction (which waits for the index store before it)
  // on every insert.
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t deleted() const { return deleted_; }
  bool full(size_t slot) const { return Ctrl(slot) >= 0; }
  uint32_t row(size_t slot) const { return RowAt(slot); }

  // The group where a key's probe starts: hash bits 7..38 (clear of the tag
  // and of the shard bits) scaled onto [0, groups) by a multiply, so the
  // index can have any number of groups and grow by 1.5x instead of doubling.
  static size_t HomeGroup(uint64_t h, size_t groups) {
    return static_cast<size_t>(((h >> 7) & 0xFFFFFFFFULL) * groups >> 32);
  }
  size_t home_group(uint64_t h) const { return HomeGroup(h, groups_); }
  size_t next_group(size_t g) const { return g + 1 == groups_ ? 0 : g + 1; }

  // Probes for key (hash h); key_of(row) reads a row's key. Returns the slot
  // holding it (*found = true), or else the first free slot of its probe
  // sequence (valid only when HasRoomForOne()).
  template <class KeyOf>
  size_t Probe(int64_t key, uint64_t h, const KeyOf& key_of, bool* found) const {
    *found = false;
    if (groups_ == 0) return 0;
    const int8_t tag = Tag(h);
    size_t g = home_group(h);
    size_t free_slot = SIZE_MAX;
    for (size_t step = 0; step < groups_; ++step, g = next_group(g)) {
      const int8_t* c = index_[g].ctrl;
      for (uint32_t m = MatchTag(c, tag); m != 0; m &= m - 1) {
        const size_t i = __builtin_ctz(m);
        if (key_of(index_[g].row[i]) == key) {
          *found = true;
          return g * kGroup + i;
        }
      }
      if (free_slot == SIZE_MAX) {
        const uint32_t f = MatchFree(c);
        if (f != 0) free_slot = g * kGroup + __builtin_ctz(f);
      }
      if (MatchEmpty(c) != 0) break;  // an empty byte ends every probe chain through here
    }
    return free_slot;
  }

  template <class KeyOf>
  uint32_t FindRow(int64_t key, uint64_t h, const KeyOf& key_of) const {
    bool found;
    const size_t slot = Probe(key, h, key_of, &found);
    return found ? RowAt(slot) : kNoRow;
  }

  // Brings the key's first group into cache ahead of its probe.
  GRAPHMOD_PREFETCHER void PrefetchGroup(uint64_t h) const {
    if (groups_ != 0) __builtin_prefetch(&index_[home_group(h)]);
  }
  // Calls prefetch_row(row) for the first slot of the key's home group whose
  // tag matches (a false match, 12 in 128 at most, only wastes the prefetch).
  template <class PrefetchRow>
  GRAPHMOD_PREFETCHER void PrefetchCandidate(uint64_t h, const PrefetchRow& prefetch_row) const {
    if (groups_ == 0) return;
    const Group& g = index_[home_group(h)];
    const uint32_t m = MatchTag(g.ctrl, Tag(h));
    if (m != 0) prefetch_row(g.row[__builtin_ctz(m)]);
  }

  // Whether one more key fits at 7/8 load without a rebuild.
  bool HasRoomForOne() const { return HasRoomFor(1); }
  bool HasRoomFor(size_t n) const { return (used() + deleted_ + n) * 8 <= slots() * 7; }

  // The rebuilds take for_each_live(fn), which calls fn(row, hash of its key)
  // for every live row (in row order, it reads the row store sequentially).
  //
  // Makes room for one more key once live rows and tombstones fill 7/8:
  // grows by 2x when live rows are most of it, else purges the tombstones at
  // about the same size.
  template <class ForEachLive>
  void ReserveOne(const ForEachLive& for_each_live) {
    const size_t capacity = slots();
    if ((used() + deleted_ + 1) * 8 <= capacity * 7) return;
    const size_t live = used() + 1;
    Rehash(live * 2 > capacity * 7 / 8 ? std::max<size_t>(capacity * 2 * 7 / 8, live + kGroup)
                                       : live + live / 2,
           for_each_live);
  }
  // Makes room for n more keys at once. Bulk inserts need it: a checkpoint
  // lists keys in index order, and inserting them so into an index that
  // grows as they come piles each prefix into a few groups (probe chains as
  // long as the table; a 5M-key restore took 55 s instead of 3).
  template <class ForEachLive>
  void Reserve(size_t n, const ForEachLive& for_each_live) {
    if ((used() + deleted_ + n) * 8 > slots() * 7) Rehash(used() + n, for_each_live);
  }
  // Rebuilds the index with room for at least `want` live rows at 7/8 load;
  // each key's new group is prefetched a few rows before it is filled.
  template <class ForEachLive>
  void Rehash(size_t want, const ForEachLive& for_each_live);

  // Puts row (of a key with hash h) in `slot`, a free slot Probe returned.
  void Fill(size_t slot, uint64_t h, uint32_t row) {
    if (Ctrl(slot) == kDeleted) --deleted_;
    Ctrl(slot) = Tag(h);
    RowAt(slot) = row;
    AddUsed(1);
  }
  // Empties a full slot. A tombstone keeps probe chains through its group
  // intact until the next rebuild.
  void Erase(size_t slot) {
    Ctrl(slot) = kDeleted;
    AddUsed(-1);
    ++deleted_;
  }
  // Forgets every key and frees the index's memory.
  void Reset() {
    memory_.reset();
    index_ = nullptr;
    groups_ = deleted_ = 0;
    used_.store(0, std::memory_order_relaxed);
  }
  int64_t bytes() const { return static_cast<int64_t>(groups_ * sizeof(Group)); }

 private:
  static constexpr int8_t kEmpty = -128;  // 0b10000000
  static constexpr int8_t kDeleted = -2;  // 0b11111110; full slots hold a 7-bit tag >= 0
  static constexpr uint32_t kSlotMask = (1u << kGroup) - 1;
  struct alignas(64) Group {
    int8_t ctrl[16];
    uint32_t row[kGroup];
  };
  static_assert(sizeof(Group) == 64, "a group must fill exactly one cache line");

  static int8_t Tag(uint64_t h) { return static_cast<int8_t>(h & 0x7F); }
  // Bit i (i < kGroup) set when ctrl[i] == tag; reads the 16 control bytes.
  static uint32_t MatchTag(const int8_t* ctrl, int8_t tag) {
#if defined(__SSE2__)
    __m128i c = _mm_load_si128(reinterpret_cast<const __m128i*>(ctrl));
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(c, _mm_set1_epi8(tag)))) &
           kSlotMask;
#else
    uint32_t m = 0;
    for (size_t i = 0; i < kGroup; ++i) m |= static_cast<uint32_t>(ctrl[i] == tag) << i;
    return m;
#endif
  }
  // Bit i set when ctrl[i] is empty or deleted (the sign bit is set).
  static uint32_t MatchFree(const int8_t* ctrl) {
#if defined(__SSE2__)
    return static_cast<uint32_t>(
               _mm_movemask_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(ctrl)))) &
           kSlotMask;
#else
    uint32_t m = 0;
    for (size_t i = 0; i < kGroup; ++i) m |= static_cast<uint32_t>(ctrl[i] < 0) << i;
    return m;
#endif
  }
  static uint32_t MatchEmpty(const int8_t* ctrl) { return MatchTag(ctrl, kEmpty); }

  int8_t& Ctrl(size_t slot) const { return index_[slot / kGroup].ctrl[slot % kGroup]; }
  uint32_t& RowAt(size_t slot) const { return index_[slot / kGroup].row[slot % kGroup]; }
  void AddUsed(int64_t k) {
    used_.store(used_.load(std::memory_order_relaxed) + k, std::memory_order_relaxed);
  }
  // Builds an empty index of `groups` groups (the rebuild's first half).
  static Memory EmptyGroups(size_t groups);

  Memory memory_;
  Group* index_ = nullptr;
  size_t groups_ = 0;
  std::atomic<size_t> used_{0};
  size_t deleted_ = 0;  // tombstones
};

template <class ForEachLive>
void KeyIndex::Rehash(size_t want, const ForEachLive& for_each_live) {
  const size_t new_groups = std::max<size_t>(1, (want * 8 + kGroup * 7 - 1) / (kGroup * 7));
  Memory fresh_memory = EmptyGroups(new_groups);
  Group* fresh = reinterpret_cast<Group*>(fresh_memory.get());
  auto place = [&](uint32_t row, uint64_t h) {
    for (size_t g = HomeGroup(h, new_groups);; g = g + 1 == new_groups ? 0 : g + 1) {
      const uint32_t f = MatchFree(fresh[g].ctrl);
      if (f != 0) {
        const int i = __builtin_ctz(f);
        fresh[g].ctrl[i] = Tag(h);
        fresh[g].row[i] = row;
        return;
      }
    }
  };
  constexpr size_t kAhead = 8;  // a ring of rows whose groups are being prefetched
  uint32_t ring_row[kAhead];
  uint64_t ring_hash[kAhead];
  size_t queued = 0;
  for_each_live([&](uint32_t row, uint64_t h) {
    __builtin_prefetch(&fresh[HomeGroup(h, new_groups)], 1);
    const size_t at = queued++ % kAhead;
    if (queued > kAhead) place(ring_row[at], ring_hash[at]);
    ring_row[at] = row;
    ring_hash[at] = h;
  });
  for (size_t k = queued > kAhead ? queued - kAhead : 0; k < queued; ++k)
    place(ring_row[k % kAhead], ring_hash[k % kAhead]);
  memory_ = std::move(fresh_memory);
  index_ = fresh;
  groups_ = new_groups;
  deleted_ = 0;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_KEY_INDEX_H_
