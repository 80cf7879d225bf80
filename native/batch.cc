#include "native/batch.h"

#include <algorithm>

#include "native/bits.h"
#include "native/row_store.h"

namespace graphmod {

void SerialRunner(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  if (n > 0) fn(0, n);
}

Batch Partition(const int64_t* ids, int64_t n, bool ids_are_handles, int num_shards,
                const Runner& run) {
  Batch batch;
  const int64_t shards = num_shards;
  int shard_bits = 0;
  while ((1 << shard_bits) < num_shards) ++shard_bits;
  // One bucket per shard, and a last one for negative handles (lookups that
  // got no row), which no shard processes.
  const int64_t buckets = shards + 1;
  batch.order.resize(n);
  batch.id.resize(n);
  batch.hash.resize(ids_are_handles ? 0 : n);
  batch.begin.assign(buckets + 1, 0);
  // Two-pass counting sort, each pass split over chunks that may run in
  // parallel; the second pass hashes again rather than keep a third array.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(16, n / 8192));
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  std::vector<int64_t> counts(chunks * buckets, 0);
  const int shift = 64 - shard_bits;
  auto bucket_of = [&](int64_t id, uint64_t h) -> int64_t {
    if (ids_are_handles) return id < 0 ? shards : id >> kHandleShardShift;
    return shard_bits == 0 ? 0 : static_cast<int64_t>(h >> shift);
  };
  run(chunks, per_chunk * 10, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* count = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i)
        ++count[bucket_of(ids[i], ids_are_handles ? 0 : HashKey(ids[i]))];
    }
  });
  int64_t pos = 0;
  for (int64_t s = 0; s < buckets; ++s) {
    batch.begin[s] = pos;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k = counts[c * buckets + s];
      counts[c * buckets + s] = pos;
      pos += k;
    }
  }
  batch.begin[buckets] = pos;
  run(chunks, per_chunk * 15, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* next = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i) {
        const uint64_t h = ids_are_handles ? 0 : HashKey(ids[i]);
        const int64_t p = next[bucket_of(ids[i], h)]++;
        batch.order[p] = i;
        batch.id[p] = ids[i];
        if (!ids_are_handles) batch.hash[p] = h;
      }
    }
  });
  return batch;
}

void Distinct::Build(const int64_t* keys, int64_t n) {
  size_t cap = 16;
  while (cap < 2 * static_cast<size_t>(n)) cap *= 2;
  const int bits = __builtin_ctzll(cap);
  std::vector<uint32_t> slot(cap, kFree);
  ids.clear();
  count.clear();
  ids.reserve(n);
  count.reserve(n);
  index.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    size_t at = Mix(static_cast<uint64_t>(keys[i])) >> (64 - bits);
    for (;; at = (at + 1) & (cap - 1)) {
      const uint32_t j = slot[at];
      if (j == kFree) {
        slot[at] = static_cast<uint32_t>(ids.size());
        index[i] = static_cast<uint32_t>(ids.size());
        ids.push_back(keys[i]);
        count.push_back(1);
        break;
      }
      if (ids[j] == keys[i]) {
        index[i] = j;
        ++count[j];
        break;
      }
    }
  }
}

}  // namespace graphmod
