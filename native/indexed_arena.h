// The "arena" layout of a shard (shard_storage.h): a key index of row
// numbers (key_index.h) over an arena of records that never move
// (arena_row_store.h). A key costs two dependent memory misses (its index
// group, then its record) but the records are packed, so bytes per key stay
// close to the record size. Kept selectable (TableConfig::layout = "arena")
// for memory-tight tables and as the buckets layout's overflow stash.
//
// Handle bits: the row's generation in bits 40..47 over its row number.
#ifndef GRAPHMOD_NATIVE_INDEXED_ARENA_H_
#define GRAPHMOD_NATIVE_INDEXED_ARENA_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "native/arena_row_store.h"
#include "native/bits.h"
#include "native/key_index.h"
#include "native/shard_storage.h"

namespace graphmod {

class IndexedArena {
 public:
  static constexpr uint32_t kNoRow = KeyIndex::kNoRow;

  explicit IndexedArena(const RecordLayout& layout) : store_(layout) {}

  uint32_t Find(int64_t key, uint64_t h) const {
    bool found;
    const size_t slot = index_.Probe(key, h, KeyOf(), &found);
    if (found) return index_.row(slot);
    // The free slot the probe passed is where Insert puts this key next.
    memo_key_ = key;
    memo_slot_ = slot;
    memo_valid_ = true;
    return kNoRow;
  }
  uint32_t Insert(int64_t key, uint64_t h) {
    size_t slot = memo_slot_;
    if (!index_.HasRoomForOne()) {
      index_.ReserveOne(LiveRows());
      memo_valid_ = false;
    }
    if (!memo_valid_ || memo_key_ != key) {
      bool found;
      slot = index_.Probe(key, h, KeyOf(), &found);
    }
    memo_valid_ = false;
    const uint32_t row = store_.Allocate(key);
    index_.Fill(slot, h, row);
    return row;
  }
  // Grows the index at least 2x when `extra` keys would not fit (a batch's
  // worth per call must not rebuild it each call; single inserts grow it in
  // Insert). The index grows without moving records: nothing ever moves.
  bool Reserve(size_t extra, int64_t) {
    if (extra > 1 && !index_.HasRoomFor(extra)) {
      index_.Reserve(std::max(extra, index_.used()), LiveRows());
      memo_valid_ = false;
    }
    return false;
  }
  void Erase(uint32_t row) {
    const int64_t key = store_.Key(row);
    const uint64_t h = HashKey(key);
    bool found;
    const size_t slot = index_.Probe(key, h, KeyOf(), &found);
    store_.Free(row);
    // A tombstone: the slot a missed Find saved stays free (an eviction
    // makes room for that very key).
    if (found) index_.Erase(slot);
  }
  char* Record(uint32_t row) const { return store_.Record(row); }
  uint64_t HandleBits(uint32_t row) const {
    return (static_cast<uint64_t>(store_.Generation(row)) << kHandleRowBits) | row;
  }
  bool Resolve(uint64_t bits, uint32_t* row) const {
    if (!store_.IsCurrent(RowOf(bits), static_cast<uint8_t>(bits >> kHandleRowBits)))
      return false;
    *row = static_cast<uint32_t>(RowOf(bits));
    return true;
  }
  // Stores never shrink RowBound, so it holds for every handle given out.
  bool MayOwn(uint64_t bits) const { return RowOf(bits) < store_.RowBound(); }
  GRAPHMOD_PREFETCHER void PrefetchA(uint64_t h) const { index_.PrefetchGroup(h); }
  GRAPHMOD_PREFETCHER void PrefetchB(uint64_t h, LookupKind kind) const {
    index_.PrefetchCandidate(h, [this, kind](uint32_t row) {
      store_.Prefetch(row);
      if (kind == LookupKind::kTrain) store_.PrefetchGeneration(row);  // for HandleBits
    });
  }
  GRAPHMOD_PREFETCHER void Prefetch(uint32_t row) const { store_.Prefetch(row); }
  GRAPHMOD_PREFETCHER void PrefetchHandle(uint64_t bits) const {
    store_.PrefetchGeneration(RowOf(bits));
  }
  // The key's home group and the groups after it: at least two groups and 8
  // candidates, at most 16 groups.
  template <class Fn>
  void VisitNear(uint64_t h, Fn&& fn) const {
    if (index_.groups() == 0) return;
    int candidates = 0;
    size_t g = index_.home_group(h);
    for (size_t step = 0;
         step < std::min<size_t>(index_.groups(), 16) && (step < 2 || candidates < 8);
         ++step, g = index_.next_group(g)) {
      for (size_t slot = g * KeyIndex::kGroup; slot < (g + 1) * KeyIndex::kGroup; ++slot) {
        if (!index_.full(slot)) continue;
        const uint32_t row = index_.row(slot);
        candidates += fn(row, static_cast<const char*>(store_.Record(row)));
      }
    }
  }
  template <class Fn>
  void ForEachLive(Fn&& fn) const {
    store_.ForEachLive(fn);
  }
  size_t size() const { return index_.used(); }
  bool empty() const { return index_.used() == 0; }
  void Reset() {
    index_.Reset();
    store_.Reset();
    memo_valid_ = false;
  }
  int64_t Bytes() const { return index_.bytes() + store_.Bytes(); }

  // Rows ever handed out (the buckets layout sizes its stash map by it).
  uint64_t RowBound() const { return store_.RowBound(); }
  uint8_t Generation(uint32_t row) const { return store_.Generation(row); }

 private:
  static uint64_t RowOf(uint64_t bits) { return bits & ((uint64_t{1} << kHandleRowBits) - 1); }
  struct KeyOfRow {  // a probe reads candidate keys from their records
    const ArenaRowStore* store;
    int64_t operator()(uint32_t row) const { return store->Key(row); }
  };
  struct LiveRowHashes {  // the index's rebuilds read every live row's key
    const ArenaRowStore* store;
    template <class Fn>
    void operator()(const Fn& fn) const {
      store->ForEachLive(
          [&](uint32_t row, const char* rec) { fn(row, HashKey(Header(rec)->key)); });
    }
  };
  KeyOfRow KeyOf() const { return KeyOfRow{&store_}; }
  LiveRowHashes LiveRows() const { return LiveRowHashes{&store_}; }

  KeyIndex index_;
  ArenaRowStore store_;
  // The free slot of the last Find that missed (Insert's probe, saved).
  mutable int64_t memo_key_ = 0;
  mutable size_t memo_slot_ = 0;
  mutable bool memo_valid_ = false;
};

static_assert(CheckShardStorage<IndexedArena>(), "IndexedArena meets the shard storage contract");

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_INDEXED_ARENA_H_
