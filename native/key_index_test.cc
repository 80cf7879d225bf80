// Tests of native/key_index.h on its own: keys live in a plain vector
// (row -> key), standing in for a row store.
#include <cstdint>
#include <vector>

#include "native/bits.h"
#include "native/key_index.h"
#include "native/test_check.h"

using graphmod::HashKey;
using graphmod::KeyIndex;

namespace {

struct Keys {
  std::vector<int64_t> key;  // by row
  std::vector<bool> live;
  auto KeyOf() const {
    return [this](uint32_t row) { return key[row]; };
  }
  auto LiveRows() const {
    return [this](const auto& fn) {
      for (uint32_t r = 0; r < key.size(); ++r)
        if (live[r]) fn(r, HashKey(key[r]));
    };
  }
};

// Inserts key as row number keys->key.size(); false when already present.
bool Insert(KeyIndex* index, Keys* keys, int64_t key) {
  const uint64_t h = HashKey(key);
  bool found;
  size_t slot = index->Probe(key, h, keys->KeyOf(), &found);
  if (found) return false;
  if (!index->HasRoomForOne()) {
    index->ReserveOne(keys->LiveRows());
    slot = index->Probe(key, h, keys->KeyOf(), &found);
  }
  const uint32_t row = static_cast<uint32_t>(keys->key.size());
  keys->key.push_back(key);
  keys->live.push_back(true);
  index->Fill(slot, h, row);
  return true;
}

bool Erase(KeyIndex* index, Keys* keys, int64_t key) {
  bool found;
  const size_t slot = index->Probe(key, HashKey(key), keys->KeyOf(), &found);
  if (!found) return false;
  keys->live[index->row(slot)] = false;
  index->Erase(slot);
  return true;
}

void TestEmptyIndexFindsNothing() {
  KeyIndex index;
  Keys keys;
  CHECK(index.FindRow(5, HashKey(5), keys.KeyOf()) == KeyIndex::kNoRow);
  CHECK(!index.HasRoomForOne());
  CHECK(index.used() == 0 && index.bytes() == 0);
}

void TestInsertFindGrow() {
  KeyIndex index;
  Keys keys;
  const int64_t n = 20000;
  for (int64_t k = 0; k < n; ++k) CHECK(Insert(&index, &keys, k * 7919 - 3));
  CHECK(!Insert(&index, &keys, 7919 - 3));  // present already
  CHECK(index.used() == static_cast<size_t>(n));
  CHECK(index.used() * 8 <= index.slots() * 7);  // at most 7/8 full
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t row = index.FindRow(k * 7919 - 3, HashKey(k * 7919 - 3), keys.KeyOf());
    CHECK(row == static_cast<uint32_t>(k));
  }
  for (int64_t k = n; k < n + 1000; ++k)
    CHECK(index.FindRow(k * 7919 - 3, HashKey(k * 7919 - 3), keys.KeyOf()) == KeyIndex::kNoRow);
  CHECK(index.bytes() == static_cast<int64_t>(index.groups() * 64));
}

void TestEraseLeavesTombstonesThatChainsSurvive() {
  KeyIndex index;
  Keys keys;
  for (int64_t k = 0; k < 5000; ++k) Insert(&index, &keys, k);
  for (int64_t k = 0; k < 5000; k += 2) CHECK(Erase(&index, &keys, k));
  CHECK(!Erase(&index, &keys, 0));
  CHECK(index.used() == 2500 && index.deleted() == 2500);
  // Keys probed past a tombstone are still found.
  for (int64_t k = 1; k < 5000; k += 2)
    CHECK(index.FindRow(k, HashKey(k), keys.KeyOf()) != KeyIndex::kNoRow);
  for (int64_t k = 0; k < 5000; k += 2)
    CHECK(index.FindRow(k, HashKey(k), keys.KeyOf()) == KeyIndex::kNoRow);
  // Re-inserting fills tombstones first; purging them keeps every key.
  for (int64_t k = 0; k < 5000; k += 2) CHECK(Insert(&index, &keys, k));
  CHECK(index.used() == 5000);
  index.Rehash(index.used(), keys.LiveRows());
  CHECK(index.deleted() == 0);
  for (int64_t k = 0; k < 5000; ++k) {
    const uint32_t row = index.FindRow(k, HashKey(k), keys.KeyOf());
    CHECK(row != KeyIndex::kNoRow && keys.key[row] == k);
  }
}

void TestReserveAvoidsRebuilds() {
  KeyIndex index;
  Keys keys;
  index.Reserve(10000, keys.LiveRows());
  const size_t groups = index.groups();
  CHECK(groups * KeyIndex::kGroup * 7 >= 10000 * 8);
  for (int64_t k = 0; k < 10000; ++k) Insert(&index, &keys, k);
  CHECK(index.groups() == groups);  // no rebuild on the way
}

void TestHomeGroupInRange() {
  for (size_t groups : {size_t{1}, size_t{3}, size_t{1000}, size_t{123457}})
    for (int64_t k = 0; k < 1000; ++k) CHECK(KeyIndex::HomeGroup(HashKey(k), groups) < groups);
}

void TestPrefetchCandidateNamesAMatchingRow() {
  // Five keys in a fresh index: each key's candidate is the first slot with
  // its tag, which is the key itself unless an earlier key shares the tag
  // (these five have distinct tags).
  KeyIndex index;
  Keys keys;
  for (int64_t k = 0; k < 5; ++k) Insert(&index, &keys, k);
  CHECK(index.groups() <= 2);  // no group overflows: each key sits in its home group
  for (int64_t k = 0; k < 5; ++k) {
    int calls = 0;
    index.PrefetchCandidate(HashKey(k), [&](uint32_t row) {
      ++calls;
      CHECK(keys.key[row] == k);
    });
    CHECK(calls == 1);
  }
}

void TestReset() {
  KeyIndex index;
  Keys keys;
  for (int64_t k = 0; k < 100; ++k) Insert(&index, &keys, k);
  index.Reset();
  CHECK(index.used() == 0 && index.groups() == 0 && index.bytes() == 0);
  CHECK(index.FindRow(1, HashKey(1), keys.KeyOf()) == KeyIndex::kNoRow);
}

}  // namespace

int main() {
  TestEmptyIndexFindsNothing();
  TestInsertFindGrow();
  TestEraseLeavesTombstonesThatChainsSurvive();
  TestReserveAvoidsRebuilds();
  TestHomeGroupInRange();
  TestPrefetchCandidateNamesAMatchingRow();
  TestReset();
  return graphmod_test::TestExit("key_index_test");
}
