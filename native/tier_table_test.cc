// A table with a disk tier against the same table all in memory (no
// TensorFlow): trained side by side on skewed ids, they must read the same
// rows and export the same state, bit for bit. Also: a record damaged on
// disk fails the lookup and the save, naming the file, and gives the key no
// fresh row; a storage_path that cannot be used fails the table's creation.
// Built by `bazel test //native:tier_table_test` and `make native-sanitize`.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "native/log_tier.h"
#include "native/table.h"
#include "native/test_check.h"

using graphmod::EmbeddingTable;
using graphmod::ExportBuffers;
using graphmod::Optimizer;
using graphmod::OptimizerKind;
using graphmod::SerialRunner;
using graphmod::TableConfig;

namespace {

std::string StoragePath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/graphmod_tier_table_test";
}

TableConfig Config(double memory_budget) {
  TableConfig c;
  c.name = "tiered/item";
  c.dim = 8;
  c.num_slots = 2;  // Adam's
  c.slot_init = {0.f, 0.f};
  c.init = graphmod::Initializer::kNormal;
  c.init_b = 1.f;
  c.seed = 11;
  c.num_shards = 4;
  if (memory_budget > 0) {
    c.memory_budget = memory_budget;
    c.storage_path = StoragePath();
  }
  return c;
}

// Every row of a table, by key: values, slots, count, last_seen, version.
using Row = std::tuple<std::vector<float>, std::vector<float>, int64_t, int64_t, int64_t>;
std::map<int64_t, Row> Rows(const EmbeddingTable& t, int64_t min_version = 0) {
  const int d = t.config().dim, k = t.config().num_slots;
  std::vector<int64_t> keys, counts, seen, versions;
  std::vector<float> values, slots;
  const std::string error = t.Export(min_version, [&](int64_t n) {
    keys.resize(n), counts.resize(n), seen.resize(n), versions.resize(n);
    values.resize(n * d), slots.resize(n * k * d);
    return ExportBuffers{keys.data(), values.data(), slots.data(),
                         counts.data(), seen.data(), versions.data()};
  });
  CHECK(error.empty());
  std::map<int64_t, Row> rows;
  for (size_t i = 0; i < keys.size(); ++i)
    rows[keys[i]] = Row(std::vector<float>(values.begin() + i * d, values.begin() + (i + 1) * d),
                        std::vector<float>(slots.begin() + i * k * d,
                                           slots.begin() + (i + 1) * k * d),
                        counts[i], seen[i], versions[i]);
  return rows;
}

// Zipf-like ids (rank r drawn with weight ~1/r^1.2) over `n` keys.
std::vector<int64_t> Batch(std::mt19937_64* rng, int64_t n, int size) {
  static std::vector<double> cdf;
  if (cdf.size() != static_cast<size_t>(n)) {
    cdf.assign(n, 0.0);
    double total = 0;
    for (int64_t r = 0; r < n; ++r) cdf[r] = total += 1.0 / std::pow(r + 1.0, 1.2);
    for (double& c : cdf) c /= total;
  }
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> ids(size);
  for (int i = 0; i < size; ++i) {
    const int64_t r = std::lower_bound(cdf.begin(), cdf.end(), u(*rng)) - cdf.begin();
    ids[i] = (r * 2654435761LL) % 1000003;  // ranks scattered over the key space
  }
  return ids;
}

// A training lookup of ids (at clock `step`) in both tables: the rows they
// return must agree. Their handles to *ha and *hb; returns gradients made
// from the rows.
std::vector<float> LookUpBoth(EmbeddingTable* memory, EmbeddingTable* disk,
                              const std::vector<int64_t>& ids, int step,
                              std::vector<int64_t>* ha, std::vector<int64_t>* hb) {
  const size_t n = ids.size(), d = memory->config().dim;
  std::vector<float> a(n * d), b(n * d), grads(n * d);
  ha->resize(n);
  hb->resize(n);
  CHECK(memory->FindOrInsert(ids.data(), n, step, -1, a.data(), ha->data(), SerialRunner).empty());
  CHECK(disk->FindOrInsert(ids.data(), n, step, -1, b.data(), hb->data(), SerialRunner).empty());
  CHECK(a == b);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = a[i] * 0.1f + 0.01f * (i % 7);
  return grads;
}

// Trains both tables on the same batches (lookups by handle and by key,
// deltas, time eviction, removal) and compares everything they return.
void TestTrainsAsInMemory() {
  EmbeddingTable memory(Config(0)), disk(Config(0.25));
  CHECK(disk.open_error().empty());
  Optimizer adam;
  adam.kind = OptimizerKind::kAdam;
  adam.lr = 0.01f;
  adam.epsilon = 1e-7f;
  std::mt19937_64 rng(5);
  const int d = 8;
  const int64_t mark_memory = memory.TrackRemovals(), mark_disk = disk.TrackRemovals();
  CHECK(mark_memory == mark_disk);
  for (int step = 1; step <= 120; ++step) {
    adam.beta1_power *= adam.beta1;
    adam.beta2_power *= adam.beta2;
    const std::vector<int64_t> ids = Batch(&rng, 20000, 256);
    std::vector<int64_t> ha, hb;
    const std::vector<float> grads = LookUpBoth(&memory, &disk, ids, step, &ha, &hb);
    if (step % 3 == 0) {
      // By key, keys this step did not look up (repeated, many cold): the
      // disk table brings them up first, each once.
      const std::vector<int64_t> other = Batch(&rng, 20000, 256);
      CHECK(memory.Apply(adam, other.data(), false, grads.data(), other.size(),
                         SerialRunner).empty());
      CHECK(disk.Apply(adam, other.data(), false, grads.data(), other.size(),
                       SerialRunner).empty());
      CHECK(memory.size() == disk.size());
    } else {
      CHECK(memory.Apply(adam, ha.data(), true, grads.data(), ids.size(), SerialRunner).empty());
      CHECK(disk.Apply(adam, hb.data(), true, grads.data(), ids.size(), SerialRunner).empty());
    }
    if (step % 40 == 0) CHECK(memory.Evict(step - 30) == disk.Evict(step - 30));
    if (step == 50) {
      const std::vector<int64_t> gone = Batch(&rng, 20000, 64);
      CHECK(memory.Remove(gone.data(), gone.size()) == disk.Remove(gone.data(), gone.size()));
    }
    if (step % 25 == 0) {  // a delta: changed rows and removed keys agree
      CHECK(Rows(memory, step - 10) == Rows(disk, step - 10));
      std::vector<int64_t> ra, rb;
      memory.ExportRemoved(step - 10, [&](int64_t n) { ra.resize(n); return ra.data(); });
      disk.ExportRemoved(step - 10, [&](int64_t n) { rb.resize(n); return rb.data(); });
      std::sort(ra.begin(), ra.end());
      std::sort(rb.begin(), rb.end());
      CHECK(ra == rb);
    }
    // Read-only lookups read cold rows where they are.
    const std::vector<int64_t> probe = Batch(&rng, 40000, 300);
    std::vector<float> fa(probe.size() * d), fb(probe.size() * d);
    CHECK(memory.Find(probe.data(), probe.size(), fa.data(), SerialRunner).empty());
    CHECK(disk.Find(probe.data(), probe.size(), fb.data(), SerialRunner).empty());
    CHECK(fa == fb);
  }
  CHECK(memory.size() == disk.size());
  CHECK(memory.CountRows(0) == disk.CountRows(0));
  CHECK(Rows(memory) == Rows(disk));
  const graphmod::TableCounters c = disk.counters();
  std::printf("tiered: %lld rows, %lld on disk, %lld spilled, %lld promoted\n",
              static_cast<long long>(c.rows), static_cast<long long>(c.cold_rows),
              static_cast<long long>(c.spilled), static_cast<long long>(c.promoted));
  CHECK(c.rows == memory.size());
  // The budget held (a quarter of the rows, per shard, plus what one step
  // brings up) and rows really travelled both ways.
  CHECK(c.cold_rows >= c.rows / 4);
  CHECK(c.spilled > c.cold_rows && c.promoted > 0);
  CHECK(memory.counters().cold_rows == 0);
  // A restore into a tiered table spills what is beyond its budget.
  EmbeddingTable restored(Config(0.25));
  const std::map<int64_t, Row> rows = Rows(memory);
  std::vector<int64_t> keys, counts, seen, versions;
  std::vector<float> values, slots;
  for (const auto& [key, row] : rows) {
    keys.push_back(key);
    values.insert(values.end(), std::get<0>(row).begin(), std::get<0>(row).end());
    slots.insert(slots.end(), std::get<1>(row).begin(), std::get<1>(row).end());
    counts.push_back(std::get<2>(row));
    seen.push_back(std::get<3>(row));
    versions.push_back(std::get<4>(row));
  }
  CHECK(restored.Import(keys.data(), values.data(), slots.data(), counts.data(), seen.data(),
                        versions.data(), keys.size(), true).empty());
  // Imported in pieces, spilled after each: memory ends within the budget.
  const int64_t cold = restored.counters().cold_rows, all = restored.size();
  CHECK(all == static_cast<int64_t>(keys.size()) && all - cold <= all / 4 + 4);
  CHECK(Rows(restored) == rows);
}

// Many new rows through a small budget with change tracking on: each shard
// adds far more rows than it keeps in memory, so its changed-row list is
// trimmed of the rows that went to disk (ChangeLog::Trim) several times.
// Every delta still holds exactly what the all-in-memory table's does.
void TestDeltasAfterManyNewRows() {
  const TableConfig in_memory = Config(0);
  TableConfig tiered = Config(0);
  tiered.memory_budget = static_cast<float>(64 * graphmod::RecordLayout::For(8, 2).stride * 4);
  tiered.storage_path = StoragePath();
  EmbeddingTable memory(in_memory), disk(tiered);
  CHECK(disk.open_error().empty());
  Optimizer adam;
  adam.kind = OptimizerKind::kAdam;
  adam.lr = 0.01f;
  adam.epsilon = 1e-7f;
  CHECK(memory.TrackRemovals() == disk.TrackRemovals());
  int64_t next_key = 0;
  for (int step = 1; step <= 100; ++step) {
    adam.beta1_power *= adam.beta1;
    adam.beta2_power *= adam.beta2;
    std::vector<int64_t> ids;
    for (int i = 0; i < 1000; ++i) ids.push_back(next_key++ * 7919);  // new keys
    for (int64_t k = 0; k < 50; ++k) ids.push_back(k * 7919);        // hot ones
    std::vector<int64_t> ha, hb;
    const std::vector<float> grads = LookUpBoth(&memory, &disk, ids, step, &ha, &hb);
    CHECK(memory.Apply(adam, ha.data(), true, grads.data(), ids.size(), SerialRunner).empty());
    CHECK(disk.Apply(adam, hb.data(), true, grads.data(), ids.size(), SerialRunner).empty());
    if (step % 20 == 0) {
      CHECK(Rows(memory, step - 7) == Rows(disk, step - 7));
      CHECK(memory.CountRows(step - 7) == disk.CountRows(step - 7));
    }
  }
  const graphmod::TableCounters c = disk.counters();
  std::printf("many new rows: %lld rows, %lld on disk\n", static_cast<long long>(c.rows),
              static_cast<long long>(c.cold_rows));
  // Most rows went to disk (the last 16 steps' rows are spared).
  CHECK(c.cold_rows > 80000 && c.rows - c.cold_rows < 20000);
  CHECK(Rows(memory) == Rows(disk));
}

// The input pipeline prefetches step t+1's ids while step t runs: before
// its lookup, between its lookup and its apply (the overlap training has:
// the prefetch's promotions grow the layout under live handles), or after
// its apply. The steps then find every row in memory, and training is
// unchanged, bit for bit. Both layouts (buckets moves rows as it grows).
void TestPrefetchServesTheNextStep(const char* layout) {
  TableConfig with_tier = Config(0.25);
  with_tier.layout = layout;
  EmbeddingTable memory(Config(0)), plain(with_tier), ahead(with_tier);
  Optimizer sgd;
  sgd.lr = 0.1f;
  std::mt19937_64 rng(9);
  const int d = 8;
  std::vector<int64_t> next = Batch(&rng, 20000, 256);
  EmbeddingTable* const tables[3] = {&memory, &plain, &ahead};
  for (int step = 1; step <= 90; ++step) {
    const std::vector<int64_t> ids = next;
    next = Batch(&rng, 20000, 256);
    auto prefetch = [&] { CHECK(ahead.Prefetch(next.data(), next.size(), SerialRunner).empty()); };
    if (step % 3 == 0) prefetch();
    std::vector<float> v[3];
    std::vector<int64_t> h[3];
    for (int i = 0; i < 3; ++i) {
      v[i].resize(ids.size() * d);
      h[i].resize(ids.size());
      CHECK(tables[i]->FindOrInsert(ids.data(), ids.size(), step, -1, v[i].data(), h[i].data(),
                                    SerialRunner).empty());
      CHECK(v[i] == v[0]);
    }
    if (step % 3 == 1) prefetch();
    std::vector<float> grads(ids.size() * d);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = v[0][i] * 0.1f + 0.01f * (i % 5);
    for (int i = 0; i < 3; ++i)
      CHECK(tables[i]->Apply(sgd, h[i].data(), true, grads.data(), ids.size(),
                             SerialRunner).empty());
    if (step % 3 == 2) prefetch();
  }
  CHECK(Rows(memory) == Rows(ahead));
  const graphmod::TableCounters p = plain.counters(), a = ahead.counters();
  std::printf("prefetch (%s): steps promoted %lld rows without, %lld with (%lld prefetched)\n",
              layout, static_cast<long long>(p.promoted), static_cast<long long>(a.promoted),
              static_cast<long long>(a.prefetched));
  // Steps of the plain tiered table read from disk; with the prefetch none
  // did: the rows it brought up were still in memory at their step (not
  // spilled by the step under way). No handle went stale.
  CHECK(p.promoted > 100 && a.prefetched > 100);
  CHECK(a.promoted == 0 && p.prefetched == 0);
  CHECK(a.cold_rows > 0 && a.stale == 0);
  // Without a disk tier the hint does nothing.
  CHECK(memory.Prefetch(next.data(), next.size(), SerialRunner).empty());
  CHECK(memory.counters().prefetched == 0);
}

// Asynchronous workers' steps overlap: worker A's handles stay valid while
// worker B applies and looks up (spilling) several times in between.
void TestOverlappingStepsKeepTheirHandles() {
  EmbeddingTable memory(Config(0)), disk(Config(0.25));
  Optimizer sgd;
  sgd.lr = 0.5f;
  std::vector<int64_t> a(100), b(300);
  for (int i = 0; i < 100; ++i) a[i] = i;
  std::vector<float> values(300 * 8), grads(300 * 8, 1.f);
  std::vector<int64_t> ha(100), hb(300);
  auto step_of_b = [&](EmbeddingTable* t, int step) {  // other keys each step
    for (int i = 0; i < 300; ++i) b[i] = 1000 + step * 300 + i;
    CHECK(t->FindOrInsert(b.data(), 300, step, -1, values.data(), hb.data(),
                          SerialRunner).empty());
    CHECK(t->Apply(sgd, hb.data(), true, grads.data(), 300, SerialRunner).empty());
  };
  for (EmbeddingTable* t : {&memory, &disk}) {
    for (int step = 0; step < 20; ++step) step_of_b(t, step);  // rows old enough to spill
    CHECK(t->FindOrInsert(a.data(), 100, 20, -1, values.data(), ha.data(), SerialRunner).empty());
    for (int step = 20; step < 28; ++step) step_of_b(t, step);  // between A's lookup and apply
    CHECK(t->Apply(sgd, ha.data(), true, grads.data(), 100, SerialRunner).empty());
    CHECK(t->counters().stale == 0);
  }
  CHECK(disk.counters().cold_rows > 0);
  CHECK(Rows(memory) == Rows(disk));
}

// The segment files of a table's tier.
std::vector<std::string> Segments(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("shard-", 0) == 0) {
      for (const std::string& seg : Segments(dir + "/" + name)) out.push_back(seg);
    } else if (name.rfind("seg-", 0) == 0) {
      out.push_back(dir + "/" + name);
    }
  }
  closedir(d);
  return out;
}

void TestDamagedRecordFailsLoudly() {
  TableConfig c = Config(0);
  c.memory_budget = 1.0 * 64 * c.num_shards;  // one record's bytes a shard: ~every row on disk
  c.storage_path = StoragePath();
  EmbeddingTable t(c);
  CHECK(t.open_error().empty());
  std::vector<int64_t> keys(400);
  for (int i = 0; i < 400; ++i) keys[i] = i;
  std::vector<float> values(keys.size() * 8);
  std::vector<int64_t> handles(keys.size());
  CHECK(t.FindOrInsert(keys.data(), keys.size(), 1, -1, values.data(), handles.data(),
                       SerialRunner).empty());
  Optimizer sgd;
  sgd.lr = 0.1f;
  const std::vector<float> grads(keys.size() * 8, 1.f);
  CHECK(t.Apply(sgd, handles.data(), true, grads.data(), keys.size(), SerialRunner).empty());
  // Steps that use another row: once the first 400 are kSparedVersions (16)
  // steps old, they go to disk.
  for (int step = 2; step <= 18; ++step) {
    const int64_t other = 1000;
    CHECK(t.FindOrInsert(&other, 1, step, -1, values.data(), handles.data(),
                         SerialRunner).empty());
    CHECK(t.Apply(sgd, handles.data(), true, grads.data(), 1, SerialRunner).empty());
  }
  CHECK(t.counters().cold_rows >= 390);
  // Flip bytes in the middle of every segment: the records there fail their crc.
  const std::vector<std::string> segments = Segments(t.tier_dir());
  CHECK(!segments.empty());
  for (const std::string& path : segments) {
    const int fd = open(path.c_str(), O_RDWR);
    CHECK(fd >= 0);
    const off_t size = lseek(fd, 0, SEEK_END);
    char junk[16];
    std::memset(junk, 0x5A, sizeof(junk));
    CHECK(pwrite(fd, junk, sizeof(junk), size / 2) == static_cast<ssize_t>(sizeof(junk)));
    close(fd);
  }
  // The failing lookup also holds a new key and a key in memory: no row is
  // made, counted or stamped (rows may have moved between the tiers).
  keys.push_back(5000);
  keys.push_back(1000);
  values.resize(keys.size() * 8);
  handles.resize(keys.size());
  const graphmod::TableCounters was = t.counters();
  const int64_t next = t.version() + 1;  // what a lookup now stamps
  CHECK(t.CountRows(next) == 0);
  const std::string error = t.FindOrInsert(keys.data(), keys.size(), 30, -1, values.data(),
                                           handles.data(), SerialRunner);
  std::printf("damaged record: %s\n", error.c_str());
  CHECK(error.find("seg-") != std::string::npos);  // names the file
  CHECK(t.size() == was.rows && t.counters().admitted == was.admitted);
  CHECK(t.CountRows(next) == 0);  // no row stamped (counted) by the failed lookup
  CHECK(!t.Export(0, [&](int64_t n) {
              static std::vector<int64_t> k;
              k.resize(n);
              return ExportBuffers{k.data()};
            }).empty());
  std::vector<float> found(keys.size() * 8);
  CHECK(!t.Find(keys.data(), keys.size(), found.data(), SerialRunner).empty());
}

void TestUnusableStoragePath() {
  TableConfig c = Config(0.5);
  c.storage_path = "/proc/graphmod-cannot-write-here";
  EmbeddingTable t(c);
  std::printf("unusable path: %s\n", t.open_error().c_str());
  CHECK(t.open_error().find("/proc/graphmod-cannot-write-here") != std::string::npos);
  c = Config(0.5);
  c.storage_path.clear();
  CHECK(!graphmod::ValidateConfig(c).empty());  // a budget needs a path
  c = Config(0);
  c.storage_path = StoragePath();
  CHECK(!graphmod::ValidateConfig(c).empty());  // and a path a budget
  c = Config(-1);
  c.memory_budget = -1;
  CHECK(!graphmod::ValidateConfig(c).empty());
  c = Config(0.5);
  c.max_rows = 1000;  // a full table would evict the hot rows: refused, for now
  CHECK(!graphmod::ValidateConfig(c).empty());
}

// What a killed process left (no flock held) goes when a table opens its
// tier under the same path; a tier in use stays.
void TestOrphansRemoved() {
  // Named as TierDirectory names them: <table>.<host>.<pid>.<token>-<serial>.
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  std::string host = buf;
  for (char& c : host)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  const std::string dir = StoragePath() + "/";
  const std::string orphan = dir + "other_table." + host + ".999999.0123abcd-0";  // pid gone
  const std::string mine = dir + "my_table." + host + "." + std::to_string(getpid()) + ".00ff-0";
  const std::string away_old = dir + "t.elsewhere.77.0a-0";    // another host, 11 minutes old
  const std::string away_fresh = dir + "t.elsewhere.77.0b-0";  // another host, being made
  // A dead pid's name, but its shard is locked by a live tier: it stays.
  const std::string live = dir + "live_table." + host + ".999998.0c-0/shard-0";
  for (const std::string& d : {orphan, mine, away_old, away_fresh})
    CHECK(std::system(("mkdir -p " + d + "/shard-0 && touch " + d + "/shard-0/seg-1.log")
                          .c_str()) == 0);
  CHECK(std::system(("touch -d '11 minutes ago' " + away_old).c_str()) == 0);
  graphmod::TierOptions options;
  options.dir = live;
  options.record_bytes = 64;
  std::string error;
  std::unique_ptr<graphmod::LogTier> in_use = graphmod::LogTier::Open(options, &error);
  CHECK(in_use != nullptr);
  {
    EmbeddingTable t(Config(0.5));
    CHECK(t.open_error().empty());
    CHECK(access(orphan.c_str(), F_OK) != 0);
    CHECK(access(away_old.c_str(), F_OK) != 0);
    CHECK(access(mine.c_str(), F_OK) == 0);        // its process lives
    CHECK(access(away_fresh.c_str(), F_OK) == 0);  // too new to tell
    CHECK(access(live.c_str(), F_OK) == 0);        // locked
  }
  in_use.reset();
  rmdir(live.substr(0, live.rfind('/')).c_str());
  for (const std::string& d : {mine, away_fresh})
    CHECK(std::system(("rm -r " + d).c_str()) == 0);
}

}  // namespace

int main() {
  // A clean start: what an earlier, killed run left would count as an orphan.
  CHECK(std::system(("rm -rf " + StoragePath()).c_str()) == 0);
  TestTrainsAsInMemory();
  TestDeltasAfterManyNewRows();
  TestOverlappingStepsKeepTheirHandles();
  TestPrefetchServesTheNextStep("arena");
  TestPrefetchServesTheNextStep("buckets");
  TestDamagedRecordFailsLoudly();
  TestUnusableStoragePath();
  TestOrphansRemoved();
  // Every table removed its tier's files and directories.
  DIR* d = opendir(StoragePath().c_str());
  int left = 0;
  while (d != nullptr && readdir(d) != nullptr) ++left;
  if (d != nullptr) closedir(d);
  CHECK(left <= 2);  // "." and ".."
  return graphmod_test::TestExit("tier_table_test");
}
