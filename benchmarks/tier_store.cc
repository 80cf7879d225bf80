// The disk tier's store against RocksDB, on the work a tier gives its store
// (issue 22: "choose the disk store by measurement").
//
// A tiered shard asks its store for three things: spills (a batch of whole
// records written), promotions (a batch of keys read back, then forgotten),
// and nothing else on the training path. This driver replays that steady
// state on one store: `keys` records of `record_bytes` (a dim-16 Adagrad row:
// header + values + slot) go to disk in batches, then each step promotes
// `batch` keys picked at random among those on disk (read, then erase) and
// spills as many others back (put), so the store holds `keys` records
// throughout, as a tier at its budget does.
//
//   log:     native/log_tier (segments of fixed records, an in-memory index,
//            background compaction), as the table uses it.
//   rocksdb: RocksDB 7.8 (Debian's librocksdb-dev): MultiGet for the reads,
//            one WriteBatch of deletes and puts per step; no WAL and no
//            compression (the tier is scratch and rows do not compress),
//            tuned for point lookups (OptimizeForPointLookup: a 64 MiB block
//            cache, hash index, bloom filters; 15% faster here than its
//            defaults), two background threads.
//
// Prints one JSON line: fill and step rates, process CPU seconds of each
// phase, the bytes the store's files hold and the peak RSS. Run by
// benchmarks/tier_store.py (rounds, fresh processes, interleaved arms).
//
// Usage: tier_store log|rocksdb DIR [keys] [steps] [batch]
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "native/log_tier.h"
#include "native/row_store.h"

namespace {

constexpr size_t kRecordBytes = 24 + 2 * 16 * 4;  // header, 16 values, 16 slot floats

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

long PeakRssKiB() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int64_t DirBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "tier_store: %s\n", what.c_str());
  std::exit(1);
}

// A record of `key` whose bytes depend on key and round (checked on read).
void MakeRecord(int64_t key, uint32_t round, char* rec) {
  graphmod::RecordHeader* h = graphmod::Header(rec);
  h->key = key;
  h->last_seen = key ^ 0x5bd1e995;
  h->count = round;
  h->version = round;
  float* v = reinterpret_cast<float*>(rec + sizeof(graphmod::RecordHeader));
  for (size_t i = 0; i < (kRecordBytes - sizeof(graphmod::RecordHeader)) / 4; ++i)
    v[i] = static_cast<float>(key % 1000) * 0.001f + static_cast<float>(i);
}

class Store {
 public:
  virtual ~Store() = default;
  virtual void Put(const char* records, size_t n) = 0;
  // One step: reads `take` into out and forgets them, then puts `spill`.
  virtual void Step(const char* spill, const int64_t* take, size_t n, char* out) = 0;
};

class LogStore : public Store {
 public:
  explicit LogStore(const std::string& dir) {
    graphmod::TierOptions o;
    o.dir = dir;
    o.record_bytes = kRecordBytes;
    std::string error;
    tier_ = graphmod::LogTier::Open(o, &error);
    if (!tier_) Fail(error);
  }
  void Put(const char* records, size_t n) override {
    const std::string error = tier_->Put(records, n);
    if (!error.empty()) Fail(error);
  }
  void Step(const char* spill, const int64_t* take, size_t n, char* out) override {
    std::unique_ptr<bool[]> found(new bool[n]());
    const std::string error = tier_->Read(take, n, out, found.get());
    if (!error.empty()) Fail(error);
    for (size_t i = 0; i < n; ++i)
      if (!found[i]) Fail("log: key " + std::to_string(take[i]) + " not found");
    tier_->Erase(take, n);
    Put(spill, n);
  }

 private:
  std::unique_ptr<graphmod::LogTier> tier_;
};

class RocksStore : public Store {
 public:
  explicit RocksStore(const std::string& dir) {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.compression = rocksdb::kNoCompression;
    o.IncreaseParallelism(2);
    o.OptimizeForPointLookup(64);  // 64 MiB block cache, hash index, bloom filters
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, dir, &db);
    if (!s.ok()) Fail("rocksdb: " + s.ToString());
    db_.reset(db);
    write_.disableWAL = true;
  }
  void Put(const char* records, size_t n) override {
    rocksdb::WriteBatch batch;
    AddPuts(records, n, &batch);
    Write(&batch);
  }
  void Step(const char* spill, const int64_t* take, size_t n, char* out) override {
    Read(take, n, out);
    rocksdb::WriteBatch batch;  // the deletes and puts of a step, written together
    AddDeletes(take, n, &batch);
    AddPuts(spill, n, &batch);
    Write(&batch);
  }

 private:
  // Big-endian keys: RocksDB's byte order is the keys' order.
  static std::string Key(int64_t key) {
    std::string k(8, '\0');
    const uint64_t u = static_cast<uint64_t>(key);
    for (int i = 0; i < 8; ++i) k[i] = static_cast<char>(u >> (56 - 8 * i));
    return k;
  }
  void AddPuts(const char* records, size_t n, rocksdb::WriteBatch* batch) {
    for (size_t i = 0; i < n; ++i) {
      const char* rec = records + i * kRecordBytes;
      batch->Put(Key(graphmod::Header(rec)->key), rocksdb::Slice(rec, kRecordBytes));
    }
  }
  void AddDeletes(const int64_t* keys, size_t n, rocksdb::WriteBatch* batch) {
    for (size_t i = 0; i < n; ++i) batch->Delete(Key(keys[i]));
  }
  void Write(rocksdb::WriteBatch* batch) {
    const rocksdb::Status s = db_->Write(write_, batch);
    if (!s.ok()) Fail("rocksdb: " + s.ToString());
  }
  void Read(const int64_t* keys, size_t n, char* out) {
    std::vector<std::string> names(n);
    std::vector<rocksdb::Slice> slices(n);
    for (size_t i = 0; i < n; ++i) {
      names[i] = Key(keys[i]);
      slices[i] = names[i];
    }
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), n, slices.data(),
                  values.data(), statuses.data());
    for (size_t i = 0; i < n; ++i) {
      if (!statuses[i].ok() || values[i].size() != kRecordBytes)
        Fail("rocksdb: key " + std::to_string(keys[i]) + ": " + statuses[i].ToString());
      std::memcpy(out + i * kRecordBytes, values[i].data(), kRecordBytes);
    }
  }

  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Fail("usage: tier_store log|rocksdb DIR [keys] [steps] [batch]");
  const std::string kind = argv[1], dir = argv[2];
  const int64_t keys = argc > 3 ? std::atoll(argv[3]) : 1000000;
  const int64_t steps = argc > 4 ? std::atoll(argv[4]) : 300;
  const int64_t batch = argc > 5 ? std::atoll(argv[5]) : 2000;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::unique_ptr<Store> store;
  if (kind == "log") {
    store.reset(new LogStore(dir + "/log"));
  } else if (kind == "rocksdb") {
    store.reset(new RocksStore(dir + "/rocksdb"));
  } else {
    Fail("unknown store '" + kind + "'");
  }

  // Fill: every key on disk, in batches of 4096.
  std::vector<char> records(4096 * kRecordBytes);
  double t0 = Now(), c0 = CpuSeconds();
  for (int64_t k = 0; k < keys; k += 4096) {
    const int64_t n = std::min<int64_t>(4096, keys - k);
    for (int64_t i = 0; i < n; ++i) MakeRecord((k + i) * 7919, 0, records.data() + i * kRecordBytes);
    store->Put(records.data(), n);
  }
  const double fill_s = Now() - t0, fill_cpu = CpuSeconds() - c0;

  // Steps: promote `batch` random keys on disk, spill as many off disk.
  std::vector<int64_t> on_disk(keys), off_disk;
  for (int64_t k = 0; k < keys; ++k) on_disk[k] = k * 7919;
  for (int64_t k = 0; k < batch; ++k) off_disk.push_back((keys + k) * 7919);
  std::mt19937_64 rng(42);
  std::vector<int64_t> take(batch);
  std::vector<char> spill(batch * kRecordBytes), out(batch * kRecordBytes);
  int64_t checked = 0;
  t0 = Now();
  c0 = CpuSeconds();
  for (int64_t s = 0; s < steps; ++s) {
    // Distinct picks: swap each chosen key to the back of on_disk.
    for (int64_t i = 0; i < batch; ++i) {
      const size_t j = rng() % (on_disk.size() - i);
      std::swap(on_disk[j], on_disk[on_disk.size() - 1 - i]);
      take[i] = on_disk[on_disk.size() - 1 - i];
    }
    for (int64_t i = 0; i < batch; ++i)
      MakeRecord(off_disk[i], static_cast<uint32_t>(s + 1), spill.data() + i * kRecordBytes);
    store->Step(spill.data(), take.data(), batch, out.data());
    for (int64_t i = 0; i < batch; ++i) {  // what was read is what was put
      const graphmod::RecordHeader* h = graphmod::Header(out.data() + i * kRecordBytes);
      if (h->key != take[i] || h->last_seen != (take[i] ^ 0x5bd1e995))
        Fail(kind + ": key " + std::to_string(take[i]) + " read back wrong");
      ++checked;
    }
    // The taken keys leave the disk; the spilled ones join it.
    for (int64_t i = 0; i < batch; ++i) {
      std::swap(on_disk[on_disk.size() - 1 - i], off_disk[i]);
    }
  }
  const double step_s = Now() - t0, step_cpu = CpuSeconds() - c0;
  const int64_t disk = DirBytes(dir);
  std::printf(
      "{\"store\": \"%s\", \"keys\": %lld, \"record_bytes\": %zu, \"steps\": %lld, "
      "\"batch\": %lld, \"fill_keys_per_s\": %.1f, \"fill_cpu_s\": %.3f, "
      "\"step_keys_per_s\": %.1f, \"steps_per_s\": %.2f, \"step_cpu_s\": %.3f, "
      "\"step_wall_s\": %.3f, \"disk_bytes\": %lld, \"peak_rss_kib\": %ld, \"checked\": %lld}\n",
      kind.c_str(), static_cast<long long>(keys), kRecordBytes, static_cast<long long>(steps),
      static_cast<long long>(batch), keys / fill_s, fill_cpu, steps * batch / step_s,
      steps / step_s, step_cpu, step_s, static_cast<long long>(disk), PeakRssKiB(),
      static_cast<long long>(checked));
  store.reset();
  std::filesystem::remove_all(dir);
  return 0;
}
