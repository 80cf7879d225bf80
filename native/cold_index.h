// The disk tier's cold index (native/log_tier.h): each cold key's record
// number, 12.8 bytes a key in slots kept 84-94% full, so a table whose rows
// live on disk holds ~14 bytes of memory per key (issue 35; the design and
// its measurements: docs/notes/compact_cold_index/README.md).
//
// Layout: extendible hashing over segments, each a bucketized cuckoo table.
// A bucket is one cache line: 5 keys (40 B), 5 record numbers (20 B), 4
// spare bytes. A key lives in one of two buckets of its segment, so a probe
// reads at most two cache lines, a miss exactly two, both prefetchable.
//   - The directory (2^depth pointers) picks the segment by the hash's top
//     bits.
//   - A segment past 94% load is rebuilt 1/8 bigger (84% after); one that
//     would pass max_segment_bytes is split in two by its next hash bit
//     instead (each ~85% full). Only one segment is copied at a time: no
//     whole-index rehash, no 2x peak (a growing index stays within 13.6-15.3
//     bytes a key).
//   - Insertion finds a cuckoo path by breadth-first search (at most
//     kMaxPathNodes buckets) before it moves anything; with none, the
//     segment grows.
//   - Below 75% load (erases) a segment is rebuilt to 84% (best effort).
// The index holds no scores: a record's last_seen, count and version are in
// its header on disk, and the tier keeps per-segment bounds of them to pick
// which segments a time eviction or a delta must read.
//
// Exception safety: Upsert may throw std::bad_alloc, and then nothing
// changed. Find, Erase, Relocate and ForEach never throw (Erase's shrink is
// skipped when memory is short). Not thread-safe: LogTier's mutex guards it.
#ifndef GRAPHMOD_NATIVE_COLD_INDEX_H_
#define GRAPHMOD_NATIVE_COLD_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "native/bits.h"

namespace graphmod {

class ColdIndex {
 public:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;  // record numbers are < kEmpty
  static constexpr int kWays = 5;
  // No key tags: every int64 key is valid, and a tag would make Upserts and
  // Contains read the disk to tell two keys apart.
  struct alignas(64) Bucket {
    int64_t key[kWays];
    uint32_t rec[kWays];  // kEmpty: a free slot (its key is meaningless)
    uint32_t spare;
  };
  static_assert(sizeof(Bucket) == 64, "one bucket per cache line");

  static constexpr double kMaxLoad = 0.96;     // grow past this
  static constexpr double kGrowLoad = 0.86;    // load right after a growth / split
  static constexpr double kShrinkLoad = 0.75;  // rebuild smaller (to kGrowLoad) below this
  static constexpr size_t kMinBuckets = 64;    // 4 KB: the allocation grain
  static constexpr int kMaxPathNodes = 512;
  static constexpr size_t kPrefetchAhead = 8;

  // max_segment_bytes: the largest segment before it splits. 8 MB keeps a
  // growth's copy small and its pages huge; tests pass small ones to split
  // often.
  explicit ColdIndex(size_t max_segment_bytes = size_t{8} << 20)
      : max_segment_bytes_(max_segment_bytes) {}
  ~ColdIndex() { Clear(); }
  ColdIndex(const ColdIndex&) = delete;
  ColdIndex& operator=(const ColdIndex&) = delete;

  size_t size() const { return size_; }
  // Memory held: the segments' mappings, the directory, the segment records.
  size_t bytes() const { return bytes_; }
  // The largest bytes() ever reached, counting a rebuild's two copies.
  size_t peak_bytes() const { return peak_bytes_; }
  size_t segments() const { return segments_; }
  size_t slots() const { return slots_; }

  // Whether key is here; its record number to *rec (may be null).
  bool Find(int64_t key, uint32_t* rec) const {
    if (dir_.empty()) return false;
    const uint64_t h = Hash(key);
    const Segment* s = SegmentOf(h);
    size_t b1, b2;
    Buckets(h, s->nb, &b1, &b2);
    for (size_t x : {b1, b2}) {
      const int w = SlotOf(s->buckets[x], key);
      if (w >= 0) {
        if (rec != nullptr) *rec = s->buckets[x].rec[w];
        return true;
      }
    }
    return false;
  }
  // Brings both of key's buckets into cache. A probe is a cache miss (the
  // index is far bigger than the caches); batched callers prefetch
  // kPrefetchAhead keys ahead. always_inline: GCC 12 otherwise finds the
  // out-of-line call free of side effects and deletes it, prefetch and all.
  __attribute__((always_inline)) void Prefetch(int64_t key) const {
    if (dir_.empty()) return;
    const uint64_t h = Hash(key);
    const Segment* s = SegmentOf(h);
    size_t b1, b2;
    Buckets(h, s->nb, &b1, &b2);
    __builtin_prefetch(s->buckets + b1);
    __builtin_prefetch(s->buckets + b2);
  }
  // Points key at rec (rec < kEmpty). Returns true if key was added; false
  // if it was here, its old record number to *old (may be null). May throw
  // std::bad_alloc: then nothing changed.
  bool Upsert(int64_t key, uint32_t rec, uint32_t* old);
  // Points key at `to` only if it points at `from` now (compaction's switch,
  // and undoing an Upsert). Never allocates.
  bool Relocate(int64_t key, uint32_t from, uint32_t to);
  // Removes key; its record number to *old (may be null). Never throws.
  bool Erase(int64_t key, uint32_t* old);
  void Clear();

  // fn(key, record number) for every key, in no particular order.
  template <class Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i < dir_.size(); ++i) {
      const Segment* s = dir_[i];
      if (FirstEntry(i, s) != i) continue;  // each segment once
      for (size_t j = 0; j < s->nb; ++j)
        for (int w = 0; w < kWays; ++w)
          if (s->buckets[j].rec[w] != kEmpty) fn(s->buckets[j].key[w], s->buckets[j].rec[w]);
    }
  }

  // Tests: checks every invariant (sizes, keys in one of their two buckets,
  // no duplicates, directory consistency, bytes); false on a violation.
  bool CheckInvariants() const;
  // Tests: the n-th segment allocation from now on throws std::bad_alloc
  // (0: never). Process-wide.
  static void FailAllocationAfter(int n);

 private:
  struct Segment {
    Bucket* buckets = nullptr;  // a mapping of nb * 64 bytes
    size_t nb = 0;              // buckets
    size_t size = 0;            // keys
    int depth = 0;              // local depth: the top `depth` hash bits are its own
  };

  // HashKey's top bits choose the table shard, so all keys of one shard
  // share them: mix once more.
  static uint64_t Hash(int64_t key) { return Mix(HashKey(key)); }
  const Segment* SegmentOf(uint64_t h) const { return dir_[depth_ ? h >> (64 - depth_) : 0]; }
  Segment* SegmentOf(uint64_t h) { return dir_[depth_ ? h >> (64 - depth_) : 0]; }
  // The two buckets: b1 from the hash's low 32 bits (the directory uses the
  // top bits), b2 != b1 from a remix of all of it.
  static void Buckets(uint64_t h, size_t nb, size_t* b1, size_t* b2) {
    *b1 = static_cast<size_t>((uint64_t{static_cast<uint32_t>(h)} * nb) >> 32);
    const uint64_t g = (h ^ (h >> 29)) * 0x9E3779B97F4A7C15ULL;
    const size_t b = *b1 + 1 + static_cast<size_t>(((g >> 32) * (nb - 1)) >> 32);
    *b2 = b >= nb ? b - nb : b;
  }
  static int SlotOf(const Bucket& b, int64_t key) {
    for (int w = 0; w < kWays; ++w)
      if (b.key[w] == key && b.rec[w] != kEmpty) return w;
    return -1;
  }
  // Where key's slot is in s, or false.
  static bool Locate(const Segment* s, uint64_t h, int64_t key, size_t* bucket, int* way);
  size_t FirstEntry(size_t i, const Segment* s) const {
    const int shift = depth_ - s->depth;
    return (i >> shift) << shift;
  }
  static size_t MaxKeys(size_t nb) { return static_cast<size_t>(nb * kWays * kMaxLoad); }
  static size_t BucketsFor(size_t keys, double load);

  // Places (key, rec), absent from s, in s if a cuckoo path exists; false
  // (s unchanged) if none does or (respect_max_load) s is at its maximum load.
  static bool Place(Segment* s, uint64_t h, int64_t key, uint32_t rec, bool respect_max_load);
  // Copies s's keys into target(hash) (empty segments): nullptr, or the
  // target where a key found no place (then the targets are partly filled:
  // the caller frees them and retries bigger).
  template <class Target>
  static Segment* CopyInto(const Segment* s, Target target);
  Segment* NewSegment(size_t nb);  // may throw
  void FreeSegment(Segment* s);
  // Rebuilds s with nb buckets (more if its keys do not fit); may throw,
  // then s is unchanged.
  void Rebuild(Segment* s, size_t nb);
  // Splits s in two by hash bit s->depth (doubling the directory first if
  // needed); may throw, then nothing changed.
  void Split(Segment* s);
  // Makes room for one more key in h's segment (grow or split); may throw.
  void Grow(uint64_t h);
  void Account(ptrdiff_t delta);

  const size_t max_segment_bytes_;
  std::vector<Segment*> dir_;
  int depth_ = 0;  // global depth: dir_.size() == 2^depth_
  size_t size_ = 0;
  size_t bytes_ = 0, peak_bytes_ = 0;
  size_t segments_ = 0, slots_ = 0;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_COLD_INDEX_H_
