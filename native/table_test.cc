// Unit tests of graphmod::EmbeddingTable alone (no TensorFlow).
// Built by `bazel test //native:table_test` and by `make native-test`.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "native/table.h"

using graphmod::EmbeddingTable;
using graphmod::ExportBuffers;
using graphmod::Initializer;
using graphmod::Optimizer;
using graphmod::OptimizerKind;
using graphmod::TableConfig;

namespace {

std::atomic<int> failures{0};  // CHECKs may fail on several threads at once

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

// Every test runs once per shard layout, and once more over the arena
// layout with a disk tier that keeps 4 rows a shard in memory: rows move to
// disk and back all the time, and every test must hold as it does in memory
// (main sets these).
std::string layout = "arena";
bool tiered = false;
// How rows are stored; the concurrent saves run once more with float16
// (main): the snapshot's byte copies of small records, under TSan too.
graphmod::StorageType storage = graphmod::StorageType::kFloat32;

std::string StoragePath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/graphmod_table_test";
}

TableConfig Config(int dim, int slots = 0) {
  TableConfig c;
  c.name = "test";
  c.layout = layout;
  if (tiered) {
    const size_t stride = (24 + 4 * dim * (1 + slots) + 7) / 8 * 8;
    c.memory_budget = 4.0 * stride * c.num_shards;
    c.storage_path = StoragePath();
  }
  c.dim = dim;
  c.num_slots = slots;
  c.values_type = c.slots_type = storage;
  c.slot_init.assign(slots, 0.5f);
  c.init = Initializer::kNormal;
  c.init_b = 1.f;
  c.seed = 7;
  return c;
}

// Runs the chunks on real threads, as TF's intra-op pool would.
void ThreadRunner(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  std::vector<std::thread> threads;
  const int64_t parts = std::min<int64_t>(n, 4);
  for (int64_t p = 0; p < parts; ++p)
    threads.emplace_back([&, p] { fn(n * p / parts, n * (p + 1) / parts); });
  for (auto& t : threads) t.join();
}

struct Exported {
  std::vector<int64_t> keys, counts, last_seen, versions;
  std::vector<float> values, slots;
};

Exported ExportAll(const EmbeddingTable& t, int64_t min_version = 0) {
  Exported e;
  const int d = t.config().dim, s = t.config().num_slots;
  t.Export(min_version, [&](int64_t n) {
    e.keys.resize(n);
    e.counts.resize(n);
    e.last_seen.resize(n);
    e.versions.resize(n);
    e.values.resize(n * d);
    e.slots.resize(n * d * s);
    ExportBuffers b;
    b.keys = e.keys.data();
    b.values = e.values.data();
    b.slots = e.slots.data();
    b.counts = e.counts.data();
    b.last_seen = e.last_seen.data();
    b.versions = e.versions.data();
    return b;
  });
  return e;
}

void TestGrowthKeepsRowsAndHandles() {
  EmbeddingTable t(Config(8));
  std::vector<int64_t> keys = {0, -1, std::numeric_limits<int64_t>::min(),
                               std::numeric_limits<int64_t>::max()};
  std::mt19937_64 rng(1);
  while (keys.size() < 200000) keys.push_back(static_cast<int64_t>(rng()));
  std::vector<float> first(8 * 4), values(8 * keys.size());
  std::vector<int64_t> first_handles(4), handles(keys.size());
  t.FindOrInsert(keys.data(), 4, 1, -1, first.data(), first_handles.data(), graphmod::SerialRunner);
  t.FindOrInsert(keys.data(), keys.size(), 2, -1, values.data(), handles.data(), ThreadRunner);
  CHECK(t.size() == static_cast<int64_t>(keys.size()));
  for (int i = 0; i < 4; ++i) {
    // The arena never moves a row; the buckets layout moved them all (it
    // grew), and the first lookup's handles follow them.
    if (layout == "arena") CHECK(handles[i] == first_handles[i]);
    CHECK(std::equal(first.begin() + 8 * i, first.begin() + 8 * i + 8, values.begin() + 8 * i));
  }
  std::vector<float> expect(8);
  for (size_t i = 0; i < keys.size(); i += 997) {
    t.InitialRow(keys[i], expect.data());
    CHECK(std::equal(expect.begin(), expect.end(), values.begin() + 8 * i));
  }
  // Read-only find agrees, and does not insert.
  std::vector<float> found(8 * keys.size());
  t.Find(keys.data(), keys.size(), found.data(), ThreadRunner);
  CHECK(found == values);
  const int64_t unknown = 123456789;
  t.Find(&unknown, 1, found.data(), graphmod::SerialRunner);
  CHECK(t.size() == static_cast<int64_t>(keys.size()));
  // Memory: a 56-byte record plus index and arena slack; at this size the
  // last geometric block is partly empty, so allow 1.5x records + the index.
  // Buckets: 64 bytes a slot (8 records and a header in whole cache lines),
  // at least 60% full after a rebuild, plus, until 16 versions later, the
  // moves a handle may follow (8 bytes an old slot, ~18 a key).
  const double per_key = static_cast<double>(t.memory_bytes()) / t.size();
  std::printf("bytes per key (dim 8, 200k keys): %.1f\n", per_key);
  CHECK(per_key <= (layout == "arena" ? 1.5 * (4 * 8 + 24) + 12 : 64 / 0.6 + 20));
  // The first lookup's handles, applied after the growth, reach their rows.
  Optimizer sgd;
  sgd.lr = 1.f;
  const std::vector<float> ones(8 * 4, 1.f);
  CHECK(t.Apply(sgd, first_handles.data(), true, ones.data(), 4, graphmod::SerialRunner).empty());
  CHECK(t.counters().stale == 0);
  t.Find(keys.data(), 4, found.data(), graphmod::SerialRunner);
  for (int j = 0; j < 8 * 4; ++j) CHECK(std::fabs(found[j] - (first[j] - 1.f)) < 1e-6f);
  // Sixteen steps later the moves are forgotten: the slots alone remain.
  for (int step = 0; step < 16; ++step) {
    t.FindOrInsert(keys.data(), 4, 3 + step, -1, first.data(), first_handles.data(),
                   graphmod::SerialRunner);
    CHECK(t.Apply(sgd, first_handles.data(), true, ones.data(), 4, graphmod::SerialRunner).empty());
  }
  const double settled = static_cast<double>(t.memory_bytes()) / t.size();
  std::printf("bytes per key after 16 steps: %.1f\n", settled);
  // (With a disk tier the rows went to disk, but the arena keeps its blocks.)
  CHECK(tiered || settled <= (layout == "arena" ? per_key : 64 / 0.6 + 1));
}

// Many lookups of new keys before one Apply (features sharing a table,
// unfused): the table grows under handles already handed out, and every
// handle still updates its own row.
void TestManyLookupsBeforeOneApply() {
  EmbeddingTable t(Config(2));
  Optimizer sgd;
  sgd.lr = 1.f;
  std::vector<int64_t> keys(16000), handles(16000);
  std::vector<float> values(2 * 16000), before(2 * 16000), after(2 * 16000);
  for (int64_t i = 0; i < 16000; ++i) keys[i] = i * 7919;
  for (int part = 0; part < 16; ++part)
    t.FindOrInsert(keys.data() + part * 1000, 1000, 1, -1, before.data() + part * 2000,
                   handles.data() + part * 1000, ThreadRunner);
  const std::vector<float> ones(2 * 16000, 1.f);
  CHECK(t.Apply(sgd, handles.data(), true, ones.data(), 16000, ThreadRunner).empty());
  CHECK(t.counters().stale == 0);
  t.Find(keys.data(), 16000, after.data(), ThreadRunner);
  for (int64_t j = 0; j < 2 * 16000; ++j) CHECK(std::fabs(after[j] - (before[j] - 1.f)) < 1e-5f);
}

// Lookups of keys the table holds do not grow it.
void TestHitsDoNotGrowTheTable() {
  EmbeddingTable t(Config(4));
  std::vector<int64_t> keys(100000);
  std::vector<float> values(4 * 100000);
  for (int64_t i = 0; i < 100000; ++i) keys[i] = i;
  for (int64_t b = 0; b < 100000; b += 5000)
    t.FindOrInsert(keys.data() + b, 5000, 1, -1, values.data(), nullptr, ThreadRunner);
  const int64_t bytes = t.memory_bytes();
  std::mt19937_64 rng(3);
  std::vector<int64_t> batch(20000);
  for (int round = 0; round < 30; ++round) {
    for (int64_t& k : batch) k = static_cast<int64_t>(rng() % 100000);
    t.FindOrInsert(batch.data(), batch.size(), 2 + round, -1, values.data(), nullptr,
                   ThreadRunner);
  }
  CHECK(t.size() == 100000);
  CHECK(t.memory_bytes() == bytes);
}

void TestDeterministicInit() {
  // Same key and seed: same row, in any insertion order; other seed: other row.
  EmbeddingTable a(Config(16)), b(Config(16));
  TableConfig other = Config(16);
  other.seed = 8;
  EmbeddingTable c(other);
  std::vector<int64_t> keys = {5, 9, 11, -3};
  std::vector<int64_t> rev(keys.rbegin(), keys.rend());
  std::vector<float> va(64), vb(64), vc(64);
  a.FindOrInsert(keys.data(), 4, 0, -1, va.data(), nullptr, graphmod::SerialRunner);
  b.FindOrInsert(rev.data(), 4, 0, -1, vb.data(), nullptr, graphmod::SerialRunner);
  c.FindOrInsert(keys.data(), 4, 0, -1, vc.data(), nullptr, graphmod::SerialRunner);
  for (int i = 0; i < 4; ++i)
    CHECK(std::equal(va.begin() + 16 * i, va.begin() + 16 * i + 16, vb.begin() + 16 * (3 - i)));
  CHECK(va != vc);
  // Truncated normal stays within two standard deviations.
  TableConfig tn = Config(64);
  tn.init = Initializer::kTruncatedNormal;
  tn.init_b = 0.1f;
  EmbeddingTable t(tn);
  std::vector<float> row(64);
  double sum = 0, sq = 0;
  for (int64_t k = 0; k < 2000; ++k) {
    t.InitialRow(k, row.data());
    for (float x : row) {
      CHECK(std::fabs(x) <= 0.2f + 1e-6f);
      sum += x;
      sq += x * x;
    }
  }
  const double mean = sum / (2000 * 64), sd = std::sqrt(sq / (2000 * 64) - mean * mean);
  CHECK(std::fabs(mean) < 0.005);
  CHECK(sd > 0.08 && sd < 0.095);  // 0.88 x 0.1 for a unit normal truncated at 2
}

void TestApplySumsDuplicates() {
  EmbeddingTable t(Config(2, 1));
  std::vector<int64_t> keys = {4, 4, 6};
  std::vector<float> values(6);
  std::vector<int64_t> handles(3);
  t.FindOrInsert(keys.data(), 3, 0, -1, values.data(), handles.data(), graphmod::SerialRunner);
  Optimizer adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.lr = 1.f;
  std::vector<float> grads = {1, 1, 2, 2, 3, 3};
  CHECK(t.Apply(adagrad, handles.data(), true, grads.data(), 3, ThreadRunner).empty());
  Exported e = ExportAll(t);
  std::map<int64_t, int> at;
  for (size_t i = 0; i < e.keys.size(); ++i) at[e.keys[i]] = i;
  // Key 4: gradient 1 + 2 = 3 in one update: acc = 0.5 + 9, var -= 3 / sqrt(9.5).
  CHECK(std::fabs(e.slots[2 * at[4]] - 9.5f) < 1e-5f);
  CHECK(std::fabs(e.values[2 * at[4]] - (values[0] - 3.f / std::sqrt(9.5f))) < 1e-5f);
  CHECK(std::fabs(e.values[2 * at[6]] - (values[4] - 3.f / std::sqrt(9.5f))) < 1e-5f);
  CHECK(e.counts[at[4]] == 2 && e.counts[at[6]] == 1);
  // By key gives the same as by handle; unknown keys are dropped.
  std::vector<int64_t> by_key = {6, 99};
  std::vector<float> g2 = {1, 1, 1, 1};
  CHECK(t.Apply(adagrad, by_key.data(), false, g2.data(), 2, graphmod::SerialRunner).empty());
  CHECK(t.size() == 2);
  // Handles from nowhere and optimizers needing missing slots are refused.
  int64_t bad = (int64_t{99} << graphmod::kHandleShardShift) | 1;
  CHECK(!t.Apply(adagrad, &bad, true, g2.data(), 1, graphmod::SerialRunner).empty());
  bad = 1000;
  CHECK(!t.Apply(adagrad, &bad, true, g2.data(), 1, graphmod::SerialRunner).empty());
  Optimizer adam;
  adam.kind = OptimizerKind::kAdam;
  CHECK(!t.Apply(adam, by_key.data(), false, g2.data(), 1, graphmod::SerialRunner).empty());
}

void TestRemoveExportImport() {
  EmbeddingTable t(Config(4, 2));
  std::vector<int64_t> keys(5000);
  for (int i = 0; i < 5000; ++i) keys[i] = i * 7919 - 20000;
  std::vector<float> values(4 * keys.size());
  t.FindOrInsert(keys.data(), keys.size(), 42, -1, values.data(), nullptr, ThreadRunner);
  CHECK(t.Remove(keys.data(), 2500) == 2500);
  CHECK(t.Remove(keys.data(), 10) == 0);
  CHECK(t.size() == 2500);
  // Reinsert after removal reuses freed rows and finds the fresh initial rows.
  t.FindOrInsert(keys.data(), 100, 43, -1, values.data(), nullptr, ThreadRunner);
  CHECK(t.size() == 2600);
  Exported e = ExportAll(t);
  CHECK(e.keys.size() == 2600);
  EmbeddingTable u(Config(4, 2));
  CHECK(u.Import(e.keys.data(), e.values.data(), e.slots.data(), e.counts.data(),
                 e.last_seen.data(), e.versions.data(), e.keys.size(), true)
            .empty());
  Exported f = ExportAll(u);
  std::map<int64_t, size_t> ei, fi;
  for (size_t i = 0; i < e.keys.size(); ++i) ei[e.keys[i]] = i;
  for (size_t i = 0; i < f.keys.size(); ++i) fi[f.keys[i]] = i;
  CHECK(ei.size() == fi.size());
  for (const auto& kv : ei) {
    const size_t a = kv.second, b = fi[kv.first];
    CHECK(std::equal(e.values.begin() + 4 * a, e.values.begin() + 4 * a + 4, f.values.begin() + 4 * b));
    CHECK(e.last_seen[a] == f.last_seen[b] && e.counts[a] == f.counts[b]);
  }
  u.Clear();
  CHECK(u.size() == 0 && ExportAll(u).keys.empty());
}

void TestVersions() {
  EmbeddingTable t(Config(1));
  std::vector<int64_t> keys = {1, 2, 3};
  std::vector<float> v(3), g = {1, 1, 1};
  t.FindOrInsert(keys.data(), 3, 0, -1, v.data(), nullptr, graphmod::SerialRunner);
  Optimizer sgd;
  sgd.lr = 0.1f;
  CHECK(t.Apply(sgd, keys.data(), false, g.data(), 1, graphmod::SerialRunner).empty());
  const int64_t after_first = t.version();
  CHECK(t.Apply(sgd, keys.data() + 1, false, g.data(), 1, graphmod::SerialRunner).empty());
  // Only key 2 changed after the first apply.
  Exported e = ExportAll(t, after_first + 1);
  CHECK(e.keys.size() == 1 && e.keys[0] == 2);
}

// A handle outlives its row: the row is removed and reused by another key
// before the apply. The stale gradient is dropped and counted, never given to
// the new key; and an apply with a handle of another table changes no row.
void TestStaleHandlesAndAllOrNothing() {
  EmbeddingTable t(Config(2, 0));
  Optimizer sgd;
  sgd.lr = 1.f;
  std::vector<float> values(4), grad = {1.f, 1.f};
  int64_t k1 = 1, h1, k2 = 2, h2;
  t.FindOrInsert(&k1, 1, 0, -1, values.data(), &h1, graphmod::SerialRunner);
  CHECK(t.Remove(&k1, 1) == 1);
  // Force key 2 into key 1's shard and freed row: retry keys until one lands there.
  for (k2 = 2; k2 < 100000; ++k2) {
    t.FindOrInsert(&k2, 1, 0, -1, values.data(), &h2, graphmod::SerialRunner);
    if ((h2 & ((int64_t{1} << graphmod::kHandleRowBits) - 1)) ==
            (h1 & ((int64_t{1} << graphmod::kHandleRowBits) - 1)) &&
        (h2 >> graphmod::kHandleShardShift) == (h1 >> graphmod::kHandleShardShift))
      break;
    t.Remove(&k2, 1);
  }
  CHECK(k2 < 100000);  // some key took key 1's freed row
  CHECK(h2 != h1);     // same row, another generation
  std::vector<float> before(2), after(2);
  Exported e = ExportAll(t);
  CHECK(e.keys.size() == 1 && e.keys[0] == k2);
  before.assign(e.values.begin(), e.values.end());
  CHECK(t.Apply(sgd, &h1, true, grad.data(), 1, graphmod::SerialRunner).empty());
  e = ExportAll(t);
  CHECK(e.values == before);  // key 2 did not get key 1's gradient
  CHECK(t.counters().stale == 1);
  // All or nothing: a valid handle and one from nowhere -> error, no row moved.
  const int64_t mixed[2] = {h2, (int64_t{3} << graphmod::kHandleShardShift) | 99999};
  const std::vector<float> g2 = {1.f, 1.f, 1.f, 1.f};
  CHECK(!t.Apply(sgd, mixed, true, g2.data(), 2, graphmod::SerialRunner).empty());
  e = ExportAll(t);
  CHECK(e.values == before);
  CHECK(t.Apply(sgd, &h2, true, grad.data(), 1, graphmod::SerialRunner).empty());
  e = ExportAll(t);
  CHECK(std::fabs(e.values[0] - (before[0] - 1.f)) < 1e-6f);
  // Clear makes every handle stale: key 2 comes back in the same row, with
  // another generation, and its old handle updates nothing.
  t.Clear();
  t.FindOrInsert(&k2, 1, 0, -1, values.data(), &h1, graphmod::SerialRunner);
  CHECK(h1 != h2);
  e = ExportAll(t);
  CHECK(t.Apply(sgd, &h2, true, grad.data(), 1, graphmod::SerialRunner).empty());
  CHECK(ExportAll(t).values == e.values);
  CHECK(t.counters().stale == 2);
}

void TestConcurrentUse() {
  // Threads look up and update overlapping keys at once, prefetch their next
  // step's keys (a tiered table's input pipeline), remove some and evict old
  // ones: no crash, no lost row.
  EmbeddingTable t(Config(8, 1));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&t, w] {
      std::mt19937_64 rng(w);
      Optimizer adagrad;
      adagrad.kind = OptimizerKind::kAdagrad;
      adagrad.lr = 0.01f;
      std::vector<int64_t> keys(512), next(512), handles(512);
      std::vector<float> values(512 * 8), grads(512 * 8, 0.1f);
      for (auto& k : next) k = static_cast<int64_t>(rng() % 20000);
      for (int step = 0; step < 200; ++step) {
        keys.swap(next);
        for (auto& k : next) k = static_cast<int64_t>(rng() % 20000);
        if (!t.Prefetch(next.data(), next.size(), ThreadRunner).empty()) ++failures;
        t.FindOrInsert(keys.data(), keys.size(), step, -1, values.data(), handles.data(),
                       ThreadRunner);
        if (!t.Apply(adagrad, handles.data(), true, grads.data(), keys.size(), ThreadRunner)
                 .empty())
          ++failures;
        if (step % 50 == 0) t.Remove(keys.data(), 16);
        if (w == 0 && step % 40 == 39) t.Evict(step - 30, ThreadRunner);  // shards side by side
      }
    });
  }
  for (auto& th : threads) th.join();
  Exported e = ExportAll(t);
  CHECK(static_cast<int64_t>(e.keys.size()) == t.size());
  std::vector<int64_t> sorted = e.keys;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  for (int64_t k : sorted) CHECK(k >= 0 && k < 20000);
}

void TestMaxRows() {
  TableConfig c = Config(2, 1);
  c.max_rows = 10;
  c.when_full = graphmod::WhenFull::Refuse();
  EmbeddingTable t(c);
  std::vector<int64_t> keys(25), handles(25);
  for (int i = 0; i < 25; ++i) keys[i] = i % 20;  // 20 distinct, some twice
  std::vector<float> values(50), expect(2);
  t.FindOrInsert(keys.data(), 25, 0, -1, values.data(), handles.data(), ThreadRunner);
  CHECK(t.size() == 10);
  int refused = 0;
  for (int i = 0; i < 25; ++i) {
    t.InitialRow(keys[i], expect.data());  // refused keys read their initial row
    CHECK(std::equal(expect.begin(), expect.end(), values.begin() + 2 * i));
    refused += handles[i] == -1;
  }
  CHECK(refused >= 10);
  // Handle -1 is skipped by Apply; removing rows frees room for new keys.
  Optimizer sgd;
  sgd.lr = 1.f;
  std::vector<float> grads(50, 1.f);
  CHECK(t.Apply(sgd, handles.data(), true, grads.data(), 25, graphmod::SerialRunner).empty());
  Exported e = ExportAll(t);
  CHECK(t.Remove(e.keys.data(), 3) == 3 && t.size() == 7);
  const int64_t fresh[4] = {100, 101, 102, 103};
  t.FindOrInsert(fresh, 4, 0, -1, values.data(), handles.data(), graphmod::SerialRunner);
  CHECK(t.size() == 10 && std::count(handles.begin(), handles.begin() + 4, -1) == 1);
  // Restores ignore the bound.
  EmbeddingTable u(c);
  CHECK(u.Import(e.keys.data(), e.values.data(), e.slots.data(), nullptr, nullptr, nullptr,
                 e.keys.size(), false).empty());
  CHECK(u.Import(fresh, e.values.data(), e.slots.data(), nullptr, nullptr, nullptr, 4, false)
            .empty());
  CHECK(u.size() == 14);
}

// A key gets its row on exactly its threshold-th sighting, counted across
// calls and within one batch; until then it reads its initial row, gets no
// handle, and its count survives export/import.
// A repeated id refused its first occurrences reads the missing value
// (handle -1) there and its row from then on, whether the batch's rows go
// straight out (few repeats) or are gathered (many): both ways agree with
// the rule, on threads.
void TestRefusedRepeatsInBothOutputModes() {
  for (int64_t distinct : {int64_t{200}, int64_t{5}}) {  // straight out; gathered
    TableConfig c = Config(2);
    c.missing_is_initializer = false;
    c.default_value = -7.f;
    EmbeddingTable t(c);
    // 9 three times (admitted at its third sighting: threshold 3), 8 twice
    // (refused both times), then `distinct` fresh ids, the first 5 again.
    std::vector<int64_t> keys = {9, 8, 9, 9, 8};
    for (int64_t k = 0; k < distinct; ++k) keys.push_back(100 + k);
    for (int64_t k = 0; k < 5; ++k) keys.push_back(100 + k);
    if (distinct == 5)
      for (int r = 0; r < 40; ++r) keys.push_back(100 + r % 5);
    std::vector<float> values(keys.size() * 2);
    std::vector<int64_t> handles(keys.size());
    CHECK(t.FindOrInsert(keys.data(), keys.size(), 1, 3, values.data(), handles.data(),
                         ThreadRunner).empty());
    std::vector<float> row(2);
    t.InitialRow(9, row.data());
    CHECK(handles[0] == -1 && handles[2] == -1 && values[0] == -7.f && values[4] == -7.f);
    CHECK(handles[3] >= 0 && values[6] == row[0] && values[7] == row[1]);  // 9's third
    CHECK(handles[1] == -1 && handles[4] == -1 && values[8] == -7.f);      // 8, twice
    std::map<int64_t, int> seen;
    std::map<int64_t, int64_t> handle_of;  // one row, one handle, for every later sighting
    for (size_t i = 5; i < keys.size(); ++i) {
      const bool has_row = ++seen[keys[i]] >= 3;
      CHECK((handles[i] >= 0) == has_row);
      if (!has_row) CHECK(values[2 * i] == -7.f && values[2 * i + 1] == -7.f);
      if (has_row) CHECK(handle_of.emplace(keys[i], handles[i]).first->second == handles[i]);
    }
    CHECK(t.size() == (distinct == 5 ? 1 + 5 : 1));
  }
}

void TestAdmission() {
  EmbeddingTable t(Config(2, 1));
  std::vector<float> values(8), expect(2);
  std::vector<int64_t> handles(4);
  const int64_t seven = 7;
  for (int call = 1; call <= 3; ++call) {
    t.FindOrInsert(&seven, 1, call, 3, values.data(), handles.data(), graphmod::SerialRunner);
    CHECK((handles[0] == -1) == (call < 3));
    CHECK(t.size() == (call < 3 ? 0 : 1));
  }
  t.InitialRow(7, expect.data());
  CHECK(std::equal(expect.begin(), expect.end(), values.begin()));
  const int64_t nines[4] = {9, 9, 9, 9};
  t.FindOrInsert(nines, 4, 5, 3, values.data(), handles.data(), graphmod::SerialRunner);
  CHECK(handles[0] == -1 && handles[1] == -1 && handles[2] >= 0 && handles[3] == handles[2]);
  Exported e = ExportAll(t);
  for (size_t i = 0; i < e.keys.size(); ++i) CHECK(e.counts[i] == (e.keys[i] == 9 ? 4 : 3));
  const int64_t rare[3] = {11, 12, 11};
  t.FindOrInsert(rare, 3, 6, 3, values.data(), handles.data(), graphmod::SerialRunner);
  graphmod::TableCounters c = t.counters();
  CHECK(c.rows == 2 && c.admitted == 2 && c.pending == 2 && c.rejected == 2 + 2 + 3 && c.latest == 6);
  // Pending counts round-trip: 11 (seen twice) is admitted on its next sighting.
  std::vector<int64_t> keys, counts, seen;
  t.ExportPending(0, [&](int64_t n, int64_t sketch) {
    CHECK(sketch == 0);
    keys.resize(n), counts.resize(n), seen.resize(n);
    return graphmod::PendingBuffers{keys.data(), counts.data(), seen.data(), nullptr};
  });
  CHECK(keys.size() == 2);
  EmbeddingTable u(Config(2, 1));
  CHECK(u.ImportPending(keys.data(), counts.data(), seen.data(), 2, nullptr, 0).empty());
  t.FindOrInsert(rare, 1, 7, 3, values.data(), handles.data(), graphmod::SerialRunner);
  u.FindOrInsert(rare, 1, 7, 3, values.data(), handles.data(), graphmod::SerialRunner);
  CHECK(handles[0] >= 0 && t.size() == 3 && u.size() == 1 && u.counters().pending == 1);
}

// Counting in a count-min sketch: without collisions (a small stream in a
// wide sketch) admission is exact; the counters round-trip and age on Evict.
void TestSketchAdmission() {
  TableConfig c = Config(2, 1);
  c.sketch_width = 1 << 14;
  EmbeddingTable t(c);
  CHECK(t.sketch_size() == 4 * (1 << 14));
  std::vector<float> values(2 * 2);  // up to two keys of dim 2
  int64_t handle;
  for (int64_t k = 0; k < 50; ++k)
    for (int call = 1; call <= 3; ++call) {
      t.FindOrInsert(&k, 1, 0, 3, values.data(), &handle, graphmod::SerialRunner);
      CHECK((handle == -1) == (call < 3));
    }
  const int64_t twice[2] = {99, 99};
  t.FindOrInsert(twice, 2, 0, 3, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.size() == 50 && t.counters().pending == 0);
  std::vector<int32_t> sketch;
  t.ExportPending(0, [&](int64_t n, int64_t size) {
    CHECK(n == 0);
    sketch.resize(size);
    return graphmod::PendingBuffers{nullptr, nullptr, nullptr, sketch.data()};
  });
  EmbeddingTable u(c);
  CHECK(u.ImportPending(nullptr, nullptr, nullptr, 0, sketch.data(), sketch.size()).empty());
  CHECK(!u.ImportPending(nullptr, nullptr, nullptr, 0, sketch.data(), 7).empty());
  EmbeddingTable exact(Config(2, 1));  // counts exactly: a saved sketch is ignored
  CHECK(exact.ImportPending(nullptr, nullptr, nullptr, 0, sketch.data(), sketch.size()).empty());
  const int64_t k99 = 99;
  u.FindOrInsert(&k99, 1, 0, 3, values.data(), &handle, graphmod::SerialRunner);
  CHECK(handle >= 0);  // its third sighting, two of them restored
  // Evict halves the counters: two sightings count as one afterwards.
  const int64_t k7 = 7777;
  EmbeddingTable v(c);
  v.FindOrInsert(twice, 2, 0, 3, values.data(), nullptr, graphmod::SerialRunner);
  v.Evict(0);
  v.FindOrInsert(&k99, 1, 0, 3, values.data(), &handle, graphmod::SerialRunner);
  CHECK(handle == -1);
  v.FindOrInsert(&k7, 1, 0, 3, values.data(), &handle, graphmod::SerialRunner);
  CHECK(handle == -1 && v.size() == 0);
}

// Evict removes exactly the rows and pending keys last seen before the cut.
void TestEvict() {
  EmbeddingTable t(Config(2, 1));
  std::vector<float> values(2);
  for (int64_t k = 0; k < 100; ++k)
    t.FindOrInsert(&k, 1, /*now=*/k, -1, values.data(), nullptr, graphmod::SerialRunner);
  const int64_t rare = 1000;
  t.FindOrInsert(&rare, 1, 10, 5, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.Evict(40) == 40 && t.size() == 60 && t.counters().pending == 0);
  Exported e = ExportAll(t);
  for (int64_t k : e.keys) CHECK(k >= 40);
  CHECK(t.counters().evicted == 40);
  // Shards side by side (on threads): the same rule.
  for (int64_t k = 100; k < 200; ++k)
    t.FindOrInsert(&k, 1, /*now=*/k, -1, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.Evict(150, ThreadRunner) == 110 && t.size() == 50 && t.counters().evicted == 150);
  for (int64_t k : ExportAll(t).keys) CHECK(k >= 150);
}

// A full LRU table keeps its bound under a stream of new keys, never evicts
// a row seen in the current step, and keeps mostly recent rows; LFU keeps the
// often-seen rows.
void TestCapacityPolicies() {
  using graphmod::WhenFull;
  for (WhenFull policy : {WhenFull::Evict(graphmod::LeastRecentlyUsed()),
                          WhenFull::Evict(graphmod::LeastFrequentlyUsed())}) {
    TableConfig c = Config(2, 1);
    c.max_rows = 256;
    c.num_shards = 4;
    c.when_full = policy;
    EmbeddingTable t(c);
    std::vector<float> values(2 * 64);
    std::vector<int64_t> handles(64), hot(16), hot8(128);
    for (int i = 0; i < 16; ++i) hot[i] = 1'000'000 + i;
    for (int i = 0; i < 128; ++i) hot8[i] = hot[i % 16];
    std::vector<float> hot_values(2 * 128);
    t.FindOrInsert(hot8.data(), 128, 0, -1, hot_values.data(), nullptr, ThreadRunner);
    for (int64_t step = 1; step <= 200; ++step) {
      std::vector<int64_t> keys(48);
      for (int i = 0; i < 48; ++i) keys[i] = step * 48 + i;
      t.FindOrInsert(keys.data(), 48, step, -1, values.data(), handles.data(), ThreadRunner);
      CHECK(t.size() <= 256);
      CHECK(std::count(handles.begin(), handles.begin() + 48, -1) == 0);
      if (step % 4 == 0)  // hot keys: seen often, but not every step
        t.FindOrInsert(hot.data(), 16, step, -1, values.data(), handles.data(), ThreadRunner);
    }
    Exported e = ExportAll(t);
    const graphmod::TableCounters counters = t.counters();
    CHECK(t.size() == 256 && counters.evicted == counters.admitted - 256);
    int recent = 0, hot_kept = 0;
    for (int64_t k : e.keys) {
      recent += k >= 197 * 48;  // the last four steps' keys (192 of them)
      hot_kept += k >= 1'000'000;
    }
    if (policy.evict == &graphmod::LeastRecentlyUsed()) {
      CHECK(recent >= 150);
    } else {
      CHECK(hot_kept == 16);
    }
  }
}

// With a coarse clock (one timestamp for many steps), a full table still makes
// room: only rows looked up since the last Apply are spared.
void TestCapacityWithCoarseClock() {
  TableConfig c = Config(2, 1);
  c.max_rows = 64;
  c.num_shards = 1;
  EmbeddingTable t(c);
  Optimizer sgd;
  sgd.lr = 0.1f;
  std::vector<int64_t> keys(16), handles(16);
  std::vector<float> values(32), grads(32, 1.f);
  for (int64_t step = 0; step < 20; ++step) {
    for (int i = 0; i < 16; ++i) keys[i] = step * 16 + i;
    t.FindOrInsert(keys.data(), 16, /*now=*/7, -1, values.data(), handles.data(),
                   graphmod::SerialRunner);
    CHECK(std::count(handles.begin(), handles.end(), -1) == 0 && t.size() <= 64);
    CHECK(t.Apply(sgd, handles.data(), true, grads.data(), 16, graphmod::SerialRunner).empty());
  }
  // Every row this step handed out is still there for its gradients.
  Exported e = ExportAll(t);
  for (int i = 0; i < 16; ++i) CHECK(std::count(e.keys.begin(), e.keys.end(), 19 * 16 + i) == 1);
}

void TestValidation() {
  TableConfig c = Config(0);
  CHECK(!graphmod::ValidateConfig(c).empty());
  c = Config(4);
  c.num_shards = 3;
  CHECK(!graphmod::ValidateConfig(c).empty());
  c = Config(4, 2);
  c.slot_init.pop_back();
  CHECK(!graphmod::ValidateConfig(c).empty());
  c = Config(4);
  c.init = Initializer::kUniform;
  c.init_a = 1.f;
  c.init_b = 0.f;
  CHECK(!graphmod::ValidateConfig(c).empty());
  c = Config(4);
  c.max_rows = 0;
  CHECK(!graphmod::ValidateConfig(c).empty());
  CHECK(graphmod::ValidateConfig(Config(4, 2)).empty());
}

}  // namespace

std::vector<int64_t> Removed(EmbeddingTable& t, int64_t since) {
  std::vector<int64_t> keys;
  t.ExportRemoved(since, [&](int64_t n) {
    keys.resize(n);
    return keys.data();
  });
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Incremental checkpoints' tombstones: nothing is noted before tracking
// starts; then Remove (of rows and of pending counts), Evict and eviction by
// a full table are, with the version then; ExportRemoved(since) lists the
// notes at version >= since and forgets older ones; Clear notes every key.
void TestRemovalTracking() {
  TableConfig c = Config(2, 1);
  c.max_rows = 64 * 16;  // 64 rows a shard
  EmbeddingTable t(c);
  std::vector<float> values(2 * 2000);
  std::vector<int64_t> keys(2000);
  for (int64_t k = 0; k < 100; ++k) keys[k] = k;
  t.FindOrInsert(keys.data(), 100, 1, 1, values.data(), nullptr, graphmod::SerialRunner);
  const int64_t early = 3;
  t.Remove(&early, 1);
  CHECK(t.TrackRemovals() == t.version());
  CHECK(Removed(t, 0).empty());  // key 3 went before tracking
  const int64_t gone[2] = {5, 6};
  CHECK(t.Remove(gone, 2) == 2);
  const int64_t at_one = t.version();
  // An Apply makes the next notes carry a later version.
  const float grads[2] = {1.f, 1.f};
  const int64_t seven = 7;
  Optimizer sgd;
  sgd.lr = 0.1f;
  CHECK(t.Apply(sgd, &seven, false, grads, 1, graphmod::SerialRunner).empty());
  CHECK(t.version() == at_one + 1);
  const int64_t later = 8;
  t.Remove(&later, 1);
  CHECK((Removed(t, at_one + 1) == std::vector<int64_t>{8}));  // and forgets 5 and 6
  CHECK((Removed(t, 0) == std::vector<int64_t>{8}));
  // Admission counts: a pending key removed is noted (its count starts over).
  const int64_t rare = 5000;
  t.FindOrInsert(&rare, 1, 2, 3, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.counters().pending == 1);
  t.Remove(&rare, 1);
  CHECK(t.counters().pending == 0);
  CHECK((Removed(t, 0) == std::vector<int64_t>{8, 5000}));
  // Evict: every key last seen before 3 (all but the pending one, seen at 3).
  t.FindOrInsert(&rare, 1, 3, 3, values.data(), nullptr, graphmod::SerialRunner);
  const int64_t rows = t.size();
  CHECK(t.Evict(3) == rows);
  CHECK(static_cast<int64_t>(Removed(t, 0).size()) == 2 + rows);
  // A full table's eviction of a row for a new key is noted too.
  for (int64_t k = 0; k < 2000; ++k) keys[k] = 100000 + k;
  t.FindOrInsert(keys.data(), 1000, 10, 1, values.data(), nullptr, graphmod::SerialRunner);
  t.FindOrInsert(keys.data() + 1000, 1000, 11, 1, values.data(), nullptr,
                 graphmod::SerialRunner);
  CHECK(t.counters().evicted > rows);
  const size_t noted = Removed(t, 0).size();
  CHECK(static_cast<int64_t>(noted) == 2 + t.counters().evicted);
  // Pending counts by version: only those counted at version >= v export.
  std::vector<int64_t> pk, pc, ps;
  auto pending = [&](int64_t min_version) {
    t.ExportPending(min_version, [&](int64_t n, int64_t) {
      pk.resize(n), pc.resize(n), ps.resize(n);
      return graphmod::PendingBuffers{pk.data(), pc.data(), ps.data(), nullptr};
    });
    return pk.size();
  };
  CHECK(pending(0) == 1 && pending(t.version() + 1) == 1 && pending(t.version() + 2) == 0);
  const int64_t before_clear = static_cast<int64_t>(t.size());
  t.Clear();
  CHECK(static_cast<int64_t>(Removed(t, 0).size()) == static_cast<int64_t>(noted) +
        before_clear + 1);
}

// Shards import side by side: a restore on real threads gives the table
// it was exported from, row for row.
void TestParallelImport() {
  EmbeddingTable t(Config(3, 1));
  std::vector<int64_t> keys(20000);
  for (int64_t k = 0; k < 20000; ++k) keys[k] = k * 7919 - 5000;
  std::vector<float> values(3 * 20000);
  t.FindOrInsert(keys.data(), 20000, 4, 1, values.data(), nullptr, ThreadRunner);
  Exported e = ExportAll(t);
  EmbeddingTable u(Config(3, 1));
  CHECK(u.Import(e.keys.data(), e.values.data(), e.slots.data(), e.counts.data(),
                 e.last_seen.data(), e.versions.data(), e.keys.size(), true, ThreadRunner)
            .empty());
  CHECK(u.size() == 20000 && u.counters().latest == 4);
  std::map<int64_t, std::vector<float>> want, got;
  Exported f = ExportAll(u);
  for (size_t i = 0; i < e.keys.size(); ++i)
    want[e.keys[i]].assign(e.values.begin() + 3 * i, e.values.begin() + 3 * i + 3);
  for (size_t i = 0; i < f.keys.size(); ++i)
    got[f.keys[i]].assign(f.values.begin() + 3 * i, f.values.begin() + 3 * i + 3);
  CHECK(want == got);
}

// A delta's export (min_version above the tracking mark) reads the rows
// changed since the mark, and gives what a scan of every row gives.
void TestDeltaExport() {
  EmbeddingTable t(Config(2, 1));
  std::vector<int64_t> keys(1000);
  for (int64_t k = 0; k < 1000; ++k) keys[k] = k * 13;
  std::vector<float> values(2 * 1000), grads(2 * 1000, 0.5f);
  Optimizer sgd;
  sgd.lr = 0.1f;
  t.FindOrInsert(keys.data(), 1000, 1, 1, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.Apply(sgd, keys.data(), false, grads.data(), 1000, graphmod::SerialRunner).empty());
  auto scan_after = [&](int64_t since) {  // every row, filtered here
    Exported all = ExportAll(t, 0);
    std::map<int64_t, float> out;
    for (size_t i = 0; i < all.keys.size(); ++i)
      if (all.versions[i] > since) out[all.keys[i]] = all.values[2 * i];
    return out;
  };
  auto delta_after = [&](int64_t since) {
    Exported e = ExportAll(t, since + 1);
    std::map<int64_t, float> out;
    for (size_t i = 0; i < e.keys.size(); ++i) out[e.keys[i]] = e.values[2 * i];
    CHECK(out.size() == e.keys.size());  // each row once
    return out;
  };
  const int64_t mark = t.TrackRemovals();
  CHECK(delta_after(mark).empty());
  // 100 old keys and 50 new ones looked up, 30 of them updated, 10 removed.
  std::vector<int64_t> batch(keys.begin(), keys.begin() + 100);
  for (int64_t k = 0; k < 50; ++k) batch.push_back(100000 + k);
  t.FindOrInsert(batch.data(), batch.size(), 2, 1, values.data(), nullptr,
                 graphmod::SerialRunner);
  CHECK(t.Apply(sgd, batch.data() + 80, false, grads.data(), 30, graphmod::SerialRunner).empty());
  t.Remove(batch.data() + 90, 10);
  CHECK(delta_after(mark).size() == 140);
  CHECK(delta_after(mark) == scan_after(mark));
  // After a delta at the new mark, only what changes next.
  const int64_t next = t.version();
  Removed(t, next);  // the delta's export of removals forgets what the save holds
  CHECK(delta_after(next).empty());
  t.FindOrInsert(keys.data() + 500, 20, 3, 1, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(delta_after(next).size() == 20 && delta_after(next) == scan_after(next));
  CHECK(delta_after(mark) == scan_after(mark));  // an older mark still scans correctly
}

// Exports shard by shard (what a save does, one shard's rows at a time)
// hold, in order, what one export of the whole table holds; CountRows and
// CountPending say beforehand how many each will write.
void TestShardExport() {
  TableConfig c = Config(3, 1);
  c.num_shards = 4;
  EmbeddingTable t(c);
  std::vector<int64_t> keys(2000);
  for (int64_t k = 0; k < 2000; ++k) keys[k] = k * 31 - 7000;
  std::vector<float> values(3 * 2000), grads(3 * 2000, 0.25f);
  Optimizer sgd;
  sgd.lr = 0.1f;
  // Keys seen twice get rows (threshold 2): the first 1500; the rest pend.
  t.FindOrInsert(keys.data(), 1500, 1, 2, values.data(), nullptr, graphmod::SerialRunner);
  t.FindOrInsert(keys.data(), 2000, 2, 2, values.data(), nullptr, graphmod::SerialRunner);
  CHECK(t.size() == 1500 && t.counters().pending == 500);
  CHECK(t.Apply(sgd, keys.data(), false, grads.data(), 1500, graphmod::SerialRunner).empty());
  const int64_t mark = t.TrackRemovals();  // then 100 rows change
  CHECK(t.Apply(sgd, keys.data(), false, grads.data(), 100, graphmod::SerialRunner).empty());
  for (int64_t min_version : {int64_t{0}, mark + 1}) {
    Exported all = ExportAll(t, min_version);
    CHECK(t.CountRows(min_version) == static_cast<int64_t>(all.keys.size()));
    Exported joined;
    for (int s = 0; s < 4; ++s) {
      const int64_t counted = t.CountRows(min_version, s);
      t.Export(min_version, [&](int64_t n) {
        CHECK(n == counted);
        const size_t at = joined.keys.size();
        joined.keys.resize(at + n);
        joined.values.resize((at + n) * 3);
        ExportBuffers b;
        b.keys = joined.keys.data() + at;
        b.values = joined.values.data() + at * 3;
        return b;
      }, s);
    }
    CHECK(joined.keys == all.keys && joined.values == all.values);
    CHECK(all.keys.size() == (min_version == 0 ? 1500u : 100u));
    // A save's snapshot, in chunks of 7 rows: the same rows in the same
    // order, every chunk full but the last, after the pending keys.
    std::vector<int64_t> chunk_keys;
    std::vector<float> chunk_values;
    int64_t emitted = 0, pending_keys = -1;
    auto alloc = [&](int64_t total, int64_t n) {
      CHECK(total == static_cast<int64_t>(all.keys.size()));
      CHECK(n == std::min<int64_t>(7, total - emitted));
      chunk_keys.assign(n, -1);
      chunk_values.assign(n * 3, -1.0f);
      ExportBuffers b;
      b.keys = chunk_keys.data();
      b.values = chunk_values.data();
      return b;
    };
    std::vector<int64_t> pk, pc, ps;
    auto pending = [&](int64_t n, int64_t sketch) {
      CHECK(sketch == 0 && emitted == 0);
      pending_keys = n;
      pk.resize(n), pc.resize(n), ps.resize(n);
      return graphmod::PendingBuffers{pk.data(), pc.data(), ps.data(), nullptr};
    };
    Exported chunked;
    CHECK(t.Snapshot(min_version, 7, pending, alloc, [&](int64_t n) {
      CHECK(n == static_cast<int64_t>(chunk_keys.size()));
      chunked.keys.insert(chunked.keys.end(), chunk_keys.begin(), chunk_keys.end());
      chunked.values.insert(chunked.values.end(), chunk_values.begin(), chunk_values.end());
      emitted += n;
      return std::string();
    }).empty());
    CHECK(pending_keys == t.CountPending(min_version));
    CHECK(emitted == t.CountRows(min_version));
    CHECK(chunked.keys == all.keys && chunked.values == all.values);
    // An emit's error stops the export and is what it returns.
    int emits = 0;
    emitted = 0;
    CHECK(t.Snapshot(min_version, 7, pending, alloc, [&](int64_t n) {
      emitted += n;
      return std::string(++emits == 2 ? "disk full" : "");
    }) == "disk full" && emits == 2);
  }
  std::vector<int64_t> all_pending, joined_pending;
  auto pending = [&](int shard, std::vector<int64_t>* out) {
    std::vector<int64_t> counts, seen;
    t.ExportPending(0, [&](int64_t n, int64_t sketch) {
      CHECK(sketch == 0);
      const size_t at = out->size();
      out->resize(at + n), counts.resize(n), seen.resize(n);
      return graphmod::PendingBuffers{out->data() + at, counts.data(), seen.data(), nullptr};
    }, shard);
  };
  pending(-1, &all_pending);
  for (int s = 0; s < 4; ++s) {
    const size_t before = joined_pending.size();
    pending(s, &joined_pending);
    CHECK(t.CountPending(0, s) == static_cast<int64_t>(joined_pending.size() - before));
  }
  CHECK(all_pending.size() == 500 && joined_pending == all_pending);
  // A delta after removals whose rows new keys reuse: the removed keys are
  // gone from it, the new ones in it, as a scan of every row finds.
  t.Remove(keys.data() + 200, 50);
  std::vector<int64_t> fresh(50);
  for (int64_t k = 0; k < 50; ++k) fresh[k] = 900000 + k;
  t.FindOrInsert(fresh.data(), 50, 3, 1, values.data(), nullptr, graphmod::SerialRunner);
  Exported delta = ExportAll(t, mark + 1), every = ExportAll(t, 0);
  std::set<int64_t> expected, got(delta.keys.begin(), delta.keys.end());
  for (size_t i = 0; i < every.keys.size(); ++i)
    if (every.versions[i] > mark) expected.insert(every.keys[i]);
  CHECK(got == expected && got.size() == 150 && delta.keys.size() == 150);
  for (int64_t k = 200; k < 250; ++k) CHECK(got.count(keys[k]) == 0);
}

// Saves while other threads look up new keys, update and remove
// (ThreadSanitizer): a snapshot's count is the rows it copies, each key once
// with one moment's values (a row's values start equal and every update
// changes them alike: a copy torn by an update would show two), though the
// table grows under it. One shard's export, side by side, too.
void TestConcurrentSaves() {
  TableConfig c = Config(4, 1);
  c.num_shards = 8;
  c.init = graphmod::Initializer::kConstant;
  c.init_a = 1.0f;
  EmbeddingTable t(c);
  std::atomic<bool> done{false};
  auto train = [&](int64_t base) {
    std::mt19937_64 rng(base);
    Optimizer sgd;
    sgd.lr = 0.1f;
    std::vector<int64_t> keys(256), handles(256);
    std::vector<float> values(256 * 4), grads(256 * 4, 0.1f);
    for (int step = 0; step < 300; ++step) {
      // Hot keys, and fresh ones every step.
      for (size_t i = 0; i < keys.size(); ++i)
        keys[i] = i % 2 ? base + step * 128 + static_cast<int64_t>(i / 2)
                        : static_cast<int64_t>(rng() % 64);
      t.FindOrInsert(keys.data(), keys.size(), step, -1, values.data(), handles.data(),
                     ThreadRunner);
      t.Apply(sgd, handles.data(), true, grads.data(), keys.size(), ThreadRunner);
      if (step % 20 == 0) t.Remove(keys.data() + 1, 32);
    }
  };
  std::thread a([&] { train(1000000); }), b([&] { train(2000000); });
  std::thread watcher([&] { a.join(), b.join(), done = true; });
  const int64_t mark = t.TrackRemovals();
  int saves = 0;
  while (!done || saves < 3) {
    for (int64_t min_version : {int64_t{0}, mark + 1}) {
      std::vector<int64_t> keys, chunk_keys, pk, pc, ps;
      std::vector<float> values;
      std::vector<char> chunk_values;  // rows as stored
      const size_t row_bytes = graphmod::RowBytes(storage, 4);
      int64_t counted = -1;
      const std::string error = t.Snapshot(
          min_version, 97,
          [&](int64_t n, int64_t) {
            pk.resize(n), pc.resize(n), ps.resize(n);
            return graphmod::PendingBuffers{pk.data(), pc.data(), ps.data(), nullptr};
          },
          [&](int64_t total, int64_t n) {
            counted = total;
            chunk_keys.assign(n, -1), chunk_values.assign(n * row_bytes, -1);
            ExportBuffers b;
            b.keys = chunk_keys.data();
            b.values = chunk_values.data();
            return b;
          },
          [&](int64_t) {
            keys.insert(keys.end(), chunk_keys.begin(), chunk_keys.end());
            const size_t at = values.size();
            values.resize(at + chunk_keys.size() * 4);
            for (size_t r = 0; r < chunk_keys.size(); ++r)
              graphmod::DecodeRow(storage, chunk_values.data() + r * row_bytes, 4,
                                  values.data() + at + r * 4);
            return std::string();
          });
      CHECK(error.empty());
      CHECK(counted == static_cast<int64_t>(keys.size()));
      CHECK(std::set<int64_t>(keys.begin(), keys.end()).size() == keys.size());
      for (size_t r = 0; r < keys.size(); ++r)  // one moment: a row's 4 values agree
        for (int j = 1; j < 4; ++j) CHECK(values[r * 4 + j] == values[r * 4]);
      // One shard alone, as Export(shard) reads it.
      std::vector<int64_t> shard_keys;
      t.Export(min_version, [&](int64_t n) {
        shard_keys.resize(n);
        ExportBuffers e;
        e.keys = shard_keys.data();
        return e;
      }, saves % 8);
      for (int64_t k : shard_keys) CHECK(k < 64 || k >= 1000000);
    }
    ++saves;
  }
  watcher.join();
}

// Rows stored smaller (TableConfig::values_type / slots_type): a lookup reads
// the stored row decoded; an update decodes the row and its slots, runs the
// optimizer in float32 and encodes both back; export and import move the
// stored blocks bit for bit. Checked against the codec and the optimizer
// run by hand, key by key, over several steps with repeats (the disk tier
// moves the small records too).
void TestStoredForms() {
  using graphmod::StorageType;
  const StorageType forms[][2] = {{StorageType::kFloat16, StorageType::kFloat16},
                                  {StorageType::kBFloat16, StorageType::kBFloat16},
                                  {StorageType::kInt8, StorageType::kInt8},
                                  {StorageType::kFloat16, StorageType::kInt8},
                                  {StorageType::kFloat32, StorageType::kBFloat16}};
  const int d = 5;
  for (const auto& form : forms) {
    TableConfig c = Config(d, 1);
    c.values_type = form[0];
    c.slots_type = form[1];
    const size_t vb = graphmod::RowBytes(form[0], d), sb = graphmod::RowBytes(form[1], d);
    EmbeddingTable t(c);
    // The model: each key's stored blocks.
    std::map<int64_t, std::pair<std::vector<char>, std::vector<char>>> model;
    Optimizer adagrad;
    adagrad.kind = OptimizerKind::kAdagrad;
    adagrad.lr = 0.3f;
    std::mt19937 rng(5);
    // (Enough steps and keys that rows go untouched for the 16 steps a
    // disk tier spares: the tiered run spills and brings back small records.)
    for (int step = 0; step < 24; ++step) {
      std::vector<int64_t> keys(64);
      for (auto& k : keys) k = static_cast<int64_t>(rng() % 600);
      std::vector<float> values(keys.size() * d), grads(keys.size() * d);
      std::vector<int64_t> handles(keys.size());
      CHECK(t.FindOrInsert(keys.data(), keys.size(), step, -1, values.data(), handles.data(),
                           ThreadRunner).empty());
      for (size_t i = 0; i < keys.size(); ++i) {
        auto& m = model[keys[i]];
        if (m.first.empty()) {  // a new row: its initial values and slot, stored
          std::vector<float> init(d), slot(d, 0.5f);
          graphmod::InitialRow(c, keys[i], init.data());
          m.first.resize(vb);
          m.second.resize(sb);
          graphmod::EncodeRow(form[0], init.data(), d, m.first.data());
          graphmod::EncodeRow(form[1], slot.data(), d, m.second.data());
        }
        std::vector<float> want(d);
        graphmod::DecodeRow(form[0], m.first.data(), d, want.data());
        CHECK(std::equal(want.begin(), want.end(), values.begin() + i * d));
      }
      std::map<int64_t, std::vector<float>> summed;
      for (size_t i = 0; i < keys.size(); ++i) {
        std::vector<float>& g = summed[keys[i]];
        g.resize(d, 0.f);
        for (int k = 0; k < d; ++k) {
          grads[i * d + k] = std::normal_distribution<float>(0.f, 0.5f)(rng);
          g[k] += grads[i * d + k];
        }
      }
      CHECK(t.Apply(adagrad, handles.data(), true, grads.data(), keys.size(), ThreadRunner)
                .empty());
      for (auto& [key, g] : summed) {
        auto& m = model[key];
        std::vector<float> row(d), slot(d);
        graphmod::DecodeRow(form[0], m.first.data(), d, row.data());
        graphmod::DecodeRow(form[1], m.second.data(), d, slot.data());
        graphmod::UpdateRow(adagrad, row.data(), slot.data(), g.data(), d);
        graphmod::EncodeRow(form[0], row.data(), d, m.first.data());
        graphmod::EncodeRow(form[1], slot.data(), d, m.second.data());
      }
    }
    if (tiered) CHECK(t.counters().spilled > 0);  // small records went to disk and back
    // Export: the stored blocks, bit for bit.
    std::vector<int64_t> keys(model.size()), counts(model.size()), seen(model.size()),
        versions(model.size());
    std::vector<char> vblocks(model.size() * vb), sblocks(model.size() * sb);
    CHECK(t.Export(0, [&](int64_t n) {
             CHECK(n == static_cast<int64_t>(model.size()));
             ExportBuffers b;
             b.keys = keys.data();
             b.values = vblocks.data();
             b.slots = sblocks.data();
             b.counts = counts.data();
             b.last_seen = seen.data();
             b.versions = versions.data();
             return b;
           }).empty());
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& m = model[keys[i]];
      CHECK(std::equal(m.first.begin(), m.first.end(), vblocks.begin() + i * vb));
      CHECK(std::equal(m.second.begin(), m.second.end(), sblocks.begin() + i * sb));
    }
    // Import into a fresh table of the same forms: it reads the same rows.
    EmbeddingTable u(c);
    CHECK(u.Import(keys.data(), vblocks.data(), sblocks.data(), counts.data(), seen.data(),
                   versions.data(), keys.size(), true)
              .empty());
    std::vector<float> read(keys.size() * d);
    CHECK(u.Find(keys.data(), keys.size(), read.data(), ThreadRunner).empty());
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float> want(d);
      graphmod::DecodeRow(form[0], model[keys[i]].first.data(), d, want.data());
      CHECK(std::equal(want.begin(), want.end(), read.begin() + i * d));
    }
  }
}

int main(int argc, char** argv) {
  for (const char* each : {"arena", "buckets", "arena+tier", "arena+float16",
                           "arena+tier+float16"}) {
    const std::string name = each;  // layout[+tier][+float16]
    layout = name.substr(0, name.find('+'));
    tiered = name.find("+tier") != std::string::npos;
    storage = name.find("+float16") != std::string::npos ? graphmod::StorageType::kFloat16
                                                         : graphmod::StorageType::kFloat32;
    std::printf("layout %s\n", each);
    if (storage != graphmod::StorageType::kFloat32) {  // small records: the concurrent saves
      TestConcurrentSaves();
      continue;
    }
    // --concurrency: only the multi-threaded tests (the ThreadSanitizer build).
    if (argc > 1 && std::string(argv[1]) == "--concurrency") {
      for (int round = 0; round < 3; ++round) TestConcurrentUse();
      TestParallelImport();
      TestConcurrentSaves();
      continue;
    }
    TestGrowthKeepsRowsAndHandles();
    TestManyLookupsBeforeOneApply();
    TestHitsDoNotGrowTheTable();
    TestDeterministicInit();
    TestApplySumsDuplicates();
    TestStaleHandlesAndAllOrNothing();
    TestRemoveExportImport();
    TestVersions();
    TestConcurrentUse();
    TestMaxRows();
    TestAdmission();
    TestRefusedRepeatsInBothOutputModes();
    TestSketchAdmission();
    TestEvict();
    TestCapacityPolicies();
    TestCapacityWithCoarseClock();
    TestValidation();
    TestRemovalTracking();
    TestDeltaExport();
    TestShardExport();
    TestParallelImport();
    TestConcurrentSaves();
    TestStoredForms();
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures.load());
    return 1;
  }
  std::printf("table_test%s: all checks passed\n",
              argc > 1 && std::string(argv[1]) == "--concurrency" ? " --concurrency" : "");
  return 0;
}
