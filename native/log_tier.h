// LogTier: the disk store of one table shard, for rows spilled out of memory
// (issue 22, docs/notes/issue22_design.md section 3).
//
// A log-structured store of fixed-size records. Records are appended to the
// active segment file (`seg-<n>.log`); replacing or erasing a key leaves its
// old copy behind as garbage, and a background compactor copies the live
// records of a sealed segment that is mostly garbage into the active segment,
// then unlinks it. An in-memory cold index maps each key to its record's
// number (~14 bytes a key: native/cold_index.h); a record's scores
// (last_seen, count, version) are only in its header on disk. Each segment
// keeps bounds of its records' last_seen and version, so a time eviction or
// a delta reads only the segments that may hold what it looks for.
//
// The tier is scratch: checkpoints hold the durable rows, never these files.
// So there is no fsync, and the directory's segment files are wiped on Open
// (a crash leaves orphans; the restart restores the checkpoint and spills
// again).
//
// The parts, each with its own test: native/segment_file.h (a segment file
// on disk: its 64-byte header, records framed as [record | crc32c | pad],
// naming, whole preads/pwrites), native/cold_index.h (the cold index) and
// native/crc32c.h (the checksum). This file orchestrates them: appends,
// batched reads, erases, export, compaction, and the locks over them.
// The records are [RecordHeader | values | slots] (native/row_store.h); the
// tier reads only the header. A record number is slot * segment_records +
// index: `slot` is a small id of a segment alive now (reused once its
// segment is gone), `index` the record's place in it.
//
// Thread safety: every member may be called from any thread at any time,
// except the destructor (no call may be running or start). ForEachSince sees
// every live row exactly once when no Put/Erase runs meanwhile (the shard
// holds its lock over an export); with concurrent Put/Erase a row changed
// meanwhile may be missed or seen twice. Compaction waits for ForEachSince
// and the key scans.
//
// Environment, for crash tests (read at Open): GRAPHMOD_TIER_TEST_PAUSE, a
// comma list of pauses: "compact" makes each segment compaction sleep 2 s
// after its first batch of copies is written and before the index switches
// to them; "spill" makes each Put sleep 2 s after its records are written and
// before they are indexed. Each pause first prints "graphmod tier test pause:
// <name> <dir>" on stderr, so a test can SIGKILL the process there.
// GRAPHMOD_TIER_TEST_SEGMENT_BYTES sets segment_bytes (small segments fill,
// seal and compact in a small test).
#ifndef GRAPHMOD_NATIVE_LOG_TIER_H_
#define GRAPHMOD_NATIVE_LOG_TIER_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "native/cold_index.h"
#include "native/segment_file.h"
#include "native/thread_pool.h"

namespace graphmod {

struct TierOptions {
  std::string dir;        // <storage_path>/<table>/<shard>: created, wiped, locked (flock) on Open
  size_t record_bytes = 0;  // the shard's record stride (a multiple of 8, >= 24)
  size_t segment_bytes = size_t{64} << 20;
  int read_threads = 4;  // preads in flight per batched Read (the caller is one of them)
  double compact_garbage = 0.33;  // compact a sealed segment when this share of it is garbage
  // Whether a background thread compacts; off, only CompactNow does (tests).
  bool background_compaction = true;
};

struct TierCounters {
  int64_t rows = 0;
  int64_t file_bytes = 0;  // segment files, headers included (pinned retired ones too)
  int64_t live_bytes = 0;  // the live records' share of file_bytes
  int64_t reads = 0;       // records read by Read
  int64_t read_bytes = 0;  // bytes pread by Read (adjacent records are read together)
  int64_t read_passes = 0;  // Read calls that read at least one record
  int64_t writes = 0;       // records written by Put
  int64_t write_bytes = 0;  // bytes written by Put
  int64_t compactions = 0;  // segments compacted (and unlinked)
  int64_t compaction_bytes = 0;  // bytes compaction copied (write amplification)
  double compaction_seconds = 0;
};

class LogTier {
 public:
  // Creates (with parents), locks and wipes options.dir; nullptr and *error
  // (naming the directory and the system's reason) on failure.
  static std::unique_ptr<LogTier> Open(const TierOptions& options, std::string* error);
  // Stops the compactor and the read threads, closes and removes the segment
  // files, and removes the directory if that leaves it empty.
  ~LogTier();
  // Removes the segment files of dir and dir itself (if that leaves it
  // empty) when no LogTier holds it: what a killed process left. Returns
  // whether dir is gone.
  static bool RemoveIfUnused(const std::string& dir);
  LogTier(const LogTier&) = delete;
  LogTier& operator=(const LogTier&) = delete;

  // Appends n records (record_bytes each, RecordHeader first; the key is in
  // it), replacing older copies of the same keys (of a key given twice, the
  // later wins). The records are packed into one buffer and written with one
  // pwrite (one per segment when the batch spills into the next segment).
  // Returns "" or an error (disk full, ...); on error nothing visible changed:
  // the index still points at the old copies, and what was written is
  // garbage (the failed piece is truncated away).
  std::string Put(const char* records, size_t n);

  // Whether key is here (memory only).
  bool Contains(int64_t key) const;
  // found[i]: whether keys[i] is here, for n keys under one lock hold, the
  // index probes prefetched (a step's misses).
  void Contains(const int64_t* keys, size_t n, bool* found) const;

  // Reads n keys' records into out (n * record_bytes): sorted by (segment,
  // index), adjacent records read together, the preads spread over
  // read_threads threads; each record's crc32c is checked (a mismatch is an
  // error naming the key, the segment file and the offset). found[i] is false
  // for absent keys, whose out bytes are left alone. The segments read are
  // pinned (compaction cannot unlink them meanwhile). A record replaced while
  // the Read runs is read as it was when the Read looked it up. On error the
  // other records are still read; a failing record's out bytes are not
  // written (its found[i] is true).
  std::string Read(const int64_t* keys, size_t n, char* out, bool* found);

  // Forgets keys (promoted back to memory, or evicted): their records become
  // garbage. Returns how many were here.
  size_t Erase(const int64_t* keys, size_t n);

  // fn(key) for every live row, from memory (no disk reads), under the
  // tier's lock: fn must not call the tier.
  template <class Fn>
  void ForEachKey(Fn&& fn) const {
    std::lock_guard<std::mutex> lock(mu_);
    index_.ForEach([&](int64_t key, uint32_t) { fn(key); });
  }

  // The keys of the live rows last seen before `before` (a time eviction).
  // The scores are on disk only: this reads the segment files whose bounds
  // say they may hold such rows, as ForEachSince does. "" or the first
  // error (then *keys holds what was found before it).
  std::string KeysSeenBefore(int64_t before, std::vector<int64_t>* keys);

  // fn(record) for every live record (record_bytes, crc checked) with
  // version >= min_version (every one: min_version <= 0), in segment order:
  // sequential 1 MB preads of the segment files whose bounds admit such
  // records, so exporting a tier far bigger than memory reads its disk
  // once, in order. fn runs without the tier's lock (compaction waits
  // meanwhile, so fn must not call CompactNow, Clear or a scan) and returns
  // "" to go on or an error to stop with. Memory: one scan buffer (1 MB),
  // never the whole tier. Returns "" or the first error (the tier's or fn's).
  std::string ForEachSince(int64_t min_version,
                           const std::function<std::string(const char* record)>& fn);

  // Forgets every row; removes the segment files (a pinned one when its last
  // reader is done).
  void Clear();

  TierCounters counters() const;
  size_t index_bytes() const;  // memory the cold index holds (its mappings)
  size_t record_bytes() const { return record_bytes_; }
  // The last compaction failure ("" if none): a failed segment is retried
  // only once more of it has turned to garbage.
  std::string compaction_error() const;

  // Runs one compaction pass in the caller's thread: every sealed segment
  // whose garbage share is at least compact_garbage, most garbage first.
  void CompactNow();

  // Tests only, set while no other call runs. read_pinned: called by Read
  // after it pinned its segments and released the lock, before its preads.
  // put_appended: called by Put after its records are written (and pending),
  // before they are indexed; write_mu_ is held (a hook that compacts must
  // find nothing to copy).
  struct TestHooks {
    std::function<void()> read_pinned;
    std::function<void()> put_appended;
  };
  void SetTestHooks(TestHooks hooks) { hooks_ = std::move(hooks); }

 private:
  struct Segment;
  struct Piece {  // records of one Append that landed in one segment
    Segment* segment;
    uint32_t first_index;  // in the segment
    size_t first;          // in the appended buffer
    size_t n;
  };
  struct ReadRequest {
    Segment* segment;
    uint32_t index;
    uint32_t segment_number;
    size_t position;  // in keys/out
  };

  explicit LogTier(const TierOptions& options);
  std::string Init();

  // Writes n packed disk records (stride_ each) to the active segment(s).
  // Requires write_mu_. On success *pieces says where they went and each
  // piece's records are pending (written, not yet indexed); the caller must
  // index or abandon them (Settle). On failure earlier pieces are pending.
  std::string AppendLocked(const char* disk_records, size_t n, std::vector<Piece>* pieces);
  std::string NewSegmentLocked();  // requires write_mu_
  // The segment record number rec is in, and its index there.
  Segment* SegmentOfLocked(uint32_t rec) const;  // requires mu_
  uint32_t IndexOf(uint32_t rec) const { return rec % segment_records_; }
  // After Append: each piece's pending count drops (indexed or garbage now).
  void SettleLocked(const std::vector<Piece>& pieces);  // requires mu_
  void NoteGarbageLocked(Segment* s);                   // requires mu_
  // Marks s retired; moves it to *remove when no reader pins it.
  void RetireLocked(Segment* s, std::vector<std::unique_ptr<Segment>>* remove);
  // Takes s out of the segment table (its slot free again) into *remove.
  void DropLocked(Segment* s, std::vector<std::unique_ptr<Segment>>* remove);
  static void RemoveFiles(std::vector<std::unique_ptr<Segment>>* remove);

  // fn(record) for every live record of the segments `wanted` accepts
  // (called under mu_ with each segment's bounds), in segment order, crc
  // checked; fn runs without the tier's lock and returns "" or an error to
  // stop with. Holds compact_mu_ (no segment retires meanwhile).
  std::string ScanLive(const std::function<bool(const Segment&)>& wanted,
                       const std::function<std::string(const char* record)>& fn);
  std::string ReadPart(const int64_t* keys, const ReadRequest* r, size_t n, char* out,
                       std::vector<char>* scratch, int64_t* bytes);
  // Prefetches the index slots of the first keys of n scanned disk records.
  void PrefetchScan(const char* scan, size_t n) const;  // requires mu_
  Segment* PickCandidateLocked();
  void CompactSegment(Segment* s);
  void CompactorLoop();
  std::string SegmentPath(uint32_t number) const;
  uint64_t Offset(uint32_t index) const { return RecordOffset(stride_, index); }

  const TierOptions options_;
  const size_t record_bytes_;
  const size_t stride_;               // on disk: record + crc + pad
  const uint32_t segment_records_;    // records per segment
  const uint32_t max_slots_;          // segments alive at once: record numbers < 2^32 - 1
  bool pause_compact_ = false;        // GRAPHMOD_TIER_TEST_PAUSE=compact
  bool pause_spill_ = false;          // GRAPHMOD_TIER_TEST_PAUSE=spill
  void TestPause(const char* name) const;
  int dir_fd_ = -1;                   // holds the flock

  // Lock order: compact_mu_ (one compaction pass or export at a time), then
  // write_mu_ (appends to the active segment), then mu_ (index, segment
  // table, counters). Reads take only mu_, briefly, and never wait for disk
  // writes: appends hold write_mu_ over the pwrite and mu_ only to publish.
  std::mutex compact_mu_;
  std::mutex write_mu_;
  mutable std::mutex mu_;

  // Guarded by write_mu_:
  Segment* active_ = nullptr;  // also written under mu_ (Clear)
  uint32_t next_segment_ = 1;

  // Guarded by mu_:
  ColdIndex index_;
  std::map<uint32_t, std::unique_ptr<Segment>> segments_;  // by number
  std::vector<Segment*> by_slot_;     // nullptr: a free slot
  std::vector<uint32_t> free_slots_;
  uint64_t mutations_ = 0;  // index changes, so an export can tell it ran alone
  bool compact_wanted_ = false;
  std::condition_variable compact_cv_;
  int64_t writes_ = 0, write_bytes_ = 0, compactions_ = 0, compaction_bytes_ = 0;
  double compaction_seconds_ = 0;
  std::string compaction_error_;

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> reads_{0}, read_bytes_{0}, read_passes_{0};
  // The preads of one Read are split into parts; part 0 runs in the caller.
  std::unique_ptr<ThreadPool> pool_;
  std::thread compactor_;
  TestHooks hooks_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_LOG_TIER_H_
