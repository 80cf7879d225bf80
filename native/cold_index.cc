#include "native/cold_index.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <unordered_set>

namespace graphmod {

namespace {

int g_fail_after = 0;  // tests: the n-th mapping from now fails

constexpr size_t kHugePage = size_t{2} << 20;

// Anonymous memory, page-granular, returned to the system when unmapped, so
// the index's resident memory is its segments' sizes. Not AllocateAligned
// (native/memory.h): that rounds anything from 2 MB up to whole 2 MB, which
// would waste up to half of the 2-8 MB segments a growing index consists
// of. From 2 MB on, aligned on 2 MB and offered to transparent huge pages
// (probes are random: TLB misses).
void* MapPages(size_t bytes) {
  if (g_fail_after > 0 && --g_fail_after == 0) throw std::bad_alloc();
  if (bytes < kHugePage) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  const size_t span = bytes + kHugePage;
  char* p = static_cast<char*>(
      mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) throw std::bad_alloc();
  char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) &
                                    ~(kHugePage - 1));
  if (a != p) munmap(p, a - p);
  const size_t tail = (p + span) - (a + bytes);
  if (tail != 0) munmap(a + bytes, tail);
#ifdef MADV_HUGEPAGE
  madvise(a, bytes, MADV_HUGEPAGE);
#endif
  return a;
}

}  // namespace

void ColdIndex::FailAllocationAfter(int n) { g_fail_after = n; }

size_t ColdIndex::BucketsFor(size_t keys, double load) {
  size_t nb = static_cast<size_t>(std::ceil(keys / (kWays * load)));
  nb = std::max(nb, kMinBuckets);
  return (nb + kMinBuckets - 1) / kMinBuckets * kMinBuckets;  // whole pages
}

void ColdIndex::Account(ptrdiff_t delta) {
  bytes_ = static_cast<size_t>(static_cast<ptrdiff_t>(bytes_) + delta);
  peak_bytes_ = std::max(peak_bytes_, bytes_);
}

ColdIndex::Segment* ColdIndex::NewSegment(size_t nb) {
  const size_t map_bytes = nb * sizeof(Bucket);  // nb: whole pages
  void* m = MapPages(map_bytes);
  Segment* s;
  try {
    s = new Segment;
  } catch (...) {
    munmap(m, map_bytes);
    throw;
  }
  s->buckets = static_cast<Bucket*>(m);
  s->nb = nb;
  for (size_t j = 0; j < nb; ++j)
    for (int w = 0; w < kWays; ++w) s->buckets[j].rec[w] = kEmpty;
  Account(static_cast<ptrdiff_t>(map_bytes + sizeof(Segment)));
  ++segments_;
  slots_ += nb * kWays;
  return s;
}

void ColdIndex::FreeSegment(Segment* s) {
  munmap(s->buckets, s->nb * sizeof(Bucket));
  Account(-static_cast<ptrdiff_t>(s->nb * sizeof(Bucket) + sizeof(Segment)));
  --segments_;
  slots_ -= s->nb * kWays;
  delete s;
}

bool ColdIndex::Locate(const Segment* s, uint64_t h, int64_t key, size_t* bucket, int* way) {
  size_t b[2];
  Buckets(h, s->nb, &b[0], &b[1]);
  for (size_t x : b) {
    const int w = SlotOf(s->buckets[x], key);
    if (w >= 0) {
      *bucket = x;
      *way = w;
      return true;
    }
  }
  return false;
}

bool ColdIndex::Place(Segment* s, uint64_t h, int64_t key, uint32_t rec,
                         bool respect_max_load) {
  if (respect_max_load && s->size + 1 > MaxKeys(s->nb)) return false;
  Bucket* B = s->buckets;
  auto empty_way = [&](size_t x) {
    for (int w = 0; w < kWays; ++w)
      if (B[x].rec[w] == kEmpty) return w;
    return -1;
  };
  auto put = [&](size_t x, int w) {
    B[x].key[w] = key;
    B[x].rec[w] = rec;
    ++s->size;
  };
  size_t b1, b2;
  Buckets(h, s->nb, &b1, &b2);
  for (size_t x : {b1, b2}) {
    const int e = empty_way(x);
    if (e >= 0) {
      put(x, e);
      return true;
    }
  }
  // Breadth-first search for a cuckoo path, nothing moved until one is found.
  struct Node {
    uint32_t bucket;
    int16_t parent;
    int8_t way;  // the parent's slot whose key moves into this bucket
  };
  Node nodes[kMaxPathNodes];
  nodes[0] = {static_cast<uint32_t>(b1), -1, -1};
  nodes[1] = {static_cast<uint32_t>(b2), -1, -1};
  int n = 2;
  for (int q = 0; q < n; ++q) {
    const size_t cur = nodes[q].bucket;
    // Each alternative bucket is a cache miss: issue all five at once.
    size_t alts[kWays];
    for (int w = 0; w < kWays; ++w) {
      size_t x1, x2;
      Buckets(Hash(B[cur].key[w]), s->nb, &x1, &x2);
      alts[w] = x1 == cur ? x2 : x1;
      __builtin_prefetch(B + alts[w]);
    }
    for (int w = 0; w < kWays; ++w) {
      const size_t alt = alts[w];
      bool on_path = false;  // a bucket once per path, so the moves cannot collide
      for (int p = q; p >= 0; p = nodes[p].parent)
        if (nodes[p].bucket == alt) {
          on_path = true;
          break;
        }
      if (on_path) continue;
      if (n == kMaxPathNodes) return false;
      nodes[n] = {static_cast<uint32_t>(alt), static_cast<int16_t>(q), static_cast<int8_t>(w)};
      const int e = empty_way(alt);
      if (e >= 0) {
        // Leaf first: each key moves into the slot its child just vacated.
        size_t free_b = alt;
        int free_w = e;
        for (int c = n; nodes[c].parent >= 0; c = nodes[c].parent) {
          const size_t from = nodes[nodes[c].parent].bucket;
          const int fw = nodes[c].way;
          B[free_b].key[free_w] = B[from].key[fw];
          B[free_b].rec[free_w] = B[from].rec[fw];
          B[from].rec[fw] = kEmpty;
          free_b = from;
          free_w = fw;
        }
        put(free_b, free_w);
        return true;
      }
      ++n;
    }
  }
  return false;
}

// Two passes. First every key goes to its first bucket if that has room:
// b1 grows with the hash's low bits, as the old segment's order does, so
// these writes sweep the new buckets nearly in order (few cache misses).
// Then the keys left over (~5-10%) are placed with cuckoo moves (which may
// move keys of the first pass to their second bucket).
template <class Target>
ColdIndex::Segment* ColdIndex::CopyInto(const Segment* s, Target target) {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t j = 0; j < s->nb; ++j) {
      const Bucket& from = s->buckets[j];
      for (int w = 0; w < kWays; ++w) {
        if (from.rec[w] == kEmpty) continue;
        const int64_t key = from.key[w];
        const uint64_t h = Hash(key);
        Segment* t = target(h);
        size_t b1, b2;
        Buckets(h, t->nb, &b1, &b2);
        Bucket& b = t->buckets[b1];
        if (pass == 0) {
          for (int v = 0; v < kWays; ++v)
            if (b.rec[v] == kEmpty) {
              b.key[v] = key;
              b.rec[v] = from.rec[w];
              ++t->size;
              break;
            }
        } else if (SlotOf(b, key) < 0 && SlotOf(t->buckets[b2], key) < 0) {
          // (not placed yet: cuckoo moves keep a key in one of its two buckets)
          if (!Place(t, h, key, from.rec[w], false)) return t;
        }
      }
    }
  }
  return nullptr;
}

void ColdIndex::Rebuild(Segment* s, size_t nb) {
  for (;;) {
    Segment* t = NewSegment(nb);  // may throw: s untouched
    const bool ok = CopyInto(s, [t](uint64_t) { return t; }) == nullptr;
    if (!ok) {  // (rare) no cuckoo path: a little bigger
      FreeSegment(t);
      nb = BucketsFor((nb + std::max(kMinBuckets, nb / 16)) * kWays, 1.0);
      continue;
    }
    std::swap(s->buckets, t->buckets);
    std::swap(s->nb, t->nb);
    FreeSegment(t);  // the old buckets
    return;
  }
}

void ColdIndex::Split(Segment* s) {
  // Everything that may throw first.
  std::vector<Segment*> doubled;
  if (s->depth == depth_) {
    doubled.resize(dir_.size() * 2);
    for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = dir_[i >> 1];
  }
  const int bit = 63 - s->depth;  // the hash bit that splits s
  size_t count[2] = {0, 0};
  for (size_t j = 0; j < s->nb; ++j)
    for (int w = 0; w < kWays; ++w)
      if (s->buckets[j].rec[w] != kEmpty) ++count[(Hash(s->buckets[j].key[w]) >> bit) & 1];
  size_t nb[2] = {BucketsFor(count[0], kGrowLoad), BucketsFor(count[1], kGrowLoad)};
  Segment* half[2] = {nullptr, nullptr};
  for (;;) {
    try {
      half[0] = NewSegment(nb[0]);
      half[1] = NewSegment(nb[1]);
    } catch (...) {
      if (half[0]) FreeSegment(half[0]);
      throw;
    }
    const Segment* short_of_room = CopyInto(s, [&](uint64_t h) { return half[(h >> bit) & 1]; });
    if (short_of_room == nullptr) break;
    const int failed = short_of_room == half[0] ? 0 : 1;
    FreeSegment(half[0]);
    FreeSegment(half[1]);
    half[0] = half[1] = nullptr;
    nb[failed] = BucketsFor((nb[failed] + std::max(kMinBuckets, nb[failed] / 16)) * kWays, 1.0);
  }
  // Commit (no more allocations).
  if (!doubled.empty()) {
    Account(static_cast<ptrdiff_t>((doubled.capacity() - dir_.capacity()) * sizeof(Segment*)));
    dir_.swap(doubled);
    ++depth_;
  }
  half[0]->depth = half[1]->depth = s->depth + 1;
  size_t first = 0;
  while (dir_[first] != s) ++first;  // (directories are small: a few K entries)
  const size_t span = size_t{1} << (depth_ - s->depth);
  for (size_t i = 0; i < span; ++i) dir_[first + i] = half[i < span / 2 ? 0 : 1];
  FreeSegment(s);
}

void ColdIndex::Grow(uint64_t h) {
  Segment* s = SegmentOf(h);
  const size_t nb = std::max(s->nb + std::max(kMinBuckets, s->nb / 8),
                             BucketsFor(s->size + 1, kGrowLoad));
  if (nb * sizeof(Bucket) > max_segment_bytes_ && s->depth < 40)
    Split(s);
  else
    Rebuild(s, (nb + kMinBuckets - 1) / kMinBuckets * kMinBuckets);
}

bool ColdIndex::Upsert(int64_t key, uint32_t rec, uint32_t* old) {
  if (dir_.empty()) {
    dir_.reserve(1);  // may throw: nothing changed
    Segment* s;
    try {
      s = NewSegment(kMinBuckets);
    } catch (...) {
      std::vector<Segment*>().swap(dir_);  // the capacity too: nothing changed
      throw;
    }
    dir_.push_back(s);
    depth_ = 0;
    Account(sizeof(Segment*));
  }
  const uint64_t h = Hash(key);
  size_t bucket;
  int way;
  Segment* s = SegmentOf(h);
  if (Locate(s, h, key, &bucket, &way)) {
    if (old) *old = s->buckets[bucket].rec[way];
    s->buckets[bucket].rec[way] = rec;
    return false;
  }
  while (!Place(SegmentOf(h), h, key, rec, true)) Grow(h);  // Grow may throw: unchanged
  ++size_;
  return true;
}

bool ColdIndex::Relocate(int64_t key, uint32_t from, uint32_t to) {
  if (dir_.empty()) return false;
  const uint64_t h = Hash(key);
  Segment* s = SegmentOf(h);
  size_t bucket;
  int way;
  if (!Locate(s, h, key, &bucket, &way) || s->buckets[bucket].rec[way] != from) return false;
  s->buckets[bucket].rec[way] = to;
  return true;
}

bool ColdIndex::Erase(int64_t key, uint32_t* old) {
  if (dir_.empty()) return false;
  const uint64_t h = Hash(key);
  Segment* s = SegmentOf(h);
  size_t bucket;
  int way;
  if (!Locate(s, h, key, &bucket, &way)) return false;
  if (old) *old = s->buckets[bucket].rec[way];
  s->buckets[bucket].rec[way] = kEmpty;
  --s->size;
  --size_;
  if (s->nb > kMinBuckets && s->size < s->nb * kWays * kShrinkLoad) {
    // (Small segments round up to their own size: no rebuild for nothing.)
    const size_t nb = BucketsFor(s->size, kGrowLoad);
    try {
      if (nb < s->nb) Rebuild(s, nb);
    } catch (const std::bad_alloc&) {
      // best effort: stays big
    }
  }
  return true;
}

void ColdIndex::Clear() {
  // A segment's entries are 2^(depth_ - depth) aligned, adjacent ones: free
  // it at its first and skip the rest (they would read it freed).
  for (size_t i = 0; i < dir_.size();) {
    Segment* s = dir_[i];
    i += size_t{1} << (depth_ - s->depth);
    FreeSegment(s);
  }
  Account(-static_cast<ptrdiff_t>(dir_.capacity() * sizeof(Segment*)));
  std::vector<Segment*>().swap(dir_);
  depth_ = 0;
  size_ = 0;
}

bool ColdIndex::CheckInvariants() const {
  if (dir_.size() != (dir_.empty() ? 0 : size_t{1} << depth_)) return false;
  size_t total = 0, segs = 0, slots = 0, mapped = 0;
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < dir_.size(); ++i) {
    const Segment* s = dir_[i];
    if (s->depth > depth_) return false;
    const size_t first = FirstEntry(i, s);
    for (size_t k = first; k < first + (size_t{1} << (depth_ - s->depth)); ++k)
      if (dir_[k] != s) return false;
    if (first != i) continue;
    ++segs;
    slots += s->nb * kWays;
    mapped += s->nb * sizeof(Bucket) + sizeof(Segment);
    size_t n = 0;
    for (size_t j = 0; j < s->nb; ++j)
      for (int w = 0; w < kWays; ++w) {
        if (s->buckets[j].rec[w] == kEmpty) continue;
        const int64_t key = s->buckets[j].key[w];
        const uint64_t h = Hash(key);
        if (SegmentOf(h) != s) return false;
        size_t b1, b2;
        Buckets(h, s->nb, &b1, &b2);
        if (j != b1 && j != b2) return false;
        if (!seen.insert(key).second) return false;
        ++n;
      }
    if (n != s->size) return false;
    total += n;
  }
  return total == size_ && segs == segments_ && slots == slots_ &&
         mapped + dir_.capacity() * sizeof(Segment*) == bytes_;
}

}  // namespace graphmod
