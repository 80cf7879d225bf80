// Tests of native/batch.h: batch dedup, grouping ids by shard, and summing
// the gradients of rows seen more than once.
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "native/batch.h"
#include "native/bits.h"
#include "native/row_store.h"
#include "native/test_check.h"

using graphmod::Batch;
using graphmod::Distinct;
using graphmod::RowGroups;

namespace {

void TestDistinct() {
  const std::vector<int64_t> keys = {5, 3, 5, 9, 3, 5, -1};
  Distinct d;
  d.Build(keys.data(), keys.size());
  CHECK(d.ids == (std::vector<int64_t>{5, 3, 9, -1}));  // order of first appearance
  CHECK(d.count == (std::vector<uint32_t>{3, 2, 1, 1}));
  CHECK(d.index == (std::vector<uint32_t>{0, 1, 0, 2, 1, 0, 3}));
  d.Build(keys.data(), 0);
  CHECK(d.ids.empty() && d.index.empty());
}

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

void TestPartitionKeys() {
  std::mt19937_64 rng(3);
  for (int shards : {1, 4, 16}) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{50000}}) {
      std::vector<int64_t> ids(n);
      for (auto& id : ids) id = static_cast<int64_t>(rng() % 100000) - 500;
      CheckPartition(graphmod::Partition(ids.data(), n, false, shards, graphmod::SerialRunner),
                     ids, shards, false);
    }
  }
}

void TestPartitionHandles() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(graphmod::MakeHandle(i % 8, 3, i));
  ids.push_back(-1);  // a lookup that got no row
  const Batch b = graphmod::Partition(ids.data(), ids.size(), true, 8, graphmod::SerialRunner);
  CHECK(b.hash.empty());
  CheckPartition(b, ids, 8, true);
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
  TestDistinct();
  TestPartitionKeys();
  TestPartitionHandles();
  TestRowGroupsSumDuplicates();
  TestSerialRunner();
  return graphmod_test::TestExit("batch_test");
}
