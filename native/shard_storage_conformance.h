// The checks every shard layout must pass (the contract in shard_storage.h),
// as a template: a layout's test calls ShardStorageConformance<Layout>(), so
// each layout is held to the promises the shard relies on. Test-only; uses
// CHECK from test_check.h.
#ifndef GRAPHMOD_NATIVE_SHARD_STORAGE_CONFORMANCE_H_
#define GRAPHMOD_NATIVE_SHARD_STORAGE_CONFORMANCE_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "native/bits.h"
#include "native/row_store.h"
#include "native/shard_storage.h"
#include "native/test_check.h"

namespace graphmod_test {

// A record's payload derived from its key and a per-write salt.
inline void Fill(char* rec, const graphmod::RecordLayout& layout, int64_t key, int salt) {
  float* v = graphmod::Values(rec);
  for (int j = 0; j < layout.dim * (1 + layout.num_slots); ++j)
    v[j] = static_cast<float>((key % 1000) * 0.25 + j + salt);
}
inline bool Holds(const char* rec, const graphmod::RecordLayout& layout, int64_t key, int salt) {
  const float* v = graphmod::Values(rec);
  for (int j = 0; j < layout.dim * (1 + layout.num_slots); ++j)
    if (v[j] != static_cast<float>((key % 1000) * 0.25 + j + salt)) return false;
  return graphmod::Header(rec)->key == key;
}

// Random inserts, erases and growth against a std::unordered_map: every live
// key is found with its record intact, every erased key is absent, the live
// set and size agree, handles resolve to their key's row until it is freed.
template <class S>
void ShardStorageConformance(const graphmod::RecordLayout& layout, int ops, uint64_t seed) {
  static_assert(graphmod::CheckShardStorage<S>(), "see shard_storage.h");
  using graphmod::HashKey;
  S rows(layout);
  CHECK(rows.size() == 0 && rows.Bytes() >= 0);
  CHECK(rows.Find(7, HashKey(7)) == S::kNoRow);
  std::mt19937_64 rng(seed);
  std::unordered_map<int64_t, int> salt;      // live key -> payload salt
  std::unordered_map<int64_t, uint64_t> handle;  // live key -> bits from this version
  int64_t version = 1;
  auto check_all = [&] {
    CHECK(rows.size() == salt.size());
    size_t live = 0;
    std::set<uint32_t> refs;
    rows.ForEachLive([&](uint32_t ref, const char* rec) {
      ++live;
      refs.insert(ref);
      const int64_t key = graphmod::Header(rec)->key;
      auto it = salt.find(key);
      CHECK(it != salt.end() && Holds(rec, layout, key, it->second));
      CHECK(rows.Record(ref) == rec);
    });
    CHECK(live == salt.size() && refs.size() == live);
    for (const auto& [key, s] : salt) {
      const uint32_t ref = rows.Find(key, HashKey(key));
      CHECK(ref != S::kNoRow && Holds(rows.Record(ref), layout, key, s));
    }
  };
  for (int op = 0; op < ops; ++op) {
    // A batch: room first (rows may move), then inserts and erases, then the
    // handles of this batch are checked (a later batch may move them again).
    const int batch = 1 + static_cast<int>(rng() % 300);
    rows.Reserve(batch, ++version);
    // Handles of the previous batch still resolve to their keys after the move.
    for (const auto& [key, bits] : handle) {
      uint32_t ref = S::kNoRow;
      const bool live = salt.count(key) != 0;
      const bool resolved = rows.Resolve(bits, &ref);
      CHECK(resolved == live);
      if (resolved && live) CHECK(graphmod::Header(rows.Record(ref))->key == key);
    }
    handle.clear();
    for (int i = 0; i < batch; ++i) {
      // Keys from a range that makes repeats and erases of live keys common.
      const int64_t key = static_cast<int64_t>(rng() % 4000) - 2000;
      const uint64_t h = HashKey(key);
      uint32_t ref = rows.Find(key, h);
      if (rng() % 4 == 0) {  // erase (if live)
        CHECK((ref != S::kNoRow) == (salt.count(key) != 0));
        if (ref != S::kNoRow) {
          const uint64_t bits = rows.HandleBits(ref);
          rows.Erase(ref);
          salt.erase(key);
          handle.erase(key);
          uint32_t again;
          CHECK(!rows.Resolve(bits, &again));  // a freed row's handle is stale
          CHECK(rows.Find(key, h) == S::kNoRow);
        }
        continue;
      }
      if (ref == S::kNoRow) {
        CHECK(salt.count(key) == 0);
        ref = rows.Insert(key, h);
        CHECK(graphmod::Header(rows.Record(ref))->key == key);
      }
      const int s = static_cast<int>(rng() % 100);
      Fill(rows.Record(ref), layout, key, s);
      salt[key] = s;
      handle[key] = rows.HandleBits(ref);
      CHECK(rows.MayOwn(handle[key]));
    }
    if (op % 16 == 0) check_all();
  }
  check_all();
  // Reset: empty, and every handle stale.
  rows.Reset();
  CHECK(rows.size() == 0);
  for (const auto& [key, bits] : handle) {
    uint32_t ref;
    CHECK(!rows.Resolve(bits, &ref));
    CHECK(rows.Find(key, HashKey(key)) == S::kNoRow);
  }
  // A place this layout never had does not belong to it.
  CHECK(!rows.MayOwn(uint64_t{0x7FFFFFF0}));
}

}  // namespace graphmod_test

#endif  // GRAPHMOD_NATIVE_SHARD_STORAGE_CONFORMANCE_H_
