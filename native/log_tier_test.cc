// Tests of native/log_tier.h (its parts have their own: crc32c_test,
// cold_index_test, segment_file_test): round trips, absent keys, corruption,
// segment rolling, compaction (explicit, background, with a pinned reader),
// streaming export, Open's wiping/locking/failures, a full disk, the test
// pause hook, a property test against std::unordered_map, and concurrent
// readers/writers/compaction.
//   log_tier_test                every test
//   log_tier_test --concurrency  only the multi-threaded ones (the TSan build)
//   log_tier_test --bench        put MB/s, batched random reads/s, CPU seconds
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "native/bits.h"
#include "native/crc32c.h"
#include "native/log_tier.h"
#include "native/row_store.h"
#include "native/test_check.h"
#include "native/test_dir.h"

using graphmod::LogTier;
using graphmod::RecordHeader;
using graphmod::TierCounters;
using graphmod::TierOptions;
using graphmod_test::ListDir;

namespace {

std::string g_base;  // this run's scratch directory

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Bytes of the segment files actually on disk.
int64_t SegmentFileBytes(const std::string& dir) {
  int64_t total = 0;
  for (const std::string& name : ListDir(dir))
    if (name.rfind("seg-", 0) == 0) total += FileSize(dir + "/" + name);
  return total;
}

size_t SegmentFiles(const std::string& dir) {
  size_t n = 0;
  for (const std::string& name : ListDir(dir)) n += name.rfind("seg-", 0) == 0;
  return n;
}

using graphmod_test::RemoveTree;

std::string Dir(const std::string& name) { return g_base + "/" + name + "/0"; }

TierOptions Options(const std::string& dir, size_t record_bytes, size_t records_per_segment,
                    bool background = false) {
  TierOptions o;
  o.dir = dir;
  o.record_bytes = record_bytes;
  o.segment_bytes = 64 + records_per_segment * (record_bytes + 8);
  o.background_compaction = background;
  return o;
}

std::unique_ptr<LogTier> MustOpen(const TierOptions& o) {
  std::string error;
  std::unique_ptr<LogTier> tier = LogTier::Open(o, &error);
  if (tier == nullptr) std::fprintf(stderr, "Open failed: %s\n", error.c_str());
  CHECK(tier != nullptr && error.empty());
  return tier;
}

// A record whose every byte follows from (key, version), so any reader can
// tell a torn or misplaced record from a real one.
void FillRecord(char* rec, size_t record_bytes, int64_t key, uint32_t version) {
  const RecordHeader h{key, key * 3 + version, version + 1, version};
  std::memcpy(rec, &h, sizeof(h));
  for (size_t i = sizeof(h); i < record_bytes; i += 8) {
    const uint64_t v = graphmod::Mix(static_cast<uint64_t>(key) * 1000003u + version * 7919u + i);
    std::memcpy(rec + i, &v, 8);
  }
}

std::vector<char> Record(size_t record_bytes, int64_t key, uint32_t version) {
  std::vector<char> r(record_bytes);
  FillRecord(r.data(), record_bytes, key, version);
  return r;
}

bool RecordValid(const char* rec, size_t record_bytes) {
  RecordHeader h;
  std::memcpy(&h, rec, sizeof(h));
  const std::vector<char> want = Record(record_bytes, h.key, h.version);
  return std::memcmp(want.data(), rec, record_bytes) == 0;
}

// Puts (key, version) pairs as one batch.
std::string PutBatch(LogTier* tier, const std::vector<std::pair<int64_t, uint32_t>>& rows) {
  const size_t rb = tier->record_bytes();
  std::vector<char> buf(rows.size() * rb);
  for (size_t i = 0; i < rows.size(); ++i)
    FillRecord(buf.data() + i * rb, rb, rows[i].first, rows[i].second);
  return tier->Put(buf.data(), rows.size());
}

// Reads one key: "" and its bytes, or an error / "absent".
std::string ReadOne(LogTier* tier, int64_t key, std::vector<char>* out) {
  out->assign(tier->record_bytes(), 0);
  bool found = false;
  const std::string e = tier->Read(&key, 1, out->data(), &found);
  if (!e.empty()) return e;
  return found ? "" : "absent";
}

uint32_t ReadU32(const std::string& path, off_t offset) {
  uint32_t v = 0;
  const int fd = open(path.c_str(), O_RDONLY);
  CHECK(fd >= 0 && pread(fd, &v, 4, offset) == 4);
  close(fd);
  return v;
}

// ------------------------------------------------------------------ tests

void TestRoundTrip() {
  const std::string dir = Dir("round_trip");
  auto tier = MustOpen(Options(dir, 88, 1000));
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t i = 0; i < 100; ++i) rows.emplace_back(i * 7 - 300, 1);
  CHECK(PutBatch(tier.get(), rows).empty());
  TierCounters c = tier->counters();
  CHECK(c.rows == 100 && c.writes == 100 && c.write_bytes == 100 * 96);
  CHECK(c.live_bytes == 100 * 96 && c.file_bytes == 64 + 100 * 96);
  CHECK(SegmentFileBytes(dir) == c.file_bytes);
  CHECK(tier->Contains(-300 + 7 * 10) && !tier->Contains(-299));
  const int64_t probe[] = {-300, -299, -300 + 7 * 99, 5};
  bool here[4];
  tier->Contains(probe, 4, here);
  CHECK(here[0] && !here[1] && here[2] && !here[3]);

  // Bit for bit, in a shuffled order.
  std::vector<int64_t> keys;
  for (auto& r : rows) keys.push_back(r.first);
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64(3));
  std::vector<char> out(keys.size() * 88);
  std::unique_ptr<bool[]> found(new bool[keys.size()]);
  CHECK(tier->Read(keys.data(), keys.size(), out.data(), found.get()).empty());
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(found[i]);
    CHECK(std::memcmp(out.data() + i * 88, Record(88, keys[i], 1).data(), 88) == 0);
  }
  c = tier->counters();
  CHECK(c.reads == 100 && c.read_passes == 1 && c.read_bytes == 100 * 96);  // one run

  // Replace a key: the new copy is read, the old one is garbage.
  CHECK(PutBatch(tier.get(), {{-230, 2}}).empty());
  std::vector<char> one;
  CHECK(ReadOne(tier.get(), -230, &one).empty() && one == Record(88, -230, 2));
  c = tier->counters();
  CHECK(c.rows == 100 && c.live_bytes == 100 * 96 && c.file_bytes == 64 + 101 * 96);

  // A key twice in one batch: the later copy wins.
  CHECK(PutBatch(tier.get(), {{-223, 3}, {-223, 4}}).empty());
  CHECK(ReadOne(tier.get(), -223, &one).empty() && one == Record(88, -223, 4));
  CHECK(tier->counters().rows == 100);

  // Erase: present keys counted, absent ignored.
  const int64_t erase[] = {-230, 123456, -223, -230};
  CHECK(tier->Erase(erase, 4) == 2);
  CHECK(!tier->Contains(-230) && !tier->Contains(-223));
  CHECK(ReadOne(tier.get(), -230, &one) == "absent");
  c = tier->counters();
  CHECK(c.rows == 98 && c.live_bytes == 98 * 96);
  // The index's smallest form: one 4 KB segment and its bookkeeping.
  CHECK(tier->index_bytes() >= 4096 && tier->index_bytes() <= 4096 + 256);

  // Clear forgets everything and removes the files; the tier stays usable.
  tier->Clear();
  CHECK(tier->counters().rows == 0 && SegmentFiles(dir) == 0);
  CHECK(PutBatch(tier.get(), {{9, 9}}).empty());
  CHECK(ReadOne(tier.get(), 9, &one).empty() && one == Record(88, 9, 9));
  CHECK(ReadOne(tier.get(), -300, &one) == "absent");
}

void TestAbsentKeys() {
  const std::string dir = Dir("absent");
  auto tier = MustOpen(Options(dir, 24, 100));
  if (!tier) return;
  int64_t keys[] = {1, 2, 3, 4};
  std::vector<char> out(4 * 24, '\xAB');
  bool found[4] = {true, true, true, true};
  CHECK(tier->Read(keys, 4, out.data(), found).empty());  // an empty tier
  CHECK(!found[0] && !found[1] && !found[2] && !found[3]);
  CHECK(tier->counters().read_passes == 0);
  CHECK(PutBatch(tier.get(), {{2, 5}, {4, 6}}).empty());
  CHECK(tier->Read(keys, 4, out.data(), found).empty());
  CHECK(!found[0] && found[1] && !found[2] && found[3]);
  CHECK(std::memcmp(out.data() + 24, Record(24, 2, 5).data(), 24) == 0);
  CHECK(std::memcmp(out.data() + 72, Record(24, 4, 6).data(), 24) == 0);
  // Absent keys' bytes are left alone.
  for (size_t i : {size_t{0}, size_t{2}})
    for (size_t b = 0; b < 24; ++b) CHECK(out[i * 24 + b] == '\xAB');
  CHECK(tier->Read(keys, 0, out.data(), found).empty());
}

void TestCorruptionDetected() {
  const std::string dir = Dir("corrupt");
  auto tier = MustOpen(Options(dir, 88, 1000));
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t k = 0; k < 50; ++k) rows.emplace_back(1000 + k, 1);
  CHECK(PutBatch(tier.get(), rows).empty());
  const std::string seg = dir + "/seg-1.log";
  // Flip one value byte of key 1010's record (the 11th).
  const off_t at = 64 + 10 * 96;
  const int fd = open(seg.c_str(), O_RDWR);
  char byte;
  CHECK(pread(fd, &byte, 1, at + 40) == 1);
  byte ^= 0x10;
  CHECK(pwrite(fd, &byte, 1, at + 40) == 1);
  std::vector<char> one;
  const std::string e = ReadOne(tier.get(), 1010, &one);
  CHECK(Contains(e, "crc32c mismatch") && Contains(e, "key 1010") && Contains(e, "seg-1.log") &&
        Contains(e, "offset " + std::to_string(at)));
  // In a batch: the error still names it, the others are read.
  int64_t keys[] = {1009, 1010, 1011};
  std::vector<char> out(3 * 88);
  bool found[3];
  CHECK(Contains(tier->Read(keys, 3, out.data(), found), "key 1010"));
  CHECK(std::memcmp(out.data(), Record(88, 1009, 1).data(), 88) == 0);
  CHECK(std::memcmp(out.data() + 176, Record(88, 1011, 1).data(), 88) == 0);
  CHECK(ReadOne(tier.get(), 1011, &one).empty());
  // The export checks too.
  const std::string export_error = tier->ForEachSince(0, [](const char*) { return ""; });
  CHECK(Contains(export_error, "key 1010") && Contains(export_error, "crc32c"));
  // A corrupted key field: the record is not recognised as live; the export
  // notices the missing record instead of silently dropping it.
  tier->Clear();
  CHECK(PutBatch(tier.get(), rows).empty());
  const std::string seg2 = dir + "/seg-2.log";
  const int fd2 = open(seg2.c_str(), O_RDWR);
  const int64_t bogus = 777777;
  CHECK(pwrite(fd2, &bogus, 8, 64 + 3 * 96) == 8);
  close(fd2);
  CHECK(Contains(ReadOne(tier.get(), 1003, &one), "key 1003"));
  CHECK(Contains(tier->ForEachSince(0, [](const char*) { return ""; }), "corrupt keys"));
  close(fd);
}

void TestSegmentRolling() {
  const std::string dir = Dir("rolling");
  auto tier = MustOpen(Options(dir, 88, 10));  // 10 records a segment
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  int64_t next = 0;
  auto put = [&](int n) {
    rows.clear();
    for (int i = 0; i < n; ++i) rows.emplace_back(next++, 1);
    CHECK(PutBatch(tier.get(), rows).empty());
  };
  put(3);
  put(25);  // 7 fill seg-1, 10 go to seg-2, 8 to seg-3
  for (int i = 0; i < 10; ++i) put(1);
  CHECK(ListDir(dir) == (std::vector<std::string>{"seg-1.log", "seg-2.log", "seg-3.log",
                                                   "seg-4.log"}));
  CHECK(FileSize(dir + "/seg-1.log") == 64 + 10 * 96);
  CHECK(FileSize(dir + "/seg-4.log") == 64 + 8 * 96);
  const TierCounters c = tier->counters();
  CHECK(c.rows == 38 && c.file_bytes == 4 * 64 + 38 * 96 && SegmentFileBytes(dir) == c.file_bytes);
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 38; ++k) keys.push_back(k);
  std::vector<char> out(38 * 88);
  std::unique_ptr<bool[]> found(new bool[38]);
  CHECK(tier->Read(keys.data(), 38, out.data(), found.get()).empty());
  for (int64_t k = 0; k < 38; ++k)
    CHECK(found[k] && std::memcmp(out.data() + k * 88, Record(88, k, 1).data(), 88) == 0);
  // The header: magic, format version, record bytes, stride, number, crc.
  const std::string seg3 = dir + "/seg-3.log";
  char magic[8] = {};
  const int fd = open(seg3.c_str(), O_RDONLY);
  CHECK(pread(fd, magic, 8, 0) == 8 && std::memcmp(magic, "GMSEG1\0\0", 8) == 0);
  char head[24];
  CHECK(pread(fd, head, 24, 0) == 24);
  close(fd);
  CHECK(ReadU32(seg3, 8) == 1 && ReadU32(seg3, 12) == 88 && ReadU32(seg3, 16) == 96 &&
        ReadU32(seg3, 20) == 3 && ReadU32(seg3, 24) == graphmod::Crc32c(head, 24));
  // A record's crc sits right after it, then 4 zero bytes.
  CHECK(ReadU32(seg3, 64 + 88) == graphmod::Crc32c(Record(88, 20, 1).data(), 88));  // keys 20..29
  CHECK(ReadU32(seg3, 64 + 92) == 0);
}

void TestCompaction() {
  const std::string dir = Dir("compaction");
  TierOptions o = Options(dir, 88, 10);
  o.compact_garbage = 0.5;
  auto tier = MustOpen(o);
  if (!tier) return;
  std::map<int64_t, uint32_t> model;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t k = 0; k < 100; ++k) rows.emplace_back(k, 1), model[k] = 1;
  CHECK(PutBatch(tier.get(), rows).empty());  // seg-1 .. seg-10, all sealed
  // Segments 1-6 lose 6 of 10 (erased or replaced); 7-10 lose 2 (below 0.5).
  std::vector<int64_t> erase;
  rows.clear();
  for (int64_t k = 0; k < 100; ++k) {
    const int64_t i = k % 10;
    if (k < 60 ? i < 3 : i < 1) erase.push_back(k), model.erase(k);
    else if (k < 60 ? i < 6 : i < 2) rows.emplace_back(k, 2), model[k] = 2;
  }
  CHECK(tier->Erase(erase.data(), erase.size()) == erase.size());
  CHECK(PutBatch(tier.get(), rows).empty());
  const TierCounters before = tier->counters();
  const size_t files_before = SegmentFiles(dir);
  tier->CompactNow();
  const TierCounters after = tier->counters();
  CHECK(after.compactions == 6);
  CHECK(after.compaction_bytes == 6 * 4 * 96);  // 4 live records copied from each
  CHECK(after.file_bytes < before.file_bytes);
  // The 24 copies fill seg-13 (which held 2) and go on into seg-14 and seg-15.
  CHECK(after.file_bytes == before.file_bytes - 6 * (64 + 10 * 96) + 6 * 4 * 96 + 2 * 64);
  CHECK(after.live_bytes == before.live_bytes && after.rows == before.rows);
  CHECK(SegmentFileBytes(dir) == after.file_bytes);
  CHECK(SegmentFiles(dir) < files_before);
  for (int n = 1; n <= 6; ++n) CHECK(!Exists(dir + "/seg-" + std::to_string(n) + ".log"));
  CHECK(tier->compaction_error().empty());
  // Every live record survives bit for bit (scores and all).
  std::vector<char> one;
  for (int64_t k = 0; k < 100; ++k) {
    const std::string e = ReadOne(tier.get(), k, &one);
    if (model.count(k) == 0) {
      CHECK(e == "absent");
      continue;
    }
    CHECK(e.empty() && one == Record(88, k, model[k]) && tier->Contains(k));
  }
  // Nothing left above the threshold: a second pass does nothing.
  tier->CompactNow();
  CHECK(tier->counters().compactions == 6);
}

void TestBackgroundCompaction() {
  const std::string dir = Dir("background");
  TierOptions o = Options(dir, 56, 20, /*background=*/true);
  o.compact_garbage = 0.3;
  auto tier = MustOpen(o);
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t k = 0; k < 400; ++k) rows.emplace_back(k, 1);
  CHECK(PutBatch(tier.get(), rows).empty());
  const int64_t bytes_before = tier->counters().file_bytes;
  std::vector<int64_t> erase;
  for (int64_t k = 0; k < 400; ++k)
    if (k % 4 != 0) erase.push_back(k);
  CHECK(tier->Erase(erase.data(), erase.size()) == 300);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tier->counters().compactions < 19 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const TierCounters c = tier->counters();
  CHECK(c.compactions >= 19);  // every sealed segment is 3/4 garbage (the copies' may not fill)
  CHECK(c.file_bytes < bytes_before / 2);
  std::vector<char> one;
  for (int64_t k = 0; k < 400; k += 4) CHECK(ReadOne(tier.get(), k, &one).empty() &&
                                             one == Record(56, k, 1));
  CHECK(ReadOne(tier.get(), 1, &one) == "absent");
}

// A Read pins the segments it looked up: compaction retires one meanwhile
// but unlinks it only when the Read is done.
void TestReadPinsSegments() {
  const std::string dir = Dir("pinning");
  auto tier = MustOpen(Options(dir, 88, 10));
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t k = 0; k < 20; ++k) rows.emplace_back(k, 1);
  CHECK(PutBatch(tier.get(), rows).empty());
  const int64_t erase[] = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(tier->Erase(erase, 8) == 8);  // seg-1: 8 of 10 garbage
  const std::string seg1 = dir + "/seg-1.log";
  bool hook_ran = false;
  LogTier::TestHooks hooks;
  hooks.read_pinned = [&] {
    if (hook_ran) return;
    hook_ran = true;
    tier->CompactNow();
    CHECK(tier->counters().compactions == 1);
    CHECK(Exists(seg1));  // retired, pinned
  };
  tier->SetTestHooks(hooks);
  std::vector<char> one;
  CHECK(ReadOne(tier.get(), 9, &one).empty() && one == Record(88, 9, 1));
  CHECK(hook_ran);
  CHECK(!Exists(seg1));  // the Read unpinned it: gone
  tier->SetTestHooks({});
  CHECK(ReadOne(tier.get(), 9, &one).empty() && one == Record(88, 9, 1));  // from its copy
  CHECK(SegmentFileBytes(dir) == tier->counters().file_bytes);
}

// Records a Put has written but not yet indexed look like garbage: a
// segment holding any is not compacted until the Put is done.
void TestPendingRecordsAreNotGarbage() {
  const std::string dir = Dir("pending");
  auto tier = MustOpen(Options(dir, 88, 10));
  if (!tier) return;
  CHECK(PutBatch(tier.get(), {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}).empty());
  const int64_t erase[] = {0, 1, 2, 3, 4};
  CHECK(tier->Erase(erase, 5) == 5);  // seg-1: 5 garbage, nothing live
  bool hook_ran = false;
  LogTier::TestHooks hooks;
  hooks.put_appended = [&] {  // seg-1 is now full, sealed, half garbage, half pending
    hook_ran = true;
    tier->CompactNow();
    CHECK(tier->counters().compactions == 0 && Exists(dir + "/seg-1.log"));
  };
  tier->SetTestHooks(hooks);
  CHECK(PutBatch(tier.get(), {{5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 1}}).empty());
  tier->SetTestHooks({});
  CHECK(hook_ran);
  std::vector<char> one;
  for (int64_t k = 5; k < 10; ++k) CHECK(ReadOne(tier.get(), k, &one).empty() && one == Record(88, k, 1));
  tier->CompactNow();  // now seg-1 is half garbage, all indexed: compacted
  CHECK(tier->counters().compactions == 1 && !Exists(dir + "/seg-1.log"));
  for (int64_t k = 5; k < 10; ++k) CHECK(ReadOne(tier.get(), k, &one).empty() && one == Record(88, k, 1));
}

// ForEachSince and KeysSeenBefore against a model (key -> version;
// FillRecord writes last_seen = key * 3 + version): every threshold from
// below the smallest to above the largest, so segments are both read and
// skipped by their bounds. Each record is seen once, whole.
void CheckScans(LogTier* tier, const std::unordered_map<int64_t, uint32_t>& model) {
  auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  for (int64_t v = -1; v <= 62; v += 3) {
    std::vector<int64_t> want, got;
    for (const auto& kv : model)
      if (v <= 0 || kv.second >= v) want.push_back(kv.first);
    CHECK(tier->ForEachSince(v, [&](const char* rec) {
                 RecordHeader h;
                 std::memcpy(&h, rec, sizeof(h));
                 got.push_back(h.key);
                 auto it = model.find(h.key);
                 CHECK(it != model.end() && it->second == h.version &&
                       RecordValid(rec, tier->record_bytes()));
                 return "";
               }).empty());
    CHECK(sorted(got) == sorted(want));
  }
  // fn's error stops the scan and comes back.
  size_t calls = 0;
  CHECK(tier->ForEachSince(0, [&](const char*) { return ++calls == 2 ? "stop" : ""; }) ==
        (model.size() >= 2 ? "stop" : ""));
  CHECK(calls == std::min<size_t>(2, model.size()));
  for (int64_t t = -5; t <= 3 * 300 + 70; t += 37) {
    std::vector<int64_t> want, got;
    for (const auto& kv : model)
      if (kv.first * 3 + kv.second < t) want.push_back(kv.first);
    CHECK(tier->KeysSeenBefore(t, &got).empty());
    CHECK(sorted(got) == sorted(want));
  }
}

void TestScans() {
  const std::string dir = Dir("chunks");
  auto tier = MustOpen(Options(dir, 40, 10));
  if (!tier) return;
  std::unordered_map<int64_t, uint32_t> model;
  std::mt19937_64 rng(4);
  for (int round = 0; round < 60; ++round) {
    std::vector<std::pair<int64_t, uint32_t>> rows;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const int64_t k = static_cast<int64_t>(rng() % 300);
      rows.emplace_back(k, static_cast<uint32_t>(round));
      model[k] = static_cast<uint32_t>(round);
    }
    CHECK(PutBatch(tier.get(), rows).empty());
    int64_t gone = static_cast<int64_t>(rng() % 300);
    model.erase(gone);
    tier->Erase(&gone, 1);
  }
  std::unordered_map<int64_t, int> keys;
  tier->ForEachKey([&](int64_t key) { ++keys[key]; });
  CHECK(keys.size() == model.size());
  for (auto& kv : keys) CHECK(kv.second == 1 && model.count(kv.first) == 1);
  CheckScans(tier.get(), model);
}

void TestOpen() {
  // Wipes the old segments, leaves other files alone.
  const std::string dir = Dir("open");
  RemoveTree(dir);
  CHECK(system(("mkdir -p '" + dir + "'").c_str()) == 0);
  for (const char* name : {"seg-3.log", "seg-12.log", "seg-x.log", "notes.txt"}) {
    const int fd = open((dir + "/" + name).c_str(), O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "junk", 4) == 4);
    close(fd);
  }
  {
    auto tier = MustOpen(Options(dir, 88, 10));
    CHECK(ListDir(dir) == (std::vector<std::string>{"notes.txt", "seg-1.log", "seg-x.log"}));
    if (tier) CHECK(tier->counters().rows == 0);

    // A second tier on the same directory is refused while the first lives.
    std::string error;
    CHECK(LogTier::Open(Options(dir, 88, 10), &error) == nullptr);
    CHECK(Contains(error, dir) && Contains(error, "in use"));
    std::vector<char> one;
    if (tier) {
      CHECK(PutBatch(tier.get(), {{1, 1}}).empty());  // and the refusal touched nothing
      CHECK(ReadOne(tier.get(), 1, &one).empty());
    }
  }
  CHECK(ListDir(dir) == (std::vector<std::string>{"notes.txt", "seg-x.log"}));
  CHECK(MustOpen(Options(dir, 88, 10)) != nullptr);  // free again once the first is gone

  // An old segment that cannot be removed (here: a directory of that name).
  const std::string stuck = Dir("stuck");
  CHECK(system(("mkdir -p '" + stuck + "/seg-1.log'").c_str()) == 0);
  std::string stuck_error;
  CHECK(LogTier::Open(Options(stuck, 88, 10), &stuck_error) == nullptr);
  CHECK(Contains(stuck_error, stuck) && Contains(stuck_error, "seg-1.log") &&
        Contains(stuck_error, "Is a directory"));

  // An unwritable path fails clearly: a directory under a regular file.
  const std::string file = g_base + "/plain_file";
  const int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0644);
  close(fd);
  std::string error;
  CHECK(LogTier::Open(Options(file + "/t/0", 88, 10), &error) == nullptr);
  CHECK(Contains(error, file + "/t/0") && Contains(error, "Not a directory"));
  // A read-only directory (meaningless as root, who may write anywhere).
  if (geteuid() != 0) {
    const std::string ro = g_base + "/read_only";
    mkdir(ro.c_str(), 0500);
    CHECK(LogTier::Open(Options(ro + "/0", 88, 10), &error) == nullptr);
    CHECK(Contains(error, ro) && Contains(error, "Permission denied"));
  }
  // Bad options, refused before the disk is touched.
  TierOptions bad = Options(g_base + "/bad/0", 88, 10);
  bad.record_bytes = 20;
  CHECK(LogTier::Open(bad, &error) == nullptr && Contains(error, "record_bytes 20"));
  bad = Options(g_base + "/bad/0", 88, 10);
  bad.segment_bytes = 100;
  CHECK(LogTier::Open(bad, &error) == nullptr && Contains(error, "segment_bytes 100"));
  bad = Options(g_base + "/bad/0", 88, 10);
  bad.compact_garbage = 0;
  CHECK(LogTier::Open(bad, &error) == nullptr && Contains(error, "compact_garbage"));
  CHECK(!Exists(g_base + "/bad"));
}

void TestDestructorLeavesNoFiles() {
  const std::string dir = Dir("destructor");
  {
    TierOptions o = Options(dir, 88, 10, /*background=*/true);
    auto tier = MustOpen(o);
    if (!tier) return;
    std::vector<std::pair<int64_t, uint32_t>> rows;
    for (int64_t k = 0; k < 95; ++k) rows.emplace_back(k, 1);
    CHECK(PutBatch(tier.get(), rows).empty());
    CHECK(SegmentFiles(dir) == 10);
  }
  CHECK(!Exists(dir));                        // the shard's directory is gone
  CHECK(Exists(g_base + "/destructor"));      // its parent (other shards') stays
}

// A full disk (here: RLIMIT_FSIZE) fails the Put and changes nothing visible;
// the partial write is truncated away. A failure after the first segment of
// a batch (here: the next segment cannot be created) leaves the index as it
// was too, and the written part is garbage for compaction.
void TestDiskFull() {
  const std::string dir = Dir("disk_full");
  auto tier = MustOpen(Options(dir, 88, 10));
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> v1, v2;
  for (int64_t k = 0; k < 5; ++k) v1.emplace_back(k, 1);
  for (int64_t k = 0; k < 8; ++k) v2.emplace_back(k, 2);
  CHECK(PutBatch(tier.get(), v1).empty());
  const std::string seg1 = dir + "/seg-1.log";
  const int64_t size1 = FileSize(seg1);

  struct sigaction ignore = {}, old_action = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &old_action);
  rlimit old_limit;
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit small = old_limit;
  small.rlim_cur = static_cast<rlim_t>(size1 + 2 * 96 + 10);  // room for 2 of the 5
  CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const std::string e = PutBatch(tier.get(), v2);
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  CHECK(Contains(e, "seg-1.log") && Contains(e, "File too large") && Contains(e, dir));
  CHECK(FileSize(seg1) == size1);  // truncated back
  TierCounters c = tier->counters();
  CHECK(c.rows == 5 && c.writes == 5 && c.file_bytes == size1);
  std::vector<char> one;
  for (int64_t k = 0; k < 8; ++k) {
    const std::string r = ReadOne(tier.get(), k, &one);
    if (k < 5) CHECK(r.empty() && one == Record(88, k, 1));
    else CHECK(r == "absent");
  }

  // The batch fills seg-1 (5 records written), then seg-2 cannot be created:
  // the directory's path now names a plain file.
  const std::string moved = dir + ".moved";
  CHECK(rename(dir.c_str(), moved.c_str()) == 0);
  const int blocker = open(dir.c_str(), O_CREAT | O_WRONLY, 0644);
  const std::string e2 = PutBatch(tier.get(), v2);
  close(blocker);
  unlink(dir.c_str());
  CHECK(rename(moved.c_str(), dir.c_str()) == 0);
  CHECK(Contains(e2, "seg-2.log") && Contains(e2, "Not a directory"));
  c = tier->counters();
  CHECK(c.rows == 5 && c.live_bytes == 5 * 96 && c.file_bytes == 64 + 10 * 96);
  for (int64_t k = 0; k < 8; ++k) CHECK(ReadOne(tier.get(), k, &one) == (k < 5 ? "" : "absent"));

  // seg-1 is sealed and half garbage: compaction keeps the old copies.
  CHECK(PutBatch(tier.get(), v2).empty());  // the disk is back
  const int64_t keep[] = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(tier->Erase(keep + 5, 3) == 3);
  CHECK(PutBatch(tier.get(), v1).empty());
  tier->CompactNow();
  CHECK(!Exists(seg1) && tier->compaction_error().empty());
  for (int64_t k = 0; k < 8; ++k) {
    const std::string r = ReadOne(tier.get(), k, &one);
    if (k < 5) CHECK(r.empty() && one == Record(88, k, 1));
    else CHECK(r == "absent");
  }
}

void TestPauseHook() {
  const std::string dir = Dir("pause");
  setenv("GRAPHMOD_TIER_TEST_PAUSE", "spill,compact", 1);
  auto tier = MustOpen(Options(dir, 88, 10));
  unsetenv("GRAPHMOD_TIER_TEST_PAUSE");
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> rows;
  for (int64_t k = 0; k < 20; ++k) rows.emplace_back(k, 1);
  CHECK(PutBatch(tier.get(), rows).empty());
  const int64_t erase[] = {0, 1, 2, 3, 4};
  CHECK(tier->Erase(erase, 5) == 5);
  // Midway through the pause: the 5 copies are on disk (seg-3), the index
  // still points at seg-1.
  std::thread observer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    CHECK(FileSize(dir + "/seg-3.log") == 64 + 5 * 96);
    CHECK(Exists(dir + "/seg-1.log"));
    CHECK(tier->counters().compactions == 0);
  });
  const auto start = std::chrono::steady_clock::now();
  tier->CompactNow();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  observer.join();
  CHECK(seconds >= 1.9);
  CHECK(tier->counters().compactions == 1 && !Exists(dir + "/seg-1.log"));

  // Without the variable, no pause.
  const std::string dir2 = Dir("no_pause");
  auto quick = MustOpen(Options(dir2, 88, 10));
  if (!quick) return;
  CHECK(PutBatch(quick.get(), rows).empty());
  CHECK(quick->Erase(erase, 5) == 5);
  const auto start2 = std::chrono::steady_clock::now();
  quick->CompactNow();
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start2).count() < 1.5);
  CHECK(quick->counters().compactions == 1);
}

// Random put/erase/read/compact/export/clear against std::unordered_map.
void TestProperty() {
  for (uint64_t seed = 10; seed < 14; ++seed) {
    std::mt19937_64 rng(seed);
    const size_t rb = seed % 2 == 0 ? 40 : 24;
    const bool background = seed == 13;
    const std::string dir = Dir("property_" + std::to_string(seed));
    TierOptions o = Options(dir, rb, 20 + rng() % 40, background);
    o.compact_garbage = 0.2 + 0.2 * (seed % 3);
    o.read_threads = 1 + static_cast<int>(seed % 4);
    auto tier = MustOpen(o);
    if (!tier) return;
    std::unordered_map<int64_t, std::vector<char>> model;
    uint32_t version = 0;
    for (int op = 0; op < 2000; ++op) {
      const uint64_t what = rng() % 100;
      if (what < 40) {
        std::vector<std::pair<int64_t, uint32_t>> rows;
        const size_t n = 1 + rng() % 30;
        for (size_t i = 0; i < n; ++i) {
          const int64_t k = static_cast<int64_t>(rng() % 400) - 100;
          rows.emplace_back(k, ++version);
          model[k] = Record(rb, k, version);
        }
        CHECK(PutBatch(tier.get(), rows).empty());
      } else if (what < 60) {
        std::vector<int64_t> keys(1 + rng() % 20);
        size_t want = 0;
        for (auto& k : keys) {
          k = static_cast<int64_t>(rng() % 400) - 100;
          want += model.erase(k);
        }
        CHECK(tier->Erase(keys.data(), keys.size()) == want);
      } else if (what < 90) {
        std::vector<int64_t> keys(1 + rng() % 40);
        for (auto& k : keys) k = static_cast<int64_t>(rng() % 500) - 150;
        std::vector<char> out(keys.size() * rb);
        std::unique_ptr<bool[]> found(new bool[keys.size()]);
        CHECK(tier->Read(keys.data(), keys.size(), out.data(), found.get()).empty());
        for (size_t i = 0; i < keys.size(); ++i) {
          auto it = model.find(keys[i]);
          CHECK(found[i] == (it != model.end()));
          if (found[i] && it != model.end())
            CHECK(std::memcmp(out.data() + i * rb, it->second.data(), rb) == 0);
          CHECK(tier->Contains(keys[i]) == found[i]);
        }
      } else if (what < 96) {
        tier->CompactNow();
      } else if (what < 99) {
        std::unordered_map<int64_t, int> seen;
        CHECK(tier->ForEachSince(0, [&](const char* rec) {
                      RecordHeader h;
                      std::memcpy(&h, rec, sizeof(h));
                      ++seen[h.key];
                      auto it = model.find(h.key);
                      CHECK(it != model.end() && std::memcmp(rec, it->second.data(), rb) == 0);
                      return "";
                    }).empty());
        CHECK(seen.size() == model.size());
        for (auto& kv : seen) CHECK(kv.second == 1);
      } else {
        tier->Clear();
        model.clear();
      }
      const TierCounters c = tier->counters();
      CHECK(c.rows == static_cast<int64_t>(model.size()));
      CHECK(c.live_bytes == static_cast<int64_t>(model.size() * (rb + 8)));
      if (!background) CHECK(SegmentFileBytes(dir) == c.file_bytes);
    }
    CHECK(tier->compaction_error().empty());
    if (!background) CHECK(tier->counters().compactions > 0);
  }
}

// Readers, writers, erasers, compaction, exports and counters at once. Each
// writer owns the keys of its residue, so it knows their final state; readers
// check every record they get is a whole, correct record of the key asked.
void TestConcurrency() {
  const std::string dir = Dir("concurrency");
  TierOptions o = Options(dir, 56, 50, /*background=*/true);
  o.compact_garbage = 0.3;
  o.read_threads = 3;
  auto tier = MustOpen(o);
  if (!tier) return;
  constexpr int kWriters = 2;
  constexpr int64_t kKeys = 2000;
  std::atomic<uint32_t> version{0};
  std::atomic<int> writers_left{kWriters};
  std::vector<std::unordered_map<int64_t, uint32_t>> models(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(100 + w);
      auto& model = models[w];
      for (int op = 0; op < 400; ++op) {
        const size_t n = 1 + rng() % 64;
        if (rng() % 4 != 0) {
          std::vector<std::pair<int64_t, uint32_t>> rows;
          for (size_t i = 0; i < n; ++i) {
            const int64_t k = static_cast<int64_t>(rng() % (kKeys / kWriters)) * kWriters + w;
            rows.emplace_back(k, ++version);
            model[k] = rows.back().second;
          }
          CHECK(PutBatch(tier.get(), rows).empty());
        } else {
          std::vector<int64_t> keys(n);
          size_t want = 0;
          for (auto& k : keys) {
            k = static_cast<int64_t>(rng() % (kKeys / kWriters)) * kWriters + w;
            want += model.erase(k);
          }
          CHECK(tier->Erase(keys.data(), n) == want);
        }
      }
      --writers_left;
    });
  }
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(200 + r);
      while (writers_left > 0) {
        std::vector<int64_t> keys(1 + rng() % 200);
        for (auto& k : keys) k = static_cast<int64_t>(rng() % kKeys);
        std::vector<char> out(keys.size() * 56);
        std::unique_ptr<bool[]> found(new bool[keys.size()]);
        CHECK(tier->Read(keys.data(), keys.size(), out.data(), found.get()).empty());
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!found[i]) continue;
          RecordHeader h;
          std::memcpy(&h, out.data() + i * 56, sizeof(h));
          CHECK(h.key == keys[i] && RecordValid(out.data() + i * 56, 56));
        }
        tier->Contains(keys[0]);
      }
    });
  }
  threads.emplace_back([&] {  // explicit passes beside the background thread, exports, counters
    while (writers_left > 0) {
      tier->CompactNow();
      CHECK(tier->ForEachSince(0, [&](const char* rec) {
                  CHECK(RecordValid(rec, 56));
                  return "";
                }).empty());
      const TierCounters c = tier->counters();
      CHECK(c.rows >= 0 && c.rows <= kKeys && c.live_bytes <= c.file_bytes);
      size_t entries = 0;
      tier->ForEachKey([&](int64_t) { ++entries; });
      CHECK(entries <= static_cast<size_t>(kKeys));
      std::vector<int64_t> before;  // a time eviction's scan beside writers and compaction
      CHECK(tier->KeysSeenBefore(1 << 30, &before).empty() &&
            before.size() <= static_cast<size_t>(kKeys));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (auto& t : threads) t.join();

  // The final state is exactly the writers' models.
  std::vector<int64_t> keys(kKeys);
  for (int64_t k = 0; k < kKeys; ++k) keys[k] = k;
  std::vector<char> out(kKeys * 56);
  std::unique_ptr<bool[]> found(new bool[kKeys]);
  CHECK(tier->Read(keys.data(), kKeys, out.data(), found.get()).empty());
  size_t live = 0;
  for (int64_t k = 0; k < kKeys; ++k) {
    const auto& model = models[k % kWriters];
    auto it = model.find(k);
    CHECK(found[k] == (it != model.end()));
    if (found[k] && it != model.end()) {
      ++live;
      CHECK(std::memcmp(out.data() + k * 56, Record(56, k, it->second).data(), 56) == 0);
    }
  }
  const TierCounters c = tier->counters();
  CHECK(c.rows == static_cast<int64_t>(live));
  CHECK(c.compactions > 0 && tier->compaction_error().empty());

  // Clear while readers run: they see whole records or nothing.
  std::atomic<bool> done{false};
  std::thread reader([&] {
    std::mt19937_64 rng(300);
    while (!done) {
      std::vector<int64_t> ks(64);
      for (auto& k : ks) k = static_cast<int64_t>(rng() % 256);
      std::vector<char> buf(64 * 56);
      bool f[64];
      CHECK(tier->Read(ks.data(), 64, buf.data(), f).empty());
      for (size_t i = 0; i < 64; ++i)
        if (f[i]) CHECK(RecordValid(buf.data() + i * 56, 56));
    }
  });
  for (int round = 0; round < 40; ++round) {
    std::vector<std::pair<int64_t, uint32_t>> rows;
    for (int64_t k = 0; k < 256; ++k) rows.emplace_back(k, static_cast<uint32_t>(round));
    CHECK(PutBatch(tier.get(), rows).empty());
    tier->Clear();
  }
  done = true;
  reader.join();
}

// The index runs out of memory in the middle of a Put (it grows as keys
// come): the Put fails naming it, and the index points at the old copies
// again (added keys gone, updated keys back, live counts whole).
void TestIndexOutOfMemory() {
  const std::string dir = Dir("index_oom");
  auto tier = MustOpen(Options(dir, 40, 1000));
  if (!tier) return;
  std::vector<std::pair<int64_t, uint32_t>> old_rows, rows;
  for (int64_t k = 0; k < 250; ++k) old_rows.emplace_back(k, 1);
  CHECK(PutBatch(tier.get(), old_rows).empty());
  // Updates first, then new keys (the index's first segment fills at ~300),
  // and one key both updated and given twice.
  for (int64_t k = 0; k < 20; ++k) rows.emplace_back(k, 2);
  for (int64_t k = 1000; k < 1400; ++k) rows.emplace_back(k, 2);
  rows.emplace_back(5, 3);
  graphmod::ColdIndex::FailAllocationAfter(1);
  const std::string e = PutBatch(tier.get(), rows);
  graphmod::ColdIndex::FailAllocationAfter(0);
  CHECK(e.find("no memory to grow the cold index") != std::string::npos);
  CHECK(tier->counters().rows == 250 && tier->counters().live_bytes == 250 * 48);
  std::vector<char> one;
  for (int64_t k = 0; k < 250; ++k) CHECK(ReadOne(tier.get(), k, &one).empty() && one == Record(40, k, 1));
  for (int64_t k = 1000; k < 1400; ++k) CHECK(!tier->Contains(k));
  size_t rows_seen = 0;
  CHECK(tier->ForEachSince(0, [&](const char*) {
                ++rows_seen;
                return "";
              }).empty());
  CHECK(rows_seen == 250);
  // With memory back, the same Put goes through.
  CHECK(PutBatch(tier.get(), rows).empty());
  CHECK(tier->counters().rows == 650);
  CHECK(ReadOne(tier.get(), 5, &one).empty() && one == Record(40, 5, 3));
  CHECK(ReadOne(tier.get(), 1399, &one).empty() && one == Record(40, 1399, 2));
}

// ------------------------------------------------------------------ bench

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Bench() {
  constexpr size_t kRecords = 1000000, kBatch = 4096;
  for (size_t rb : {size_t{88}, size_t{280}}) {
    const std::string dir = Dir("bench_" + std::to_string(rb));
    TierOptions o;
    o.dir = dir;
    o.record_bytes = rb;
    o.background_compaction = false;
    if (const char* t = std::getenv("GRAPHMOD_BENCH_READ_THREADS")) o.read_threads = std::atoi(t);
    auto tier = MustOpen(o);
    if (!tier) return;
    std::vector<int64_t> order(kRecords);
    for (size_t i = 0; i < kRecords; ++i) order[i] = static_cast<int64_t>(i);
    std::mt19937_64 rng(5);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<char> buf(kBatch * rb);
    double put_wall = 0, put_cpu = 0;
    for (size_t b = 0; b < kRecords; b += kBatch) {
      const size_t n = std::min(kBatch, kRecords - b);
      for (size_t i = 0; i < n; ++i) FillRecord(buf.data() + i * rb, rb, order[b + i], 1);
      const double w0 = Now(), c0 = CpuSeconds();
      CHECK(tier->Put(buf.data(), n).empty());
      put_wall += Now() - w0, put_cpu += CpuSeconds() - c0;
    }
    const TierCounters after_put = tier->counters();
    const double index_full = static_cast<double>(tier->index_bytes()) / after_put.rows;
    const size_t files_after_put = SegmentFiles(dir);
    // Batched random reads: 1M records in batches of 4096 uniform random keys.
    std::vector<int64_t> keys(kBatch);
    std::vector<char> out(kBatch * rb);
    std::unique_ptr<bool[]> found(new bool[kBatch]);
    double read_wall = 0, read_cpu = 0;
    size_t bad = 0;
    for (size_t b = 0; b < kRecords; b += kBatch) {
      for (auto& k : keys) k = static_cast<int64_t>(rng() % kRecords);
      const double w0 = Now(), c0 = CpuSeconds();
      CHECK(tier->Read(keys.data(), kBatch, out.data(), found.get()).empty());
      read_wall += Now() - w0, read_cpu += CpuSeconds() - c0;
      for (size_t i = 0; i < kBatch; i += 97) bad += !found[i] || !RecordValid(out.data() + i * rb, rb);
    }
    CHECK(bad == 0);
    const TierCounters after_read = tier->counters();
    // The in-memory part of a Read alone: keys that are not there.
    for (auto& k : keys) k = static_cast<int64_t>(kRecords + rng() % kRecords);
    const double a0 = Now();
    for (size_t b = 0; b < kRecords; b += kBatch) tier->Read(keys.data(), kBatch, out.data(), found.get());
    const double absent_ns = (Now() - a0) * 1e9 / kRecords;
    // Compaction of a tier with half its records erased.
    std::vector<int64_t> erase;  // every other key: each segment turns half garbage
    for (size_t k = 0; k < kRecords; k += 2) erase.push_back(static_cast<int64_t>(k));
    tier->Erase(erase.data(), erase.size());
    const double w0 = Now(), c0 = CpuSeconds();
    tier->CompactNow();
    const double compact_wall = Now() - w0, compact_cpu = CpuSeconds() - c0;
    const TierCounters c = tier->counters();
    std::printf(
        "bench %zu B records (%zu on disk), 1M records, batches of %zu:\n"
        "  put:     %.0f MB/s of records (%.2f s wall, %.2f CPU-s), %zu segment files\n"
        "  read:    %.0f records/s, uniform random keys (%.2f s wall, %.2f CPU-s, %d read "
        "threads, %.0f B read per record)\n"
        "  absent:  %.0f ns per key (index probe only)\n"
        "  compact: half garbage, %.0f MB copied in %.2f s wall, %.2f CPU-s (%lld segments)\n"
        "  index:   %.1f B/key at %lld keys, %.1f B/key at %lld keys\n",
        rb, rb + 8, kBatch, kRecords * rb / 1e6 / put_wall, put_wall, put_cpu, files_after_put,
        kRecords / read_wall, read_wall, read_cpu, o.read_threads,
        static_cast<double>(after_read.read_bytes) / after_read.reads, absent_ns,
        c.compaction_bytes / 1e6, compact_wall, compact_cpu, static_cast<long long>(c.compactions),
        index_full, static_cast<long long>(after_put.rows),
        static_cast<double>(tier->index_bytes()) / c.rows, static_cast<long long>(c.rows));
  }
}

struct Test {
  const char* name;
  void (*run)();
  bool threaded;  // also run by --concurrency (the ThreadSanitizer build)
};
const Test kTests[] = {
    {"RoundTrip", TestRoundTrip, false},
    {"AbsentKeys", TestAbsentKeys, false},
    {"CorruptionDetected", TestCorruptionDetected, false},
    {"SegmentRolling", TestSegmentRolling, false},
    {"Compaction", TestCompaction, false},
    {"BackgroundCompaction", TestBackgroundCompaction, true},
    {"ReadPinsSegments", TestReadPinsSegments, true},
    {"PendingRecordsAreNotGarbage", TestPendingRecordsAreNotGarbage, false},
    {"Scans", TestScans, false},
    {"Open", TestOpen, false},
    {"DestructorLeavesNoFiles", TestDestructorLeavesNoFiles, false},
    {"DiskFull", TestDiskFull, false},
    {"IndexOutOfMemory", TestIndexOutOfMemory, false},
    {"PauseHook", TestPauseHook, false},
    {"Property", TestProperty, false},
    {"Concurrency", TestConcurrency, true},
};

}  // namespace

int main(int argc, char** argv) {
  const graphmod_test::ScratchDir scratch("log_tier_test");
  g_base = scratch.path();
  const std::string mode = argc > 1 ? argv[1] : "";
  int status;
  if (mode == "--bench") {
    Bench();
    status = graphmod_test::TestExit("log_tier_test --bench");
  } else {
    const bool concurrency = mode == "--concurrency";
    for (const Test& t : kTests) {
      if (concurrency && !t.threaded) continue;
      const double start = Now();
      t.run();
      if (concurrency && std::strcmp(t.name, "Concurrency") == 0) t.run();  // a second round
      std::printf("  %-28s %.2f s\n", t.name, Now() - start);
    }
    status = graphmod_test::TestExit(concurrency ? "log_tier_test --concurrency" : "log_tier_test");
  }
  return status;
}
