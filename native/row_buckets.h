// The "buckets" layout of a shard (shard_storage.h): records inline in hash
// buckets, so a lookup's common case is one random memory miss.
//
// A bucket is [24 B header: 8 tags, 8 generations, `away` | 8 records],
// padded to whole cache lines. A key (hash h) lives in its home bucket b1,
// else in its second bucket b2, else in the stash (an IndexedArena, normally
// empty), and prefers slot p of b1. Both b1 and p come from h alone, so the
// lookup pipeline fetches b1's header line and the record at b1[p] together,
// 16 keys ahead: no miss waits on another (the arena layout's index-then-
// record chain). `away` counts the keys homed at b1 that live elsewhere, so
// a key absent from b1 whose `away` is 0 is known absent after one bucket.
//
// Growth rebuilds the shard 1.5x larger when an insert would pass 90% load
// (Reserve, which the shard calls before each insert). Rows move then, and
// only then, also in the middle of a lookup batch: a rebuild starts a new
// epoch and
// keeps where each row of the old epoch went, kMovesKeptVersions table
// versions long, so a handle made before a move (a lookup earlier in the same
// step, or in a step another thread is running) still reaches its row. A
// handle older than that is stale (dropped and counted, as is one whose row
// was freed: generations, as in the arena). Epochs are 8 bits: a handle kept
// across 256 rebuilds may alias a row of the new epoch, as an arena handle
// kept across 256 frees of its row may; handles live for a step.
//
// Handle bits: generation 40..47 | epoch 32..39 | ref; a ref is bucket * 8 +
// slot, or kStashBit | the stash's row.
#ifndef GRAPHMOD_NATIVE_ROW_BUCKETS_H_
#define GRAPHMOD_NATIVE_ROW_BUCKETS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "native/bits.h"
#include "native/indexed_arena.h"
#include "native/memory.h"
#include "native/row_store.h"
#include "native/shard_storage.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace graphmod {

class RowBuckets {
 public:
  static constexpr uint32_t kNoRow = 0xFFFFFFFFu;
  static constexpr int kSlots = 8;
  static constexpr uint32_t kStashBit = 0x80000000u;
  // Growth: rebuilt when live rows would pass 90% of the slots (or the stash
  // outgrows its bound), to a size where they fill 60%.
  static constexpr double kMaxLoad = 0.9;
  static constexpr double kRebuiltLoad = 0.6;
  // For how many table versions (applies) a rebuild's moves are kept: a
  // lookup's handles are applied in its step, but steps of other threads may
  // apply in between. Past kMostMoves kept rebuilds (a table that grows
  // 1.5x that often without an Apply) new keys go to the stash instead.
  static constexpr int64_t kMovesKeptVersions = 16;
  static constexpr size_t kMostMoves = 128;

  explicit RowBuckets(const RecordLayout& layout);
  RowBuckets(const RowBuckets&) = delete;
  RowBuckets& operator=(const RowBuckets&) = delete;

  uint32_t Find(int64_t key, uint64_t h) const {
    if (buckets_ != 0) {
      const size_t b1 = Home(h);
      const uint32_t ref = FindIn(b1, key, Tag(h));
      if (ref != kNoRow) return ref;
      if (HeaderOf(b1)->away == 0) return kNoRow;
      const uint32_t ref2 = FindIn(Second(h, b1), key, Tag(h));
      if (ref2 != kNoRow) return ref2;
    }
    if (stash_->empty()) return kNoRow;
    const uint32_t row = stash_->Find(key, h);
    return row == kNoRow ? kNoRow : row | kStashBit;
  }
  uint32_t Insert(int64_t key, uint64_t h) {
    size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return Place(base(), buckets_, stash_.get(), key, h);
  }
  bool Reserve(size_t extra, int64_t version);
  void Erase(uint32_t ref);
  char* Record(uint32_t ref) const {
    if (ref & kStashBit) return stash_->Record(ref & ~kStashBit);
    return RecordIn(base(), ref);
  }
  uint64_t HandleBits(uint32_t ref) const {
    const uint8_t gen = (ref & kStashBit) ? stash_->Generation(ref & ~kStashBit)
                                          : HeaderOf(ref / kSlots)->gen[ref % kSlots];
    issued_ = true;
    return (uint64_t{gen} << kHandleRowBits) | (uint64_t{epoch_} << 32) | ref;
  }
  bool Resolve(uint64_t bits, uint32_t* ref) const;
  bool MayOwn(uint64_t bits) const;

  GRAPHMOD_PREFETCHER void PrefetchA(uint64_t h) const {
    if (buckets_ == 0) return;
    const size_t b1 = Home(h);
    __builtin_prefetch(BucketAt(base(), b1));
    PrefetchRecord(RecordIn(base(), b1 * kSlots + Preferred(h)));
  }
  // (A handle's generation is in the bucket header that stage A, or for a
  // key in its second bucket this stage, fetches; stash rows' are not.)
  GRAPHMOD_PREFETCHER void PrefetchB(uint64_t h, LookupKind) const {
    if (buckets_ == 0) return;
    const size_t b1 = Home(h);
    const BucketHeader* hd = HeaderOf(b1);
    const int8_t tag = Tag(h);
    const int p = Preferred(h);
    if (hd->tag[p] == tag) return;  // stage A fetched it
    const uint32_t m = MatchTag(hd->tag, tag);
    if (m != 0) {
      PrefetchRecord(RecordIn(base(), b1 * kSlots + __builtin_ctz(m)));
    } else if (hd->away != 0) {
      const size_t b2 = Second(h, b1);
      __builtin_prefetch(BucketAt(base(), b2));
    }
  }
  GRAPHMOD_PREFETCHER void Prefetch(uint32_t ref) const { PrefetchRecord(Record(ref)); }
  // The bucket header a handle of this epoch names (one of another epoch
  // or of the stash is left to Resolve: rare).
  GRAPHMOD_PREFETCHER void PrefetchHandle(uint64_t bits) const {
    const uint32_t ref = static_cast<uint32_t>(bits);
    if (static_cast<uint8_t>(bits >> 32) == epoch_ && !(ref & kStashBit) &&
        ref / kSlots < buckets_)
      __builtin_prefetch(HeaderOf(ref / kSlots));
  }

  template <class Fn>
  void VisitNear(uint64_t h, Fn&& fn) const;
  template <class Fn>
  void ForEachLive(Fn&& fn) const;
  size_t size() const { return size_.load(std::memory_order_relaxed); }
  void Reset();
  int64_t Bytes() const {
    size_t moved = 0;
    for (const Moves& m : moves_)
      moved += (m.buckets.capacity() + m.stash.capacity()) * sizeof(Moved);
    return static_cast<int64_t>(memory_bytes_ + moved) + stash_->Bytes();
  }

  // For the tests and the benchmarks.
  size_t buckets() const { return buckets_; }
  size_t stash_rows() const { return stash_->size(); }
  uint8_t epoch() const { return epoch_; }
  // Live rows in their home bucket at their preferred slot (the one-miss
  // case), in their home bucket elsewhere, in their second bucket.
  void CountPlacement(size_t* preferred, size_t* home, size_t* second) const;

 private:
  struct BucketHeader {
    int8_t tag[kSlots];   // a full slot's 7-bit hash tag, or kEmpty
    uint8_t gen[kSlots];  // advanced each time the slot is freed
    uint16_t away;        // keys homed here that live in b2 or the stash (saturating)
    uint8_t pad[6];
  };
  static_assert(sizeof(BucketHeader) == 24, "a bucket header is 24 bytes");
  static constexpr int8_t kEmpty = -128;
  static constexpr size_t kMaxBuckets = size_t{1} << 28;  // refs stay below kStashBit
  // Where a row went in a rebuild.
  struct Moved {
    uint32_t ref = kNoRow;  // its ref in the next epoch
    uint8_t old_gen = 0;    // its generation before the move
    uint8_t new_gen = 0;    // its generation after it
  };
  struct Moves {
    uint8_t from_epoch;
    int64_t version;             // of the Reserve that moved the rows
    std::vector<Moved> buckets;  // by the old epoch's bucket ref
    std::vector<Moved> stash;    // by the old epoch's stash row
  };

  static int8_t Tag(uint64_t h) { return static_cast<int8_t>(h & 0x7F); }
  static int Preferred(uint64_t h) { return static_cast<int>((h >> 39) & (kSlots - 1)); }
  static size_t HomeIn(uint64_t h, size_t buckets) {
    return static_cast<size_t>(((h >> 7) & 0xFFFFFFFFULL) * buckets >> 32);
  }
  // A second, independent choice (another mix of h), never the home bucket.
  static size_t SecondIn(uint64_t h, size_t b1, size_t buckets) {
    const size_t b = static_cast<size_t>((Mix(h ^ 0x9E3779B97F4A7C15ULL) >> 32) * buckets >> 32);
    return b != b1 ? b : (b + 1 == buckets ? 0 : b + 1);
  }
  size_t Home(uint64_t h) const { return HomeIn(h, buckets_); }
  size_t Second(uint64_t h, size_t b1) const { return SecondIn(h, b1, buckets_); }
  char* base() const { return memory_.get(); }
  char* BucketAt(char* base, size_t b) const { return base + b * bucket_bytes_; }
  BucketHeader* HeaderOf(size_t b) const {
    return reinterpret_cast<BucketHeader*>(BucketAt(base(), b));
  }
  char* RecordIn(char* base, uint32_t ref) const {
    return BucketAt(base, ref / kSlots) + sizeof(BucketHeader) + (ref % kSlots) * stride_;
  }
  GRAPHMOD_PREFETCHER void PrefetchRecord(const char* rec) const {
    PrefetchLines(rec, read_bytes_);
  }

  static uint32_t MatchTag(const int8_t* tags, int8_t tag) {
#if defined(__SSE2__)
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tags));
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(c, _mm_set1_epi8(tag)))) &
           0xFFu;
#else
    uint32_t m = 0;
    for (int i = 0; i < kSlots; ++i) m |= static_cast<uint32_t>(tags[i] == tag) << i;
    return m;
#endif
  }
  static uint32_t MatchFree(const int8_t* tags) {
#if defined(__SSE2__)
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tags));
    return static_cast<uint32_t>(_mm_movemask_epi8(c)) & 0xFFu;
#else
    uint32_t m = 0;
    for (int i = 0; i < kSlots; ++i) m |= static_cast<uint32_t>(tags[i] < 0) << i;
    return m;
#endif
  }

  uint32_t FindIn(size_t b, int64_t key, int8_t tag) const {
    const BucketHeader* hd = HeaderOf(b);
    for (uint32_t m = MatchTag(hd->tag, tag); m != 0; m &= m - 1) {
      const uint32_t ref = static_cast<uint32_t>(b * kSlots + __builtin_ctz(m));
      if (Header(RecordIn(base(), ref))->key == key) return ref;
    }
    return kNoRow;
  }
  // Places absent key in the buckets at `base` (or `stash`): b1's preferred
  // slot, else b1's first free slot, else b2's, else the stash. Sets the
  // record's key; returns its ref.
  uint32_t Place(char* base, size_t buckets, IndexedArena* stash, int64_t key, uint64_t h);
  // Rebuilds the buckets with room for `rows` live rows at kRebuiltLoad.
  void Rebuild(size_t rows, int64_t version);
  // Where the row a handle of an older epoch named is now (false: stale).
  bool Follow(uint8_t epoch, uint32_t* ref, uint8_t* gen) const;

  const RecordLayout layout_;
  const size_t stride_;
  const size_t bucket_bytes_;
  const size_t read_bytes_;  // RecordLayout::lookup_bytes
  Memory memory_;
  size_t memory_bytes_ = 0;
  size_t buckets_ = 0;
  std::atomic<size_t> size_{0};
  std::unique_ptr<IndexedArena> stash_;
  uint8_t epoch_ = 0;
  mutable bool issued_ = false;  // a handle of this epoch was made
  std::vector<Moves> moves_;     // the last rebuilds' moves, oldest first
  // The most buckets and stash rows this shard ever had (MayOwn's bounds).
  size_t most_buckets_ = 0;
  uint64_t most_stash_rows_ = 0;
};

template <class Fn>
void RowBuckets::VisitNear(uint64_t h, Fn&& fn) const {
  if (buckets_ == 0) return;
  const size_t b1 = Home(h);
  int seen = 0;  // candidates
  auto visit = [&](size_t b) {
    const BucketHeader* hd = HeaderOf(b);
    for (uint32_t m = MatchFree(hd->tag) ^ 0xFFu; m != 0; m &= m - 1) {
      const uint32_t ref = static_cast<uint32_t>(b * kSlots + __builtin_ctz(m));
      seen += fn(ref, static_cast<const char*>(RecordIn(base(), ref)));
    }
  };
  visit(b1);
  if (buckets_ > 1) visit(Second(h, b1));
  // Then the buckets after b1 until 8 candidates (at most 16 buckets).
  size_t b = b1;
  for (size_t step = 2; step < std::min<size_t>(buckets_, 16) && seen < 8; ++step) {
    b = b + 1 == buckets_ ? 0 : b + 1;
    if (b != Second(h, b1)) visit(b);
  }
  // Stashed rows are candidates too: a shard that may not grow (no Apply
  // since its last move) stashes its new keys, and must still find victims.
  if (!stash_->empty())
    stash_->VisitNear(h, [&](uint32_t row, const char* rec) { return fn(row | kStashBit, rec); });
}

template <class Fn>
void RowBuckets::ForEachLive(Fn&& fn) const {
  for (size_t b = 0; b < buckets_; ++b) {
    const BucketHeader* hd = HeaderOf(b);
    for (uint32_t m = MatchFree(hd->tag) ^ 0xFFu; m != 0; m &= m - 1) {
      const uint32_t ref = static_cast<uint32_t>(b * kSlots + __builtin_ctz(m));
      fn(ref, static_cast<const char*>(RecordIn(base(), ref)));
    }
  }
  stash_->ForEachLive([&](uint32_t row, const char* rec) { fn(row | kStashBit, rec); });
}

static_assert(CheckShardStorage<RowBuckets>(), "RowBuckets meets the shard storage contract");

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_ROW_BUCKETS_H_
