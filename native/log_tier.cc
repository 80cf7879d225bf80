#include "native/log_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>

#include "native/bits.h"
#include "native/cold_index.h"
#include "native/row_store.h"
#include "native/segment_file.h"

namespace graphmod {

// ---------------------------------------------------------------- helpers

namespace {

int64_t LoadKey(const char* record) {
  int64_t k;
  std::memcpy(&k, record + offsetof(RecordHeader, key), 8);
  return k;
}

constexpr size_t kScanBytes = size_t{1} << 20;  // compaction / export read size
constexpr size_t kSwitchBatch = 4096;           // index entries switched per lock hold
constexpr size_t kMaxRunBytes = 256 << 10;      // adjacent records read by one pread
constexpr size_t kMinRecordsPerPart = 16;       // fewer are read by the caller alone
// At most this many records a segment, so that at least 64 segments can be
// alive at once within 32-bit record numbers (2 GB segments of 32 B records).
constexpr uint32_t kMaxSegmentRecords = uint32_t{1} << 26;

}  // namespace

// ---------------------------------------------------------------- segments

struct LogTier::Segment {
  uint32_t number = 0;  // in the file name; grows forever
  uint32_t slot = 0;    // reused: record numbers base + index
  uint32_t base = 0;    // slot * segment_records_
  int fd = -1;
  std::string path;
  // Guarded by mu_; `used` changes under write_mu_ too, so an appender may
  // read it holding only write_mu_:
  uint32_t used = 0;     // records written: live, pending or garbage
  uint32_t live = 0;     // records the index points at
  uint32_t pending = 0;  // written by an append whose index update is to come
  bool sealed = false;   // full: no more appends; may be compacted
  bool retired = false;  // compacted or cleared: removed once no Read pins it
  int pins = 0;          // Reads in flight on it
  uint32_t failed_garbage = 0;  // garbage at its last failed compaction
  // Bounds over every record written here (garbage too): a scan for rows
  // last seen before t, or changed since version v, skips a segment whose
  // bounds rule it out.
  int64_t min_last_seen = INT64_MAX;
  uint32_t max_version = 0;
  uint32_t garbage() const { return used - live - pending; }
};

// ---------------------------------------------------------------- open / close

LogTier::LogTier(const TierOptions& options)
    : options_(options),
      record_bytes_(options.record_bytes),
      stride_(DiskStride(options.record_bytes)),
      segment_records_(static_cast<uint32_t>(
          std::min<size_t>((options.segment_bytes - kSegmentHeaderBytes) /
                               DiskStride(options.record_bytes),
                           kMaxSegmentRecords))),
      max_slots_(ColdIndex::kEmpty / segment_records_) {}

std::unique_ptr<LogTier> LogTier::Open(const TierOptions& options, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error != nullptr) *error = "log tier '" + options.dir + "': " + why;
    return nullptr;
  };
  if (options.dir.empty()) return fail("no directory given");
  if (options.record_bytes < sizeof(RecordHeader) || options.record_bytes % 8 != 0 ||
      options.record_bytes > (size_t{1} << 30))
    return fail("record_bytes " + std::to_string(options.record_bytes) +
                " is not a multiple of 8 in [24, 2^30]");
  if (options.segment_bytes < kSegmentHeaderBytes + DiskStride(options.record_bytes))
    return fail("segment_bytes " + std::to_string(options.segment_bytes) +
                " holds no record of " + std::to_string(options.record_bytes) + " bytes");
  if (!(options.compact_garbage > 0 && options.compact_garbage <= 1))
    return fail("compact_garbage " + std::to_string(options.compact_garbage) + " is not in (0, 1]");
  TierOptions chosen = options;
  if (const char* bytes = std::getenv("GRAPHMOD_TIER_TEST_SEGMENT_BYTES"))
    chosen.segment_bytes = std::max<size_t>(std::strtoull(bytes, nullptr, 10),
                                            kSegmentHeaderBytes + DiskStride(options.record_bytes));
  std::unique_ptr<LogTier> tier(new LogTier(chosen));
  const std::string why = tier->Init();
  if (!why.empty()) return fail(why);
  return tier;
}

std::string LogTier::Init() {
  std::string e;
  int fd = -1;
  // Another process may remove the directory between its creation and the
  // lock (RemoveIfUnused takes an unlocked directory for an orphan): then
  // it is made again.
  for (int attempt = 0; fd < 0; ++attempt) {
    e = MakeDirs(options_.dir);
    if (!e.empty()) return e;
    fd = open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT && attempt < 8) continue;
      return "cannot open the directory: " + ErrnoText(errno);
    }
    // One tier per directory, across processes too (a second trainer
    // pointed at the same storage_path would wipe the first one's segments).
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      close(fd);
      if (err == EWOULDBLOCK) return "the directory is in use by another LogTier (flock)";
      return "cannot lock the directory: " + ErrnoText(err);
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_nlink == 0 && attempt < 8) {  // removed meanwhile
      close(fd);
      fd = -1;
    }
  }
  dir_fd_ = fd;  // from here on the directory is ours, and the destructor cleans it

  // Wipe the segments a previous run left (scratch; the checkpoint holds the
  // rows). Other files are left alone: the directory is ours, its other
  // contents might not be.
  std::vector<std::string> old;
  if (const int err = ListSegmentFiles(fd, &old))
    return "cannot list the directory: " + ErrnoText(err);
  for (const std::string& name : old)
    if (unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT)
      return "cannot remove the old segment '" + name + "': " + ErrnoText(errno);

  if (const char* pause = std::getenv("GRAPHMOD_TIER_TEST_PAUSE")) {
    const std::string list = std::string(",") + pause + ",";
    pause_compact_ = list.find(",compact,") != std::string::npos;
    pause_spill_ = list.find(",spill,") != std::string::npos;
  }

  // The first segment now, so an unwritable directory fails here, clearly,
  // not at the first spill.
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    e = NewSegmentLocked();
    if (!e.empty()) return e;
  }
  pool_ = std::make_unique<ThreadPool>(std::max(options_.read_threads, 1) - 1);
  if (options_.background_compaction) compactor_ = std::thread([this] { CompactorLoop(); });
  return "";
}

void LogTier::TestPause(const char* name) const {
  std::fprintf(stderr, "graphmod tier test pause: %s %s\n", name, options_.dir.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(2));
}

bool LogTier::RemoveIfUnused(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  // The flock goes with its process: one that can be taken has no owner.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return false;
  }
  std::vector<std::string> old;
  ListSegmentFiles(fd, &old);  // unlistable: nothing to remove; rmdir still tries
  for (const std::string& name : old) unlinkat(fd, name.c_str(), 0);
  const bool gone = rmdir(dir.c_str()) == 0;
  close(fd);
  return gone;
}

LogTier::~LogTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  compact_cv_.notify_all();
  if (compactor_.joinable()) compactor_.join();
  pool_.reset();
  if (dir_fd_ < 0) return;  // Open failed before the lock: the directory is not ours
  std::vector<std::unique_ptr<Segment>> remove;
  for (auto& kv : segments_) remove.push_back(std::move(kv.second));
  segments_.clear();
  RemoveFiles(&remove);
  // Only the shard's own directory, and only when empty: its parents
  // (storage_path/table) hold the other shards.
  rmdir(options_.dir.c_str());
  close(dir_fd_);  // releases the flock
}

std::string LogTier::SegmentPath(uint32_t number) const {
  return options_.dir + "/" + SegmentFileName(number);
}

std::string LogTier::NewSegmentLocked() {
  if (next_segment_ == UINT32_MAX) return "segment numbers exhausted";
  {
    // Only this function takes slots, under write_mu_: one free now stays free.
    std::lock_guard<std::mutex> lock(mu_);
    if (free_slots_.empty() && by_slot_.size() == max_slots_)
      return "record numbers exhausted: " + std::to_string(max_slots_) +
             " segment files of " + std::to_string(segment_records_) +
             " records are alive at once (the most 32-bit record numbers address; compaction "
             "reclaims garbage, or the disk holds more rows than one shard's tier can)";
    // Room for one more slot now, so that publishing it below cannot throw
    // (after its file exists), and in the free list for every slot, so that
    // freeing one (DropLocked, on paths that cannot fail) never allocates.
    try {
      by_slot_.reserve(by_slot_.size() + 1);
      free_slots_.reserve(by_slot_.size() + 1);
    } catch (const std::bad_alloc&) {
      return "no memory for the segment table";
    }
  }
  auto s = std::make_unique<Segment>();
  s->number = next_segment_++;
  s->path = SegmentPath(s->number);
  SegmentHeader header;
  header.record_bytes = static_cast<uint32_t>(record_bytes_);
  header.stride = static_cast<uint32_t>(stride_);
  header.number = s->number;
  const std::string e = CreateSegmentFile(s->path, header, &s->fd);
  if (!e.empty()) return e;
  // Reads are point reads at random: readahead would only fill the page
  // cache with neighbours nobody asked for.
  posix_fadvise(s->fd, 0, 0, POSIX_FADV_RANDOM);
  std::lock_guard<std::mutex> lock(mu_);
  if (free_slots_.empty()) {
    s->slot = static_cast<uint32_t>(by_slot_.size());
    by_slot_.push_back(s.get());
  } else {
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    by_slot_[s->slot] = s.get();
  }
  s->base = s->slot * segment_records_;
  active_ = s.get();
  segments_[s->number] = std::move(s);
  return "";
}

void LogTier::RemoveFiles(std::vector<std::unique_ptr<Segment>>* remove) {
  for (auto& s : *remove) {
    close(s->fd);
    unlink(s->path.c_str());  // scratch: a failure leaves an orphan the next Open wipes
  }
  remove->clear();
}

LogTier::Segment* LogTier::SegmentOfLocked(uint32_t rec) const {
  return by_slot_[rec / segment_records_];  // every index entry's segment is alive
}

void LogTier::RetireLocked(Segment* s, std::vector<std::unique_ptr<Segment>>* remove) {
  s->retired = true;
  if (s->pins == 0) DropLocked(s, remove);  // else the last Read to unpin it does
}

void LogTier::DropLocked(Segment* s, std::vector<std::unique_ptr<Segment>>* remove) {
  // No index entry points here (compacted empty, or cleared), and pinned
  // Reads hold the Segment, not record numbers: the slot can be reused.
  by_slot_[s->slot] = nullptr;
  free_slots_.push_back(s->slot);
  auto it = segments_.find(s->number);
  remove->push_back(std::move(it->second));
  segments_.erase(it);
}

// ---------------------------------------------------------------- writes

std::string LogTier::AppendLocked(const char* disk_records, size_t n, std::vector<Piece>* pieces) {
  pieces->clear();
  for (size_t done = 0; done < n;) {
    if (active_ == nullptr) {
      const std::string e = NewSegmentLocked();
      if (!e.empty()) return e;
    }
    Segment* s = active_;
    const size_t k = std::min<size_t>(n - done, segment_records_ - s->used);
    const uint64_t offset = Offset(s->used);
    const int err = PwriteAll(s->fd, disk_records + done * stride_, k * stride_, offset);
    if (err != 0) {
      // Give back the blocks a partial write took (a full disk needs them);
      // the range is beyond `used`, never read, and the next append
      // overwrites it anyway.
      while (ftruncate(s->fd, static_cast<off_t>(offset)) != 0 && errno == EINTR) {
      }
      return "cannot write " + std::to_string(k * stride_) + " bytes to '" + s->path +
             "' at offset " + std::to_string(offset) + ": " + ErrnoText(err);
    }
    bool sealed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = done; i < done + k; ++i) {
        const RecordHeader* h = Header(disk_records + i * stride_);
        s->min_last_seen = std::min(s->min_last_seen, h->last_seen);
        s->max_version = std::max(s->max_version, h->version);
      }
      s->used += static_cast<uint32_t>(k);
      s->pending += static_cast<uint32_t>(k);
      pieces->push_back(Piece{s, static_cast<uint32_t>(s->used - k), done, k});
      if (s->used == segment_records_) {
        s->sealed = sealed = true;
        active_ = nullptr;
      }
    }
    done += k;
  }
  return "";
}

void LogTier::SettleLocked(const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) {
    p.segment->pending -= static_cast<uint32_t>(p.n);
    NoteGarbageLocked(p.segment);
  }
}

void LogTier::NoteGarbageLocked(Segment* s) {
  if (!s->sealed || s->retired || s->pending != 0 || s->used == 0) return;
  const uint32_t garbage = s->garbage();
  if (garbage <= s->failed_garbage) return;
  if (garbage < options_.compact_garbage * s->used) return;
  if (!compact_wanted_) {
    compact_wanted_ = true;
    compact_cv_.notify_one();
  }
}

std::string LogTier::Put(const char* records, size_t n) {
  if (n == 0) return "";
  // Pack outside the locks: record | crc32c | zero pad.
  std::vector<char> disk(n * stride_);
  for (size_t i = 0; i < n; ++i)
    FrameRecord(records + i * record_bytes_, record_bytes_, disk.data() + i * stride_);
  std::lock_guard<std::mutex> write_lock(write_mu_);
  std::vector<Piece> pieces;
  const std::string e = AppendLocked(disk.data(), n, &pieces);
  if (hooks_.put_appended) hooks_.put_appended();
  if (pause_spill_ && e.empty()) TestPause("spill");  // written, not indexed
  std::lock_guard<std::mutex> lock(mu_);
  if (!e.empty()) {
    SettleLocked(pieces);  // written but never indexed: garbage
    return "log tier '" + options_.dir + "': " + e;
  }
  // Index first, counts after: an Upsert may run out of memory (the index
  // grows), and then the ones before it are undone, newest first (a key
  // given twice was added, then updated), so the index points at the old
  // copies again. Neither Relocate nor Erase allocates.
  struct Indexed {
    int64_t key;
    uint32_t rec, old;  // old: ColdIndex::kEmpty when the key was added
  };
  std::vector<Indexed> done;
  try {
    done.reserve(n);
    for (size_t i = 0; i < std::min(n, ColdIndex::kPrefetchAhead); ++i)
      index_.Prefetch(LoadKey(records + i * record_bytes_));
    for (const Piece& p : pieces) {
      for (size_t r = 0; r < p.n; ++r) {
        const size_t ahead = p.first + r + ColdIndex::kPrefetchAhead;
        if (ahead < n) index_.Prefetch(LoadKey(records + ahead * record_bytes_));
        Indexed x{LoadKey(records + (p.first + r) * record_bytes_),
                  p.segment->base + p.first_index + static_cast<uint32_t>(r), ColdIndex::kEmpty};
        index_.Upsert(x.key, x.rec, &x.old);  // (an added key leaves old alone)
        done.push_back(x);
      }
    }
  } catch (const std::bad_alloc&) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      if (it->old == ColdIndex::kEmpty)
        index_.Erase(it->key, nullptr);
      else
        index_.Relocate(it->key, it->rec, it->old);
    }
    SettleLocked(pieces);  // written but never indexed: garbage
    return "log tier '" + options_.dir + "': no memory to grow the cold index";
  }
  for (const Indexed& x : done) {
    if (x.old != ColdIndex::kEmpty) {
      Segment* old = SegmentOfLocked(x.old);
      --old->live;
      NoteGarbageLocked(old);
    }
    ++SegmentOfLocked(x.rec)->live;
  }
  SettleLocked(pieces);
  writes_ += static_cast<int64_t>(n);
  write_bytes_ += static_cast<int64_t>(n * stride_);
  ++mutations_;
  return "";
}

size_t LogTier::Erase(const int64_t* keys, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t erased = 0;
  for (size_t i = 0; i < std::min(n, ColdIndex::kPrefetchAhead); ++i) index_.Prefetch(keys[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + ColdIndex::kPrefetchAhead < n) index_.Prefetch(keys[i + ColdIndex::kPrefetchAhead]);
    uint32_t old;
    if (!index_.Erase(keys[i], &old)) continue;
    Segment* s = SegmentOfLocked(old);
    --s->live;
    NoteGarbageLocked(s);
    ++erased;
  }
  if (erased != 0) ++mutations_;
  return erased;
}

void LogTier::Clear() {
  std::lock_guard<std::mutex> pass(compact_mu_);
  std::lock_guard<std::mutex> write_lock(write_mu_);
  std::vector<std::unique_ptr<Segment>> remove;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index_.Clear();
    ++mutations_;
    active_ = nullptr;  // the next Put starts a new segment
    for (auto it = segments_.begin(); it != segments_.end();) {
      Segment* s = (it++)->second.get();  // (DropLocked erases s's entry)
      s->retired = true;
      if (s->pins == 0) DropLocked(s, &remove);
    }
  }
  RemoveFiles(&remove);
}

// ---------------------------------------------------------------- reads

bool LogTier::Contains(int64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Find(key, nullptr);
}

void LogTier::Contains(const int64_t* keys, size_t n, bool* found) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < std::min(n, ColdIndex::kPrefetchAhead); ++i) index_.Prefetch(keys[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + ColdIndex::kPrefetchAhead < n) index_.Prefetch(keys[i + ColdIndex::kPrefetchAhead]);
    found[i] = index_.Find(keys[i], nullptr);
  }
}

std::string LogTier::Read(const int64_t* keys, size_t n, char* out, bool* found) {
  std::vector<ReadRequest> req;
  req.reserve(n);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < std::min(n, ColdIndex::kPrefetchAhead); ++i) index_.Prefetch(keys[i]);
    for (size_t i = 0; i < n; ++i) {
      if (i + ColdIndex::kPrefetchAhead < n) index_.Prefetch(keys[i + ColdIndex::kPrefetchAhead]);
      uint32_t rec;
      found[i] = index_.Find(keys[i], &rec);
      if (!found[i]) continue;
      Segment* seg = SegmentOfLocked(rec);
      ++seg->pins;  // compaction may retire it now, but not unlink it
      req.push_back(ReadRequest{seg, IndexOf(rec), seg->number, i});
    }
  }
  if (req.empty()) return "";
  if (hooks_.read_pinned) hooks_.read_pinned();
  std::sort(req.begin(), req.end(), [](const ReadRequest& a, const ReadRequest& b) {
    return a.segment_number != b.segment_number ? a.segment_number < b.segment_number
                                                : a.index < b.index;
  });
  const size_t parts = std::max<size_t>(
      1, std::min<size_t>(std::max(options_.read_threads, 1), req.size() / kMinRecordsPerPart));
  std::vector<std::string> errors(parts);
  std::vector<int64_t> bytes(parts, 0);
  pool_->Run(parts, [&](size_t p) {
    const size_t begin = req.size() * p / parts, end = req.size() * (p + 1) / parts;
    std::vector<char> scratch;
    errors[p] = ReadPart(keys, req.data() + begin, end - begin, out, &scratch, &bytes[p]);
  });

  std::vector<std::unique_ptr<Segment>> remove;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < req.size();) {
      Segment* s = req[i].segment;
      size_t j = i;
      while (j < req.size() && req[j].segment == s) ++j;
      s->pins -= static_cast<int>(j - i);
      if (s->retired && s->pins == 0) RetireLocked(s, &remove);
      i = j;
    }
  }
  RemoveFiles(&remove);
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  reads_.fetch_add(static_cast<int64_t>(req.size()), std::memory_order_relaxed);
  read_bytes_.fetch_add(total, std::memory_order_relaxed);
  read_passes_.fetch_add(1, std::memory_order_relaxed);
  for (const std::string& e : errors)
    if (!e.empty()) return "log tier '" + options_.dir + "': " + e;
  return "";
}

std::string LogTier::ReadPart(const int64_t* keys, const ReadRequest* r, size_t n, char* out,
                              std::vector<char>* scratch, int64_t* bytes) {
  const uint32_t max_run = static_cast<uint32_t>(std::max<size_t>(1, kMaxRunBytes / stride_));
  std::string error;
  for (size_t i = 0; i < n;) {
    // A run: records of one segment at consecutive (or repeated) indices.
    const Segment* s = r[i].segment;
    const uint32_t first = r[i].index;
    uint32_t last = first;
    size_t j = i + 1;
    while (j < n && r[j].segment == s && r[j].index <= last + 1 && r[j].index - first < max_run)
      last = r[j++].index;
    const size_t len = (size_t{last} - first + 1) * stride_;
    if (scratch->size() < len) scratch->resize(len);
    const uint64_t offset = Offset(first);
    const int err = PreadAll(s->fd, scratch->data(), len, offset);
    if (err != 0) {
      if (error.empty())
        error = "cannot read '" + s->path + "' at offset " + std::to_string(offset) + ": " +
                ErrnoText(err);
      i = j;
      continue;
    }
    *bytes += static_cast<int64_t>(len);
    for (; i < j; ++i) {
      const char* rec = scratch->data() + size_t{r[i].index - first} * stride_;
      const int64_t key = keys[r[i].position];
      const uint64_t at = Offset(r[i].index);
      if (!RecordIntact(rec, record_bytes_)) {
        if (error.empty())
          error = "crc32c mismatch in the record of key " + std::to_string(key) + " in '" +
                  s->path + "' at offset " + std::to_string(at);
        continue;
      }
      if (LoadKey(rec) != key) {
        if (error.empty())
          error = "the record in '" + s->path + "' at offset " + std::to_string(at) +
                  " holds key " + std::to_string(LoadKey(rec)) + ", the index expects key " +
                  std::to_string(key);
        continue;
      }
      std::memcpy(out + r[i].position * record_bytes_, rec, record_bytes_);
    }
  }
  return error;
}

std::string LogTier::ForEachSince(int64_t min_version,
                                  const std::function<std::string(const char*)>& fn) {
  return ScanLive([&](const Segment& s) { return min_version <= 0 || s.max_version >= min_version; },
                  [&](const char* rec) {
                    return min_version <= 0 || Header(rec)->version >= min_version ? fn(rec) : "";
                  });
}

std::string LogTier::KeysSeenBefore(int64_t before, std::vector<int64_t>* keys) {
  return ScanLive([&](const Segment& s) { return s.min_last_seen < before; },
                  [&](const char* rec) {
                    if (Header(rec)->last_seen < before) keys->push_back(Header(rec)->key);
                    return std::string();
                  });
}

std::string LogTier::ScanLive(const std::function<bool(const Segment&)>& wanted,
                              const std::function<std::string(const char*)>& fn) {
  // Compaction and Clear wait (they take compact_mu_), so no segment listed
  // here is retired meanwhile and none needs a pin.
  std::lock_guard<std::mutex> pass(compact_mu_);
  std::vector<Segment*> segments;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : segments_)
      if (!kv.second->retired && wanted(*kv.second)) segments.push_back(kv.second.get());
  }
  const size_t batch = std::min(kSwitchBatch, std::max<size_t>(1, kScanBytes / stride_));
  std::vector<char> scan(batch * stride_);
  std::vector<char> live(batch);
  const std::string where = "log tier '" + options_.dir + "': ";
  for (Segment* s : segments) {
    uint32_t used;
    uint64_t mutations;
    {
      std::lock_guard<std::mutex> lock(mu_);
      used = s->used;
      mutations = mutations_;
    }
    uint32_t seen = 0;
    for (uint32_t b = 0; b < used;) {
      const uint32_t k = static_cast<uint32_t>(std::min<size_t>(batch, used - b));
      const int err = PreadAll(s->fd, scan.data(), k * stride_, Offset(b));
      if (err != 0)
        return where + "cannot read '" + s->path + "' at offset " + std::to_string(Offset(b)) +
               ": " + ErrnoText(err);
      DropCache(s->fd, Offset(b), k * stride_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        PrefetchScan(scan.data(), k);
        for (uint32_t j = 0; j < k; ++j) {
          if (j + ColdIndex::kPrefetchAhead < k)
            index_.Prefetch(LoadKey(scan.data() + (j + ColdIndex::kPrefetchAhead) * stride_));
          uint32_t rec;
          live[j] = index_.Find(LoadKey(scan.data() + size_t{j} * stride_), &rec) &&
                    rec == s->base + b + j;
        }
      }
      for (uint32_t j = 0; j < k; ++j) {
        if (!live[j]) continue;
        ++seen;
        const char* rec = scan.data() + size_t{j} * stride_;
        if (!RecordIntact(rec, record_bytes_))
          return where + "crc32c mismatch in the record of key " + std::to_string(LoadKey(rec)) +
                 " in '" + s->path + "' at offset " + std::to_string(Offset(b + j));
        const std::string stop = fn(rec);
        if (!stop.empty()) return stop;
      }
      b += k;
    }
    // A live record whose key bytes were corrupted is not recognised as live
    // above; the segment's live count tells (when nothing changed meanwhile).
    std::lock_guard<std::mutex> lock(mu_);
    if (mutations_ == mutations && seen != s->live)
      return where + "'" + s->path + "' holds " + std::to_string(s->live) +
             " live records, only " + std::to_string(seen) + " were found (corrupt keys)";
  }
  return "";
}

// ---------------------------------------------------------------- compaction

void LogTier::PrefetchScan(const char* scan, size_t n) const {
  for (size_t j = 0; j < std::min(n, ColdIndex::kPrefetchAhead); ++j)
    index_.Prefetch(LoadKey(scan + j * stride_));
}

LogTier::Segment* LogTier::PickCandidateLocked() {
  Segment* best = nullptr;
  double best_share = 0;
  for (auto& kv : segments_) {
    Segment* s = kv.second.get();
    // Pending records are written but not yet indexed: they would look like
    // garbage, so a segment with any waits for its appender.
    if (!s->sealed || s->retired || s->pending != 0 || s->used == 0) continue;
    const uint32_t garbage = s->garbage();
    if (garbage <= s->failed_garbage) continue;
    const double share = static_cast<double>(garbage) / s->used;
    if (share >= options_.compact_garbage && share > best_share) best = s, best_share = share;
  }
  return best;
}

void LogTier::CompactNow() {
  std::lock_guard<std::mutex> pass(compact_mu_);
  while (!stop_) {
    Segment* s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = PickCandidateLocked();
    }
    if (s == nullptr) return;
    CompactSegment(s);
  }
}

void LogTier::CompactorLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      compact_cv_.wait(lock, [&] { return stop_ || compact_wanted_; });
      if (stop_) return;
      compact_wanted_ = false;
    }
    CompactNow();
  }
}

// Copies s's live records to the active segment in batches: read a batch,
// pick its live records under the lock, append them (write_mu_, one pwrite),
// then switch their index entries under the lock, each only if it still
// points into s (a Put or Erase meanwhile makes the copy garbage). s is
// sealed, so it changes no more; it is unlinked once no Read pins it.
void LogTier::CompactSegment(Segment* s) {
  const auto start = std::chrono::steady_clock::now();
  uint32_t used;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used = s->used;
  }
  const size_t batch = std::min(kSwitchBatch, std::max<size_t>(1, kScanBytes / stride_));
  std::vector<char> scan(batch * stride_), copies(batch * stride_);
  std::vector<std::pair<int64_t, uint32_t>> moved;  // key, index in s
  std::vector<Piece> pieces;
  std::string error;
  bool paused = false;
  int64_t copied = 0;
  for (uint32_t b = 0; b < used && !stop_;) {
    const uint32_t k = static_cast<uint32_t>(std::min<size_t>(batch, used - b));
    const int err = PreadAll(s->fd, scan.data(), k * stride_, Offset(b));
    if (err != 0) {
      error = "cannot read '" + s->path + "' at offset " + std::to_string(Offset(b)) + ": " +
              ErrnoText(err);
      break;
    }
    DropCache(s->fd, Offset(b), k * stride_);
    moved.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      PrefetchScan(scan.data(), k);
      for (uint32_t j = 0; j < k; ++j) {
        if (j + ColdIndex::kPrefetchAhead < k)
          index_.Prefetch(LoadKey(scan.data() + (j + ColdIndex::kPrefetchAhead) * stride_));
        const char* rec = scan.data() + size_t{j} * stride_;
        uint32_t at;
        if (!index_.Find(LoadKey(rec), &at) || at != s->base + b + j) continue;
        std::memcpy(copies.data() + moved.size() * stride_, rec, stride_);  // crc and all
        moved.emplace_back(LoadKey(rec), b + j);
      }
    }
    b += k;
    if (moved.empty()) continue;
    {
      std::lock_guard<std::mutex> write_lock(write_mu_);
      error = AppendLocked(copies.data(), moved.size(), &pieces);
    }
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      SettleLocked(pieces);
      break;
    }
    copied += static_cast<int64_t>(moved.size() * stride_);
    if (pause_compact_ && !paused) {
      paused = true;  // copies written, index not switched
      TestPause("compact");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < std::min(moved.size(), ColdIndex::kPrefetchAhead); ++i)
      index_.Prefetch(moved[i].first);
    for (const Piece& p : pieces) {
      for (size_t r = 0; r < p.n; ++r) {
        if (p.first + r + ColdIndex::kPrefetchAhead < moved.size())
          index_.Prefetch(moved[p.first + r + ColdIndex::kPrefetchAhead].first);
        const auto& m = moved[p.first + r];
        // Only if no Put or Erase changed the key meanwhile (else the copy
        // is garbage).
        if (!index_.Relocate(m.first, s->base + m.second,
                             p.segment->base + p.first_index + static_cast<uint32_t>(r)))
          continue;
        --s->live;
        ++p.segment->live;
      }
    }
    SettleLocked(pieces);
    ++mutations_;
  }
  std::vector<std::unique_ptr<Segment>> remove;
  {
    std::lock_guard<std::mutex> lock(mu_);
    compaction_bytes_ += copied;
    compaction_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (error.empty() && !stop_ && s->live == 0) {
      ++compactions_;
      RetireLocked(s, &remove);
    } else if (!stop_) {
      if (error.empty())
        error = "'" + s->path + "' still holds " + std::to_string(s->live) +
                " live records after its compaction (corrupt keys)";
      compaction_error_ = "log tier '" + options_.dir + "': " + error;
      s->failed_garbage = s->garbage();  // retried once more of it is garbage
    }
  }
  RemoveFiles(&remove);
}

// ---------------------------------------------------------------- counters

TierCounters LogTier::counters() const {
  TierCounters c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.rows = static_cast<int64_t>(index_.size());
    for (const auto& kv : segments_) {
      c.file_bytes += static_cast<int64_t>(Offset(kv.second->used));
      c.live_bytes += static_cast<int64_t>(uint64_t{kv.second->live} * stride_);
    }
    c.writes = writes_;
    c.write_bytes = write_bytes_;
    c.compactions = compactions_;
    c.compaction_bytes = compaction_bytes_;
    c.compaction_seconds = compaction_seconds_;
  }
  c.reads = reads_.load(std::memory_order_relaxed);
  c.read_bytes = read_bytes_.load(std::memory_order_relaxed);
  c.read_passes = read_passes_.load(std::memory_order_relaxed);
  return c;
}

size_t LogTier::index_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.bytes();
}

std::string LogTier::compaction_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compaction_error_;
}

}  // namespace graphmod
