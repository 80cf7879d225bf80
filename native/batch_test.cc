// Tests of native/batch.h: batch dedup, grouping ids by shard, and summing
// the gradients of rows seen more than once.
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <random>
#include <set>
#include <vector>

#include "native/batch.h"
#include "native/bits.h"
#include "native/row_store.h"
#include "native/test_check.h"

using graphmod::Batch;
using graphmod::RowGroups;

namespace {

// Every position appears once, in the bucket of its shard.
void CheckPartition(const Batch& b, const std::vector<int64_t>& ids, int shards, bool handles) {
  std::set<int64_t> positions;
  for (int s = 0; s <= shards; ++s)
    for (int64_t p = b.begin[s]; p < b.begin[s + 1]; ++p) {
      positions.insert(b.order[p]);
      CHECK(b.id[p] == ids[b.order[p]]);
      if (handles) {
        CHECK(ids[b.order[p]] < 0 ? s == shards
                                  : static_cast<int>(graphmod::HandleShard(b.id[p])) == s);
      } else {
        CHECK(b.hash[p] == graphmod::HashKey(b.id[p]));
        CHECK(static_cast<int>(shards == 1 ? 0 : b.hash[p] >> (64 - __builtin_ctz(shards))) == s);
      }
    }
  CHECK(positions.size() == ids.size());
  CHECK(b.begin[shards + 1] == static_cast<int64_t>(ids.size()));
}

// A runner that splits [0, n) into single units on separate threads.
void ThreadRunner(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i, i + 1); });
  for (auto& t : threads) t.join();
}

void TestPartitionKeys() {
  std::mt19937_64 rng(3);
  Batch b;  // reused: its buffers hold the largest batch yet
  for (int shards : {1, 4, 16}) {
    for (int64_t n : {int64_t{50000}, int64_t{0}, int64_t{7}, int64_t{70000}}) {
      std::vector<int64_t> ids(n);
      for (auto& id : ids) id = static_cast<int64_t>(rng() % 100000) - 500;
      b.Partition(ids.data(), n, false, false, shards,
                  n > 60000 ? graphmod::Runner(ThreadRunner) : graphmod::SerialRunner);
      CheckPartition(b, ids, shards, false);
      for (int s = 0; s <= shards; ++s) CHECK(b.distinct_end[s] == b.begin[s + 1]);
    }
  }
}

void TestPartitionHandles() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(graphmod::MakeHandle(i % 8, 3, i));
  ids.push_back(-1);  // a lookup that got no row
  Batch b;
  b.Partition(ids.data(), ids.size(), true, false, 8, graphmod::SerialRunner);
  CHECK(b.hash == nullptr);
  CheckPartition(b, ids, 8, true);
}

// Dedup per shard: each id once, in order of first appearance, with its
// occurrences; each repeat points at its id's entry and knows which
// occurrence it is; every batch position is still there once.
void TestDedup() {
  const std::vector<int64_t> small = {5, 3, 5, 9, 3, 5, -1};
  Batch b;
  b.Partition(small.data(), small.size(), false, true, 1, graphmod::SerialRunner);
  CHECK(b.distinct_end[0] == b.begin[0]);  // nothing until Dedup
  b.Dedup(0);
  CHECK(b.distinct(0) == 4);
  CHECK(b.id[0] == 5 && b.id[1] == 3 && b.id[2] == 9 && b.id[3] == -1);
  CHECK(b.count[0] == 3 && b.count[1] == 2 && b.count[2] == 1 && b.count[3] == 1);
  CHECK(b.order[0] == 0 && b.order[1] == 1 && b.order[2] == 3 && b.order[3] == 6);
  std::multiset<uint32_t> occurrences_of_5, occurrences_of_3;
  for (int64_t q = 4; q < 7; ++q) {
    CHECK(b.id[b.first[q]] == b.id[q] && small[b.order[q]] == b.id[q]);
    (b.id[q] == 5 ? occurrences_of_5 : occurrences_of_3).insert(b.count[q]);
  }
  CHECK(occurrences_of_5 == (std::multiset<uint32_t>{1, 2}));
  CHECK(occurrences_of_3 == (std::multiset<uint32_t>{1}));
  // Zipf-like batches over 16 shards, deduplicated on threads.
  std::mt19937_64 rng(5);
  for (int64_t n : {int64_t{100000}, int64_t{3000}}) {
    std::vector<int64_t> ids(n);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 64 == 0 ? rng() : rng() % 500);
    b.Partition(ids.data(), n, false, true, 16, ThreadRunner);
    ThreadRunner(16, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) b.Dedup(s);
    });
    std::map<int64_t, int64_t> expected;
    for (int64_t id : ids) ++expected[id];
    std::map<int64_t, int64_t> got;
    std::set<int64_t> positions;
    for (int64_t i = 0; i < n; ++i) {  // each batch position to its id's entry
      const int64_t j = b.index[i];
      CHECK(b.id[j] == ids[i] && b.order[j] <= i);
    }
    for (int s = 0; s < 16; ++s) {
      std::map<int64_t, std::set<uint32_t>> occurrences;  // of each repeated id: 1, 2, ...
      for (int64_t q = b.distinct_end[s]; q < b.begin[s + 1]; ++q) {
        CHECK(b.first[q] >= b.begin[s] && b.first[q] < b.distinct_end[s]);
        CHECK(b.id[b.first[q]] == b.id[q] && b.index[b.order[q]] == b.first[q]);
        occurrences[b.id[q]].insert(b.count[q]);
      }
      for (const auto& [id, seen] : occurrences)
        CHECK(static_cast<int64_t>(seen.size()) == expected[id] - 1 && *seen.begin() == 1 &&
              *seen.rbegin() == expected[id] - 1);
      for (int64_t p = b.begin[s]; p < b.distinct_end[s]; ++p) {
        CHECK(got.count(b.id[p]) == 0);
        got[b.id[p]] = b.count[p];
        // first appearance: no earlier batch position holds this id
        for (int64_t q = b.distinct_end[s]; q < b.begin[s + 1]; ++q)
          if (b.id[q] == b.id[p]) CHECK(b.order[q] > b.order[p]);
      }
      for (int64_t p = b.begin[s]; p < b.begin[s + 1]; ++p) {
        positions.insert(b.order[p]);
        CHECK(ids[b.order[p]] == b.id[p]);
      }
    }
    CHECK(got == expected && positions.size() == ids.size());
  }
}

void TestRowGroupsSumDuplicates() {
  const int d = 2;
  const std::vector<float> grads = {1, 2, 10, 20, 100, 200, 3, 4};
  RowGroups g;
  g.Reset(4, d);
  g.Add(7, &grads[0]);
  g.Add(9, &grads[2]);
  g.Add(7, &grads[4]);
  g.Add(7, &grads[6]);
  CHECK(g.size() == 2 && g.row(0) == 7 && g.row(1) == 9);
  CHECK(g.grad(0)[0] == 104 && g.grad(0)[1] == 206);
  CHECK(g.grad(1) == &grads[2]);  // seen once: no copy
  g.Reset(1, d);
  CHECK(g.size() == 0);
}

void TestSerialRunner() {
  int64_t covered = 0, calls = 0;
  graphmod::SerialRunner(10, 1, [&](int64_t b, int64_t e) {
    covered += e - b;
    ++calls;
  });
  CHECK(covered == 10 && calls == 1);
  graphmod::SerialRunner(0, 1, [&](int64_t, int64_t) { ++calls; });
  CHECK(calls == 1);
}

}  // namespace

int main() {
  TestDedup();
  TestPartitionKeys();
  TestPartitionHandles();
  TestRowGroupsSumDuplicates();
  TestSerialRunner();
  return graphmod_test::TestExit("batch_test");
}
