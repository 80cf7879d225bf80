#include "native/row_buckets.h"

#include <algorithm>
#include <cmath>

namespace graphmod {

namespace {
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

RowBuckets::RowBuckets(const RecordLayout& layout)
    : layout_(layout),
      stride_(layout.stride),
      // Whole cache lines, so a bucket's header never straddles two.
      bucket_bytes_(RoundUp(sizeof(BucketHeader) + kSlots * layout.stride, 64)),
      read_bytes_(layout.lookup_bytes()),
      stash_(new IndexedArena(layout)) {}

uint32_t RowBuckets::Place(char* at, size_t buckets, IndexedArena* stash, int64_t key,
                           uint64_t h) {
  if (buckets != 0) {
    const size_t b1 = HomeIn(h, buckets);
    BucketHeader* hd = reinterpret_cast<BucketHeader*>(BucketAt(at, b1));
    uint32_t free = MatchFree(hd->tag);
    const int p = Preferred(h);
    size_t b = b1;
    int slot = -1;
    if (free & (1u << p)) {
      slot = p;  // the one-miss place
    } else if (__builtin_popcount(free) >= 3) {
      slot = __builtin_ctz(free);  // room to spare at home: no second bucket read
    } else {
      // Else the emptier of the two buckets (balanced allocation: at 90%
      // load few buckets are full, so few keys reach the stash).
      const size_t b2 = SecondIn(h, b1, buckets);
      BucketHeader* hd2 = reinterpret_cast<BucketHeader*>(BucketAt(at, b2));
      const uint32_t free2 = MatchFree(hd2->tag);
      if (free != 0 && __builtin_popcount(free) >= __builtin_popcount(free2)) {
        slot = __builtin_ctz(free);
      } else {
        if (hd->away != UINT16_MAX) ++hd->away;
        b = b2;
        hd = hd2;
        if (free2 != 0) slot = __builtin_ctz(free2);
      }
    }
    if (slot >= 0) {
      hd->tag[slot] = Tag(h);
      const uint32_t ref = static_cast<uint32_t>(b * kSlots + slot);
      graphmod::Header(RecordIn(at, ref))->key = key;
      return ref;
    }
  }
  // The stash's Find leaves Insert its free index slot.
  stash->Find(key, h);
  return stash->Insert(key, h) | kStashBit;
}

bool RowBuckets::Reserve(size_t extra, int64_t version) {
  // A rebuild's moves are forgotten kMovesKeptVersions versions after it:
  // the lookups made before it have been applied by then.
  while (!moves_.empty() && version >= moves_.front().version + kMovesKeptVersions)
    moves_.erase(moves_.begin());
  const size_t rows = size() + extra;
  const bool crowded = rows > static_cast<size_t>(kMaxLoad * buckets_ * kSlots);
  // A stash beyond 1/64 of the rows costs every key homed near its keys a
  // second probe: rebuild (larger, so the same keys do not overflow again).
  const bool stashed = stash_->size() > std::max<size_t>(64, size() / 64);
  if (!crowded && !stashed) return false;
  if (moves_.size() >= kMostMoves) return false;  // a handle could not follow
  Rebuild(std::max(rows, stashed ? buckets_ * kSlots * 3 / 4 : 0), version);
  return true;
}

void RowBuckets::Rebuild(size_t rows, int64_t version) {
  const size_t want = static_cast<size_t>(std::ceil(rows / (kRebuiltLoad * kSlots)));
  const size_t buckets = std::min(kMaxBuckets, std::max<size_t>(2, want));
  const size_t bytes = buckets * bucket_bytes_;
  Memory fresh = AllocateAligned(bytes);
  for (size_t b = 0; b < buckets; ++b) {
    BucketHeader* hd = reinterpret_cast<BucketHeader*>(BucketAt(fresh.get(), b));
    std::memset(hd, 0, sizeof(BucketHeader));
    std::memset(hd->tag, kEmpty, sizeof(hd->tag));
  }
  std::unique_ptr<IndexedArena> fresh_stash(new IndexedArena(layout_));
  // The moves are kept if a handle of this epoch (or an older one, which
  // follows them) may still come.
  const bool keep = issued_ || !moves_.empty();
  Moves moves{epoch_, version, {}, {}};
  if (keep) {
    moves.buckets.resize(buckets_ * kSlots);
    moves.stash.resize(stash_->RowBound());
  }
  Moved scratch;
  // Each row goes to its place in the fresh buckets with its record; its
  // new home bucket is prefetched a few rows ahead (the writes are random).
  constexpr size_t kAhead = 8;
  struct Pending {
    uint64_t h;
    const char* rec;
    Moved* moved;
  } ring[kAhead];
  size_t queued = 0;
  // Two passes: first every row whose preferred slot is free takes it, then
  // the rest take what is left, so as many keys as possible are one miss.
  std::vector<Pending> rest;
  auto copy = [&](const Pending& r, uint32_t ref) {
    char* dst = (ref & kStashBit) ? fresh_stash->Record(ref & ~kStashBit)
                                  : RecordIn(fresh.get(), ref);
    std::memcpy(dst, r.rec, stride_);
    r.moved->ref = ref;
    r.moved->new_gen = (ref & kStashBit) ? fresh_stash->Generation(ref & ~kStashBit) : 0;
  };
  auto place = [&](const Pending& r) {
    const size_t b1 = HomeIn(r.h, buckets);
    BucketHeader* hd = reinterpret_cast<BucketHeader*>(BucketAt(fresh.get(), b1));
    const int p = Preferred(r.h);
    if (hd->tag[p] != kEmpty) {
      rest.push_back(r);
      return;
    }
    hd->tag[p] = Tag(r.h);
    copy(r, static_cast<uint32_t>(b1 * kSlots + p));
  };
  auto enqueue = [&](const char* rec, Moved* m, uint8_t old_gen) {
    const uint64_t h = HashKey(graphmod::Header(rec)->key);
    __builtin_prefetch(BucketAt(fresh.get(), HomeIn(h, buckets)), 1);
    m->old_gen = old_gen;
    const size_t at = queued++ % kAhead;
    if (queued > kAhead) place(ring[at]);
    ring[at] = Pending{h, rec, m};
  };
  for (size_t b = 0; b < buckets_; ++b) {
    const BucketHeader* hd = HeaderOf(b);
    for (uint32_t m = MatchFree(hd->tag) ^ 0xFFu; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      const uint32_t ref = static_cast<uint32_t>(b * kSlots + i);
      enqueue(RecordIn(base(), ref), keep ? &moves.buckets[ref] : &scratch, hd->gen[i]);
    }
  }
  stash_->ForEachLive([&](uint32_t row, const char* rec) {
    enqueue(rec, keep ? &moves.stash[row] : &scratch, stash_->Generation(row));
  });
  for (size_t k = queued > kAhead ? queued - kAhead : 0; k < queued; ++k) place(ring[k % kAhead]);
  for (const Pending& r : rest)
    copy(r, Place(fresh.get(), buckets, fresh_stash.get(), graphmod::Header(r.rec)->key, r.h));

  most_stash_rows_ = std::max<uint64_t>(most_stash_rows_, stash_->RowBound());
  memory_ = std::move(fresh);
  memory_bytes_ = bytes;
  buckets_ = buckets;
  most_buckets_ = std::max(most_buckets_, buckets);
  stash_ = std::move(fresh_stash);
  if (keep) {
    moves_.push_back(std::move(moves));
  }
  ++epoch_;
  issued_ = false;
}

void RowBuckets::Erase(uint32_t ref) {
  const int64_t key = graphmod::Header(Record(ref))->key;
  const uint64_t h = HashKey(key);
  size_t home = buckets_ != 0 ? Home(h) : 0;
  bool away = buckets_ != 0;  // counted in its home bucket's `away`, unless it lives there
  if (ref & kStashBit) {
    stash_->Erase(ref & ~kStashBit);
  } else {
    const size_t b = ref / kSlots;
    BucketHeader* hd = HeaderOf(b);
    hd->tag[ref % kSlots] = kEmpty;
    ++hd->gen[ref % kSlots];
    away = b != home;
  }
  if (away) {
    uint16_t& n = HeaderOf(home)->away;
    if (n != UINT16_MAX && n != 0) --n;
  }
  size_.store(size_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
}

bool RowBuckets::Follow(uint8_t epoch, uint32_t* ref, uint8_t* gen) const {
  size_t k = 0;
  while (k < moves_.size() && moves_[k].from_epoch != epoch) ++k;
  if (k == moves_.size()) return false;  // forgotten, or never ours
  for (; k < moves_.size(); ++k) {
    const std::vector<Moved>& map = (*ref & kStashBit) ? moves_[k].stash : moves_[k].buckets;
    const uint32_t at = *ref & ~kStashBit;
    if (at >= map.size() || map[at].ref == kNoRow || map[at].old_gen != *gen) return false;
    *ref = map[at].ref;
    *gen = map[at].new_gen;
  }
  return true;
}

bool RowBuckets::Resolve(uint64_t bits, uint32_t* out) const {
  uint8_t gen = static_cast<uint8_t>(bits >> kHandleRowBits);
  uint32_t ref = static_cast<uint32_t>(bits);
  // Made before a rebuild: follow the row to where it went.
  if (static_cast<uint8_t>(bits >> 32) != epoch_ &&
      !Follow(static_cast<uint8_t>(bits >> 32), &ref, &gen))
    return false;
  if (ref & kStashBit) {
    uint32_t row;
    if (!stash_->Resolve((uint64_t{gen} << kHandleRowBits) | (ref & ~kStashBit), &row))
      return false;
    *out = ref;
    return true;
  }
  if (ref / kSlots >= buckets_) return false;
  const BucketHeader* hd = HeaderOf(ref / kSlots);
  if (hd->tag[ref % kSlots] < 0 || hd->gen[ref % kSlots] != gen) return false;
  *out = ref;
  return true;
}

bool RowBuckets::MayOwn(uint64_t bits) const {
  const uint8_t epoch = static_cast<uint8_t>(bits >> 32);
  const uint32_t ref = static_cast<uint32_t>(bits);
  // Another epoch's handle resolves stale (or forwarded); it is ours if it
  // names a place this shard ever had.
  if (epoch != epoch_) {
    return (ref & kStashBit) ? (ref & ~kStashBit) < most_stash_rows_
                             : ref / kSlots < most_buckets_;
  }
  if (ref & kStashBit) return stash_->MayOwn(ref & ~kStashBit);
  return ref / kSlots < buckets_;
}

void RowBuckets::Reset() {
  most_stash_rows_ = std::max<uint64_t>(most_stash_rows_, stash_->RowBound());
  memory_.reset();
  memory_bytes_ = 0;
  buckets_ = 0;
  stash_.reset(new IndexedArena(layout_));
  moves_.clear();
  ++epoch_;  // every handle made before is stale
  issued_ = false;
  size_.store(0, std::memory_order_relaxed);
}

void RowBuckets::CountPlacement(size_t* preferred, size_t* home, size_t* second) const {
  *preferred = *home = *second = 0;
  for (size_t b = 0; b < buckets_; ++b) {
    const BucketHeader* hd = HeaderOf(b);
    for (uint32_t m = MatchFree(hd->tag) ^ 0xFFu; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      const uint64_t h = HashKey(graphmod::Header(RecordIn(base(), b * kSlots + i))->key);
      if (Home(h) != b) {
        ++*second;
      } else if (Preferred(h) == i) {
        ++*preferred;
      } else {
        ++*home;
      }
    }
  }
}

}  // namespace graphmod
