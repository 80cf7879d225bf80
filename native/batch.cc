#include "native/batch.h"

#include <algorithm>

#include "native/bits.h"
#include "native/row_store.h"

namespace graphmod {

void SerialRunner(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  if (n > 0) fn(0, n);
}

void Batch::Partition(const int64_t* ids, int64_t n, bool ids_are_handles, bool dedup,
                      int num_shards, const Runner& run) {
  dedup = dedup && !ids_are_handles;  // (handles are checked, not looked up)
  const int64_t shards = num_shards;
  int shard_bits = 0;
  while ((1 << shard_bits) < num_shards) ++shard_bits;
  // One bucket per shard, and a last one for negative handles (lookups that
  // got no row), which no shard processes.
  const int64_t buckets = shards + 1;
  const size_t size = static_cast<size_t>(std::max<int64_t>(n, 1));
  order = order_.Get(size);
  id = id_.Get(size);
  hash = ids_are_handles ? nullptr : hash_.Get(size);
  // With dedup, the grouping is of positions only, which Dedup expands.
  ids_ = ids;
  raw_p_ = dedup ? raw_.Get(size) : nullptr;
  count = dedup ? count_.Get(size) : nullptr;
  first = dedup ? first_.Get(size) : nullptr;
  index = dedup ? index_.Get(size) : nullptr;
  refused = dedup ? refused_.Get(size) : nullptr;
  found = dedup ? found_.Get(size) : nullptr;
  begin.assign(buckets + 1, 0);
  // Two-pass counting sort, each pass split over chunks of keys that run in
  // parallel (enough of them for many threads); the second pass hashes
  // again rather than keep a third array.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, n / 4096));
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  chunk_counts_.assign(chunks * buckets, 0);
  int64_t* counts = chunk_counts_.data();
  const int shift = 64 - shard_bits;
  auto bucket_of = [&](int64_t key, uint64_t h) -> int64_t {
    if (ids_are_handles) return key < 0 ? shards : key >> kHandleShardShift;
    return shard_bits == 0 ? 0 : static_cast<int64_t>(h >> shift);
  };
  run(chunks, per_chunk * 10, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* count_of = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i)
        ++count_of[bucket_of(ids[i], ids_are_handles ? 0 : HashKey(ids[i]))];
    }
  });
  int64_t pos = 0;
  for (int64_t s = 0; s < buckets; ++s) {
    begin[s] = pos;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k = counts[c * buckets + s];
      counts[c * buckets + s] = pos;
      pos += k;
    }
  }
  begin[buckets] = pos;
  run(chunks, per_chunk * 15, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* next = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i) {
        const uint64_t h = ids_are_handles ? 0 : HashKey(ids[i]);
        const int64_t p = next[bucket_of(ids[i], h)]++;
        if (dedup) {
          raw_p_[p] = static_cast<uint32_t>(i);
          continue;
        }
        order[p] = i;
        id[p] = ids[i];
        if (!ids_are_handles) hash[p] = h;
      }
    }
  });
  if (!dedup) {
    distinct_end.assign(begin.begin() + 1, begin.end());
  } else {
    distinct_end.assign(begin.begin(), begin.end() - 1);
    // Each shard's dedup map: a power of two of at least twice its ids.
    map_begin_.assign(buckets + 1, 0);
    for (int64_t s = 0; s < buckets; ++s) {
      int64_t cap = 16;
      while (cap < 2 * (begin[s + 1] - begin[s])) cap *= 2;
      map_begin_[s + 1] = map_begin_[s] + cap;
    }
    map_p_ = map_.Get(static_cast<size_t>(map_begin_[buckets]));
  }
  if (groups.size() < static_cast<size_t>(buckets)) groups.resize(buckets);
}

void Batch::Dedup(int64_t s) {
  const int64_t b = begin[s], e = begin[s + 1];
  uint32_t* map = map_p_ + map_begin_[s];
  const uint64_t mask = static_cast<uint64_t>(map_begin_[s + 1] - map_begin_[s]) - 1;
  std::fill(map, map + mask + 1, kFree);
  // Distinct ids fill the part from the front, repeats from the back (the
  // repeats' order does not matter: each knows which occurrence it is).
  int64_t next = b, repeat = e;
  for (int64_t q = b; q < e; ++q) {
    const int64_t i = raw_p_[q];
    const int64_t key = ids_[i];
    const uint64_t h = HashKey(key);
    // The hash's top bits chose the shard: its low bits place the key here.
    for (uint64_t at = h & mask;; at = (at + 1) & mask) {
      const uint32_t j = map[at];
      if (j == kFree) {
        map[at] = static_cast<uint32_t>(next - b);
        index[i] = static_cast<uint32_t>(next);
        order[next] = i;
        id[next] = key;
        hash[next] = h;
        count[next] = 1;
        ++next;
        break;
      }
      if (id[b + j] == key) {
        const int64_t p = --repeat;
        index[i] = static_cast<uint32_t>(b + j);
        order[p] = i;
        id[p] = key;
        first[p] = static_cast<uint32_t>(b + j);
        count[p] = count[b + j]++;
        break;
      }
    }
  }
  distinct_end[s] = next;
}

}  // namespace graphmod
