#include "native/table.h"

#include "native/bits.h"
#include "native/memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <unordered_map>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace graphmod {
namespace {

// ---------------------------------------------------------------- control bytes

constexpr int8_t kEmpty = -128;  // 0b10000000
constexpr int8_t kDeleted = -2;  // 0b11111110; full slots hold a 7-bit tag >= 0
// A group is one 64-byte cache line: 16 control bytes (12 slots and 4 unused,
// masked off) and the 12 slots' row numbers.
constexpr size_t kGroup = 12;
constexpr uint32_t kSlotMask = (1u << kGroup) - 1;

inline int8_t Tag(uint64_t h) { return static_cast<int8_t>(h & 0x7F); }

// The group where a key's probe starts: hash bits 7..38 (clear of the tag and
// of the shard bits) scaled onto [0, groups) by a multiply, so the index can
// have any number of groups and grow by 1.5x instead of doubling.
inline size_t HomeGroup(uint64_t h, size_t groups) {
  return static_cast<size_t>(((h >> 7) & 0xFFFFFFFFULL) * groups >> 32);
}
inline size_t NextGroup(size_t g, size_t groups) { return g + 1 == groups ? 0 : g + 1; }

// Bit i (i < kGroup) set when ctrl[i] == tag; reads the 16 control bytes.
inline uint32_t MatchTag(const int8_t* ctrl, int8_t tag) {
#if defined(__SSE2__)
  __m128i c = _mm_load_si128(reinterpret_cast<const __m128i*>(ctrl));
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(c, _mm_set1_epi8(tag)))) &
         kSlotMask;
#else
  uint32_t m = 0;
  for (size_t i = 0; i < kGroup; ++i) m |= static_cast<uint32_t>(ctrl[i] == tag) << i;
  return m;
#endif
}
// Bit i set when ctrl[i] is empty or deleted (the sign bit is set).
inline uint32_t MatchFree(const int8_t* ctrl) {
#if defined(__SSE2__)
  return static_cast<uint32_t>(
             _mm_movemask_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(ctrl)))) &
         kSlotMask;
#else
  uint32_t m = 0;
  for (size_t i = 0; i < kGroup; ++i) m |= static_cast<uint32_t>(ctrl[i] < 0) << i;
  return m;
#endif
}
inline uint32_t MatchEmpty(const int8_t* ctrl) { return MatchTag(ctrl, kEmpty); }

// ---------------------------------------------------------------- records

struct RecordHeader {
  int64_t key;
  int64_t last_seen;
  uint32_t count;
  uint32_t version;
};
static_assert(sizeof(RecordHeader) == 24, "record header must stay packed");

inline RecordHeader* Header(char* rec) { return reinterpret_cast<RecordHeader*>(rec); }
inline float* Values(char* rec) { return reinterpret_cast<float*>(rec + sizeof(RecordHeader)); }

// Row arena geometry: blocks of 64, 128, 256 rows, then 512 rows each:
// small tables stay small, and a table wastes at most one partly used block
// per shard.
constexpr int kFirstBlockBits = 6;
constexpr int kMaxBlockBits = 9;
constexpr int kGeometricBlocks = kMaxBlockBits - kFirstBlockBits;
constexpr uint64_t kGeometricRows = (1ULL << kMaxBlockBits) - (1ULL << kFirstBlockBits);

inline uint64_t BlockRows(size_t block) {
  return block < kGeometricBlocks ? (1ULL << (kFirstBlockBits + block)) : (1ULL << kMaxBlockBits);
}
inline void LocateRow(uint64_t row, size_t* block, uint64_t* offset) {
  if (row < kGeometricRows) {
    const int b = 63 - __builtin_clzll((row >> kFirstBlockBits) + 1);
    *block = b;
    *offset = row - ((1ULL << (b + kFirstBlockBits)) - (1ULL << kFirstBlockBits));
  } else {
    const uint64_t r = row - kGeometricRows;
    *block = kGeometricBlocks + (r >> kMaxBlockBits);
    *offset = r & ((1ULL << kMaxBlockBits) - 1);
  }
}

// Copies a row of d floats inline, in fixed-size blocks the compiler turns
// into vector moves (memcpy of a runtime size, which a plain loop also
// becomes, is a library call per row).
inline void CopyRow(float* __restrict dst, const float* __restrict src, int d) {
  int k = 0;
  for (; k + 8 <= d; k += 8) std::memcpy(dst + k, src + k, 8 * sizeof(float));
  if (k + 4 <= d) {
    std::memcpy(dst + k, src + k, 4 * sizeof(float));
    k += 4;
  }
  for (; k < d; ++k) std::memcpy(dst + k, src + k, sizeof(float));
}

}  // namespace

bool ParseCapacityPolicy(const std::string& name, CapacityPolicy* out) {
  if (name == "refuse") *out = CapacityPolicy::kRefuse;
  else if (name == "lru") *out = CapacityPolicy::kLru;
  else if (name == "lfu") *out = CapacityPolicy::kLfu;
  else return false;
  return true;
}

std::string ValidateConfig(const TableConfig& c) {
  if (c.dim <= 0) return "dim must be positive, got " + std::to_string(c.dim);
  if (c.dim > (1 << 20)) return "dim must be at most 1048576, got " + std::to_string(c.dim);
  if (c.num_slots < 0 || c.num_slots > 16)
    return "num_slots must be in [0, 16], got " + std::to_string(c.num_slots);
  if (static_cast<int>(c.slot_init.size()) != c.num_slots)
    return "slot_init has " + std::to_string(c.slot_init.size()) + " values for " +
           std::to_string(c.num_slots) + " slots";
  if (c.num_shards < 1 || c.num_shards > 4096 || (c.num_shards & (c.num_shards - 1)) != 0)
    return "num_shards must be a power of two in [1, 4096], got " + std::to_string(c.num_shards);
  if (c.sketch_width < 0 || c.sketch_width > (int64_t{1} << 32))
    return "sketch_width must be 0 (exact counting) or in [1, 2^32], got " +
           std::to_string(c.sketch_width);
  if (c.max_rows < -1 || c.max_rows == 0)
    return "max_rows must be positive or -1 (no bound), got " + std::to_string(c.max_rows);
  if (c.init == Initializer::kUniform && !(c.init_a < c.init_b))
    return "uniform initializer needs low < high, got [" + std::to_string(c.init_a) + ", " +
           std::to_string(c.init_b) + ")";
  if ((c.init == Initializer::kNormal || c.init == Initializer::kTruncatedNormal) &&
      !(c.init_b >= 0.f))
    return "normal initializer needs stddev >= 0, got " + std::to_string(c.init_b);
  return "";
}

void SerialRunner(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  if (n > 0) fn(0, n);
}

// ---------------------------------------------------------------- shard

struct EmbeddingTable::Shard {
  mutable std::mutex mu;
  // Index: `groups` groups of 12 slots, each group one cache line, so a
  // probe that ends in its first group touches one line of the index.
  struct alignas(64) Group {
    int8_t ctrl[16];
    uint32_t row[kGroup];
  };
  static_assert(sizeof(Group) == 64, "a group must fill exactly one cache line");
  Memory index_memory;
  Group* index = nullptr;
  size_t groups = 0;
  // Full slots == live rows. Written only under mu, read unlocked by size():
  // relaxed loads and stores suffice, and avoid a locked instruction (which
  // waits for the index store before it) on every insert.
  std::atomic<size_t> used{0};
  void AddUsed(int64_t k) { used.store(used.load(std::memory_order_relaxed) + k, std::memory_order_relaxed); }
  size_t deleted = 0;  // tombstones
  // Arena: rows [0, rows) have been handed out; freed ones wait in free_rows.
  // Blocks come from malloc until the shard holds a huge page of rows, then
  // are carved from 2 MB slabs.
  std::vector<char*> blocks;
  std::vector<Memory> slabs;  // owns the blocks' memory
  char* slab_cursor = nullptr;
  size_t slab_left = 0;
  size_t arena_bytes = 0;
  uint64_t rows = 0;
  uint64_t arena_rows = 0;  // rows the allocated blocks can hold
  std::vector<uint32_t> free_rows;
  // Per row, advanced when the row is freed (and for every row when the shard
  // is reset): a handle carries its row's generation (see kHandleRowBits).
  std::vector<uint8_t> generation;
  size_t stride = 0;
  // Bounded tables (max_rows >= 0) keep an exact table-wide row count, which
  // every insert reserves from; unbounded ones skip that shared counter.
  std::atomic<int64_t>* table_rows = nullptr;
  int64_t max_rows = -1;
  CapacityPolicy when_full = CapacityPolicy::kLru;
  // Keys counted towards admission that have no row yet. Only tables with an
  // access threshold fill it, with keys that are (so far) rare.
  struct Pending {
    uint32_t count;
    int64_t last_seen;
    int64_t version = 0;  // as a row's: the version of the step that last counted it
  };
  std::unordered_map<int64_t, Pending> pending;
  // Incremental checkpoints' tombstones: from TrackRemovals() on, every key
  // that loses its row or its pending count, with the table version then.
  bool track_removals = false;
  std::vector<std::pair<int64_t, int64_t>> removed;
  const std::atomic<int64_t>* table_version = nullptr;
  // And the rows whose version rose above `mark` (the version of the last
  // save a delta follows), each listed when it first does: a delta's export
  // reads these instead of every row. Rows freed since stay listed (the
  // export skips them); a row listed twice is exported once.
  std::vector<uint32_t> dirty;
  int64_t mark = 0;

  void NoteRemoved(int64_t key) {
    if (track_removals) removed.emplace_back(key, table_version->load(std::memory_order_relaxed));
  }
  // Before a row's version changes from old_version (a new row's is stale).
  void NoteChanged(uint32_t row, uint32_t old_version, bool added) {
    if (track_removals && (added || old_version <= mark)) dirty.push_back(row);
  }
  // Or, with TableConfig::sketch_width, a count-min sketch: kSketchRows rows
  // of sketch_cols counters; a key's count is the least of its counters.
  static constexpr int kSketchRows = 4;
  std::vector<uint32_t> sketch;
  size_t sketch_cols = 0;

  // One more sighting of the key with hash h; returns its estimated count.
  // Conservative update (only the counters at the minimum grow) keeps the
  // overestimate as small as count-min allows.
  uint64_t SketchAdd(uint64_t h) {
    uint32_t* cell[kSketchRows];
    uint32_t least = UINT32_MAX;
    for (int r = 0; r < kSketchRows; ++r) {
      const uint64_t hr = Mix(h + 0x9e3779b97f4a7c15ULL * (r + 1));
      cell[r] = &sketch[r * sketch_cols + hr % sketch_cols];
      least = std::min(least, *cell[r]);
    }
    const uint32_t next = AddCount(least, 1);
    for (uint32_t* c : cell) *c = std::max(*c, next);
    return next;
  }

  char* Record(uint64_t row) const {
    size_t block;
    uint64_t offset;
    LocateRow(row, &block, &offset);
    return blocks[block] + offset * stride;
  }
  int64_t KeyOf(uint32_t row) const { return Header(Record(row))->key; }
  int8_t& Ctrl(size_t slot) const { return index[slot / kGroup].ctrl[slot % kGroup]; }
  uint32_t& Row(size_t slot) const { return index[slot / kGroup].row[slot % kGroup]; }

  // Probes for key. Returns the slot holding it (found = true), or else the
  // first free slot of its probe sequence (valid only when the index has room).
  size_t Probe(int64_t key, uint64_t h, bool* found) const {
    *found = false;
    if (groups == 0) return 0;
    const int8_t tag = Tag(h);
    size_t g = HomeGroup(h, groups);
    size_t free_slot = SIZE_MAX;
    for (size_t step = 0; step < groups; ++step, g = NextGroup(g, groups)) {
      const int8_t* c = index[g].ctrl;
      for (uint32_t m = MatchTag(c, tag); m != 0; m &= m - 1) {
        const size_t slot = g * kGroup + __builtin_ctz(m);
        if (KeyOf(index[g].row[slot % kGroup]) == key) {
          *found = true;
          return slot;
        }
      }
      if (free_slot == SIZE_MAX) {
        const uint32_t f = MatchFree(c);
        if (f != 0) free_slot = g * kGroup + __builtin_ctz(f);
      }
      if (MatchEmpty(c) != 0) break;  // an empty byte ends every probe chain through here
    }
    return free_slot;
  }

  // Brings the key's first group into cache ahead of its probe.
  void PrefetchGroup(uint64_t h) const {
    if (groups == 0) return;
    __builtin_prefetch(&index[HomeGroup(h, groups)]);
  }

  // Prefetches the record of the first slot in the key's home group whose
  // tag matches (a false match, 12 in 128 at most, only wastes the prefetch).
  void PrefetchCandidate(uint64_t h) const {
    if (groups == 0) return;
    const Group& g = index[HomeGroup(h, groups)];
    const uint32_t m = MatchTag(g.ctrl, Tag(h));
    if (m != 0) __builtin_prefetch(Record(g.row[__builtin_ctz(m)]));
  }

  // Row of key, or kNoRow.
  static constexpr uint32_t kNoRow = 0xFFFFFFFFu;
  uint32_t FindRow(int64_t key, uint64_t h) const {
    bool found;
    const size_t slot = Probe(key, h, &found);
    return found ? Row(slot) : kNoRow;
  }

  // Rebuilds the index with room for at least `want` live rows at 7/8 load.
  // Keys are read from the arena in row order (sequential memory, unlike the
  // old index's slot order), and each key's new group is prefetched a few
  // rows before it is filled.
  void Rehash(size_t want) {
    const size_t new_groups = std::max<size_t>(1, (want * 8 + kGroup * 7 - 1) / (kGroup * 7));
    Memory fresh_memory = Allocate(new_groups * sizeof(Group));
    Group* fresh = reinterpret_cast<Group*>(fresh_memory.get());
    for (size_t g = 0; g < new_groups; ++g) std::memset(fresh[g].ctrl, kEmpty, sizeof(fresh[g].ctrl));
    std::vector<bool> dead;  // rows waiting on the free list hold stale keys
    if (!free_rows.empty()) {
      dead.assign(rows, false);
      for (uint32_t r : free_rows) dead[r] = true;
    }
    auto place = [&](uint32_t row, uint64_t h) {
      for (size_t g = HomeGroup(h, new_groups);; g = NextGroup(g, new_groups)) {
        const uint32_t f = MatchFree(fresh[g].ctrl);
        if (f != 0) {
          const int i = __builtin_ctz(f);
          fresh[g].ctrl[i] = Tag(h);
          fresh[g].row[i] = row;
          return;
        }
      }
    };
    constexpr size_t kAhead = 8;  // a ring of rows whose groups are being prefetched
    uint32_t ring_row[kAhead];
    uint64_t ring_hash[kAhead];
    size_t queued = 0;
    uint64_t row = 0;
    for (size_t b = 0; b < blocks.size() && row < rows; ++b) {
      const char* rec = blocks[b];
      for (uint64_t i = 0, n = BlockRows(b); i < n && row < rows; ++i, ++row, rec += stride) {
        if (!dead.empty() && dead[row]) continue;
        const uint64_t h = HashKey(reinterpret_cast<const RecordHeader*>(rec)->key);
        __builtin_prefetch(&fresh[HomeGroup(h, new_groups)], 1);
        const size_t at = queued++ % kAhead;
        if (queued > kAhead) place(ring_row[at], ring_hash[at]);
        ring_row[at] = static_cast<uint32_t>(row);
        ring_hash[at] = h;
      }
    }
    for (size_t k = queued > kAhead ? queued - kAhead : 0; k < queued; ++k)
      place(ring_row[k % kAhead], ring_hash[k % kAhead]);
    index_memory = std::move(fresh_memory);
    index = fresh;
    groups = new_groups;
    deleted = 0;
  }

  // Makes room for one more key once live rows and tombstones fill 7/8 of the
  // index: grows by 2x when live rows are most of it, else purges the
  // tombstones at about the same size.
  void ReserveOne() {
    const size_t capacity = groups * kGroup;
    if ((used + deleted + 1) * 8 <= capacity * 7) return;
    const size_t live = used + 1;
    Rehash(live * 2 > capacity * 7 / 8 ? std::max<size_t>(capacity * 2 * 7 / 8, live + kGroup)
                                       : live + live / 2);
  }

  // Makes room for n more keys at once. Import needs it: a checkpoint lists
  // keys in index order, and inserting them so into an index that grows as
  // they come piles each prefix into a few groups (probe chains as long as
  // the table; a 5M-key restore took 55 s instead of 3).
  void Reserve(size_t n) {
    if ((used + deleted + n) * 8 > groups * kGroup * 7) Rehash(used + n);
  }

  char* NewBlock(size_t bytes) {
    if (arena_bytes < kHugePage || bytes > kHugePage) {
      slabs.push_back(Allocate(bytes));
      arena_bytes += bytes;
      return slabs.back().get();
    }
    if (slab_left < bytes) {  // the rest of the old slab (< one block) stays unused
      slabs.push_back(Allocate(kHugePage));
      slab_cursor = slabs.back().get();
      slab_left = kHugePage;
      arena_bytes += kHugePage;
    }
    char* block = slab_cursor;
    slab_cursor += bytes;
    slab_left -= bytes;
    return block;
  }

  uint32_t AllocRow() {
    if (!free_rows.empty()) {
      const uint32_t row = free_rows.back();
      free_rows.pop_back();
      return row;
    }
    if (rows == arena_rows) {
      const uint64_t n = BlockRows(blocks.size());
      blocks.push_back(NewBlock(n * stride));
      arena_rows += n;
    }
    if (generation.size() <= rows) generation.resize(arena_rows, 0);
    return static_cast<uint32_t>(rows++);
  }

  // Adds absent key with a fresh (uninitialized) row at `slot`, the free slot
  // its probe returned; bounds are the caller's business.
  uint32_t Add(int64_t key, uint64_t h, size_t slot) {
    if ((used + deleted + 1) * 8 > groups * kGroup * 7) {
      ReserveOne();
      bool found;
      slot = Probe(key, h, &found);
    }
    if (Ctrl(slot) == kDeleted) --deleted;
    const uint32_t row = AllocRow();
    Ctrl(slot) = Tag(h);
    Row(slot) = row;
    AddUsed(1);
    Header(Record(row))->key = key;
    return row;
  }

  // A training lookup's insert of absent key. A bounded table at max_rows
  // first makes room per when_full (sparing rows this step looked up: see
  // EvictNear); returns kNoRow when it may not. *evicted tells whether a row
  // was evicted for it.
  uint32_t Insert(int64_t key, uint64_t h, size_t slot, int64_t now, uint32_t step_version,
                  bool* evicted) {
    *evicted = false;
    if (max_rows >= 0 && table_rows->fetch_add(1) >= max_rows) {
      if (when_full == CapacityPolicy::kRefuse || !EvictNear(h, now, step_version)) {
        table_rows->fetch_sub(1);
        return kNoRow;
      }
      *evicted = true;
    }
    return Add(key, h, slot);
  }

  // Import's insert: bounds are not enforced (a restore brings back every row).
  uint32_t FindOrAdd(int64_t key, uint64_t h, bool* added) {
    bool found;
    const size_t slot = Probe(key, h, &found);
    *added = !found;
    if (found) return Row(slot);
    if (max_rows >= 0) table_rows->fetch_add(1);
    return Add(key, h, slot);
  }

  // Sampled LRU/LFU, as Redis and HierarchicalKV do it: the victim is the
  // least recently (LRU) or least often (LFU) seen of the live rows in the
  // new key's home group and the groups after it (at least two groups and 8
  // candidates, at most 16 groups). Rows this step looked up are spared, as
  // its gradients may still reach them by handle: those stamped with the
  // current clock and the version of the step's coming Apply.
  bool EvictNear(uint64_t h, int64_t now, uint32_t step_version) {
    if (groups == 0) return false;
    const bool lru = when_full == CapacityPolicy::kLru;
    auto better_victim = [lru](const RecordHeader* a, const RecordHeader* b) {
      return lru ? (a->last_seen != b->last_seen ? a->last_seen < b->last_seen : a->count < b->count)
                 : (a->count != b->count ? a->count < b->count : a->last_seen < b->last_seen);
    };
    size_t victim = SIZE_MAX;
    const RecordHeader* worst = nullptr;
    int candidates = 0;
    size_t g = HomeGroup(h, groups);
    for (size_t step = 0; step < std::min<size_t>(groups, 16) && (step < 2 || candidates < 8);
         ++step, g = NextGroup(g, groups)) {
      for (size_t i = 0; i < kGroup; ++i) {
        if (index[g].ctrl[i] < 0) continue;
        const RecordHeader* r = Header(Record(index[g].row[i]));
        if (r->last_seen >= now && r->version >= step_version) continue;
        ++candidates;
        if (worst == nullptr || better_victim(r, worst)) {
          worst = r;
          victim = g * kGroup + i;
        }
      }
    }
    if (victim == SIZE_MAX) return false;
    Erase(victim);
    return true;
  }

  void Erase(size_t slot) {
    RecordHeader* h = Header(Record(Row(slot)));
    NoteRemoved(h->key);
    // Version 0 is below any delta's min_version: a delta's export skips a
    // freed row it finds among the changed ones without looking it up.
    h->version = 0;
    free_rows.push_back(Row(slot));
    ++generation[Row(slot)];
    Ctrl(slot) = kDeleted;  // a tombstone keeps probe chains through this group intact
    if (max_rows >= 0) table_rows->fetch_sub(1);
    AddUsed(-1);
    ++deleted;
  }

  void Reset() {
    if (track_removals) {
      for (size_t slot = 0; slot < groups * kGroup; ++slot)
        if (Ctrl(slot) >= 0) NoteRemoved(Header(Record(Row(slot)))->key);
      for (const auto& entry : pending) NoteRemoved(entry.first);
    }
    dirty.clear();
    index_memory.reset();
    index = nullptr;
    if (max_rows >= 0) table_rows->fetch_sub(static_cast<int64_t>(used));
    groups = used = deleted = 0;
    blocks.clear();
    slabs.clear();
    slab_cursor = nullptr;
    slab_left = arena_bytes = 0;
    rows = arena_rows = 0;
    free_rows.clear();
    free_rows.shrink_to_fit();
    for (uint8_t& g : generation) ++g;  // handles of the old rows are stale from now
    pending = {};
    std::fill(sketch.begin(), sketch.end(), 0u);
  }

  int64_t Bytes() const {
    // A pending key costs a hash node (key, count, last_seen, next pointer)
    // and a bucket pointer.
    constexpr size_t kPendingBytes = 40 + sizeof(void*);
    return static_cast<int64_t>(groups * sizeof(Group) + arena_bytes +
                                free_rows.capacity() * sizeof(uint32_t) +
                                generation.capacity() +
                                pending.size() * kPendingBytes +
                                sketch.size() * sizeof(uint32_t));
  }
};

// Ids of one batch grouped by shard: positions order[begin[s], begin[s+1])
// of the batch hold the ids that live in shard s; id[p] and hash[p] are the
// id at order[p] and its hash, stored in that same order so the per-shard
// passes read them sequentially (read through `order`, they were a cache
// miss per key on large batches).
struct EmbeddingTable::Batch {
  std::vector<int64_t> order;
  std::vector<int64_t> id;
  std::vector<uint64_t> hash;
  std::vector<int64_t> begin;
};

namespace {

// The distinct ids of a batch, in order of first appearance, and for each
// position the index of its id. Tables see each id of a batch once: a
// Zipf-distributed batch repeats its hot ids many times, and resolving each
// once (then copying rows out by position) costs one hash probe of a small,
// cache-resident map per repeat instead of a table probe.
struct Distinct {
  std::vector<int64_t> ids;
  std::vector<uint32_t> count;  // occurrences of ids[j]
  std::vector<uint32_t> index;  // per position: j of its id
  void Build(const int64_t* keys, int64_t n) {
    size_t cap = 16;
    while (cap < 2 * static_cast<size_t>(n)) cap *= 2;
    const int bits = __builtin_ctzll(cap);
    std::vector<uint32_t> slot(cap, kFree);
    ids.clear();
    count.clear();
    ids.reserve(n);
    count.reserve(n);
    index.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      size_t at = Mix(static_cast<uint64_t>(keys[i])) >> (64 - bits);
      for (;; at = (at + 1) & (cap - 1)) {
        const uint32_t j = slot[at];
        if (j == kFree) {
          slot[at] = static_cast<uint32_t>(ids.size());
          index[i] = static_cast<uint32_t>(ids.size());
          ids.push_back(keys[i]);
          count.push_back(1);
          break;
        }
        if (ids[j] == keys[i]) {
          index[i] = j;
          ++count[j];
          break;
        }
      }
    }
  }

 private:
  static constexpr uint32_t kFree = ~0u;
};

}  // namespace

EmbeddingTable::EmbeddingTable(TableConfig config) : config_(std::move(config)) {
  shard_bits_ = 0;
  while ((1 << shard_bits_) < config_.num_shards) ++shard_bits_;
  const size_t bytes =
      sizeof(RecordHeader) + sizeof(float) * config_.dim * (1 + config_.num_slots);
  stride_ = (bytes + 7) & ~size_t{7};  // keeps the int64 header aligned
  for (int i = 0; i < config_.num_shards; ++i) {
    shards_.emplace_back(new Shard);
    shards_.back()->stride = stride_;
    shards_.back()->table_rows = &rows_;
    shards_.back()->table_version = &version_;
    shards_.back()->max_rows = config_.max_rows;
    shards_.back()->when_full = config_.when_full;
    if (config_.sketch_width > 0) {
      Shard& shard = *shards_.back();
      shard.sketch_cols = std::max<size_t>(1, config_.sketch_width / config_.num_shards);
      shard.sketch.assign(Shard::kSketchRows * shard.sketch_cols, 0u);
    }
  }
}

EmbeddingTable::~EmbeddingTable() = default;

int64_t EmbeddingTable::size() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s->used.load(std::memory_order_relaxed);
  return n;
}

int64_t EmbeddingTable::memory_bytes() const {
  int64_t n = 0;
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    n += s->Bytes();
  }
  return n;
}

void EmbeddingTable::MissingRow(int64_t key, float* out) const {
  if (config_.missing_is_initializer) {
    InitialRow(key, out);
  } else {
    std::fill(out, out + config_.dim, config_.default_value);
  }
}

void EmbeddingTable::InitialRow(int64_t key, float* out) const {
  InitialValues({config_.init, config_.init_a, config_.init_b, config_.seed}, key, out,
                config_.dim);
}

EmbeddingTable::Batch EmbeddingTable::Partition(const int64_t* ids, int64_t n,
                                                bool ids_are_handles,
                                                const Runner& run) const {
  Batch batch;
  const int64_t shards = config_.num_shards;
  // One bucket per shard, and a last one for negative handles (lookups that
  // got no row), which no shard processes.
  const int64_t buckets = shards + 1;
  batch.order.resize(n);
  batch.id.resize(n);
  batch.hash.resize(ids_are_handles ? 0 : n);
  batch.begin.assign(buckets + 1, 0);
  // Two-pass counting sort, each pass split over chunks that may run in
  // parallel; the second pass hashes again rather than keep a third array.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(16, n / 8192));
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  std::vector<int64_t> counts(chunks * buckets, 0);
  const int shift = 64 - shard_bits_;
  auto bucket_of = [&](int64_t id, uint64_t h) -> int64_t {
    if (ids_are_handles) return id < 0 ? shards : id >> kHandleShardShift;
    return shard_bits_ == 0 ? 0 : static_cast<int64_t>(h >> shift);
  };
  run(chunks, per_chunk * 10, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* count = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i)
        ++count[bucket_of(ids[i], ids_are_handles ? 0 : HashKey(ids[i]))];
    }
  });
  int64_t pos = 0;
  for (int64_t s = 0; s < buckets; ++s) {
    batch.begin[s] = pos;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k = counts[c * buckets + s];
      counts[c * buckets + s] = pos;
      pos += k;
    }
  }
  batch.begin[buckets] = pos;
  run(chunks, per_chunk * 15, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t* next = &counts[c * buckets];
      for (int64_t i = c * per_chunk, e = std::min(n, (c + 1) * per_chunk); i < e; ++i) {
        const uint64_t h = ids_are_handles ? 0 : HashKey(ids[i]);
        const int64_t p = next[bucket_of(ids[i], h)]++;
        batch.order[p] = i;
        batch.id[p] = ids[i];
        if (!ids_are_handles) batch.hash[p] = h;
      }
    }
  });
  return batch;
}

// Lookups are pipelined over three stages so a batch of cold keys waits on
// many cache misses at once instead of one after another: the group of key
// p + 2*kAhead is prefetched; the group of key p + kAhead (now cached) is
// scanned for the key's tag and the first candidate record prefetched; key p
// is then probed for real, with its group and record already in cache.
constexpr int64_t kAhead = 8;

template <typename Fn>
void EmbeddingTable::ForEachResolved(const Shard& shard, const Batch& batch, int64_t s,
                                     Fn&& fn) const {
  const int64_t b = batch.begin[s], e = batch.begin[s + 1];
  const uint64_t* hash = batch.hash.data();
  for (int64_t p = b; p < std::min(e, b + 2 * kAhead); ++p) shard.PrefetchGroup(hash[p]);
  for (int64_t p = b; p < std::min(e, b + kAhead); ++p) shard.PrefetchCandidate(hash[p]);
  for (int64_t p = b; p < e; ++p) {
    if (p + 2 * kAhead < e) shard.PrefetchGroup(hash[p + 2 * kAhead]);
    if (p + kAhead < e) shard.PrefetchCandidate(hash[p + kAhead]);
    bool found;
    const size_t slot = shard.Probe(batch.id[p], hash[p], &found);
    fn(p, found ? shard.Row(slot) : Shard::kNoRow, slot);
  }
}

void EmbeddingTable::AdvanceLatest(int64_t now) {
  for (int64_t seen = latest_.load(); now > seen && !latest_.compare_exchange_weak(seen, now);) {
  }
}

TableCounters EmbeddingTable::counters() const {
  TableCounters c;
  c.rows = size();
  c.admitted = admitted_.load();
  c.rejected = rejected_.load();
  c.evicted = evicted_.load();
  c.latest = latest_.load();
  c.stale = stale_.load();
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    c.pending += static_cast<int64_t>(s->pending.size());
  }
  return c;
}

void EmbeddingTable::FindOrInsert(const int64_t* keys, int64_t n, int64_t now,
                                  int64_t access_threshold, float* values, int64_t* handles,
                                  const Runner& run) {
  if (n == 0) return;
  AdvanceLatest(now);
  Distinct distinct;
  distinct.Build(keys, n);
  const int64_t u = static_cast<int64_t>(distinct.ids.size());
  const Batch batch = Partition(distinct.ids.data(), u, false, run);
  const int d = config_.dim, slots = config_.num_slots;
  const uint64_t threshold = static_cast<uint64_t>(std::max<int64_t>(access_threshold, 1));
  // Per distinct id: its row's values and handle, and how many of its first
  // occurrences were refused a row (not admitted yet, or no room).
  std::unique_ptr<float[]> rows(new float[u * d]);  // every entry is written before it is read
  std::unique_ptr<int64_t[]> found(new int64_t[u]);
  std::vector<uint32_t> refused(u, 0);
  std::atomic<bool> any_refused{false};
  // Rows looked up carry the version the next Apply will stamp: an
  // incremental export of "everything after version v" includes rows
  // inserted (or counted, or stamped) after v, and a full table spares them.
  const int64_t version = version_.load() + 1;
  const int64_t per_shard = u / config_.num_shards + 1;
  run(config_.num_shards, per_shard * 150, [&](int64_t s0, int64_t s1) {
    int64_t admitted = 0, rejected = 0, evicted = 0;
    for (int64_t s = s0; s < s1; ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      ForEachResolved(shard, batch, s, [&](int64_t p, uint32_t row, size_t slot) {
        const int64_t j = batch.order[p], key = batch.id[p];
        const uint32_t occurrences = distinct.count[j];
        // Sightings the row's access count gets: every occurrence, plus
        // those counted while the key waited for admission.
        uint64_t sightings = occurrences;
        bool added = false;
        if (row == Shard::kNoRow) {
          // Occurrence by occurrence, as separate lookups would: each is one
          // more sighting, and the threshold-th gets the row.
          Shard::Pending* pending = nullptr;
          uint32_t k = 0;
          for (; k < occurrences && row == Shard::kNoRow; ++k) {
            uint64_t seen = 1;
            if (access_threshold > 1 && !shard.sketch.empty()) {
              seen = shard.SketchAdd(batch.hash[p]);
            } else if (access_threshold > 1) {
              if (pending == nullptr)
                pending = &shard.pending.try_emplace(key, Shard::Pending{0, now}).first->second;
              seen = AddCount(pending->count, 1);
              pending->count = static_cast<uint32_t>(seen);
              pending->last_seen = std::max(pending->last_seen, now);
              pending->version = version;
            }
            if (seen < threshold) continue;
            bool made_room = false;
            row = shard.Insert(key, batch.hash[p], slot, now, static_cast<uint32_t>(version),
                               &made_room);
            if (row == Shard::kNoRow) continue;  // no room: refused, as is the next try
            evicted += made_room;
            sightings = seen + (occurrences - k - 1);
          }
          if (row == Shard::kNoRow) {  // every occurrence refused: no row, no gradient
            refused[j] = occurrences;
            rejected += occurrences;
            any_refused = true;
            return;
          }
          if (k > 1) {
            refused[j] = k - 1;
            rejected += k - 1;
            any_refused = true;
          }
          if (pending != nullptr) shard.pending.erase(key);
          added = true;
          ++admitted;
        }
        char* rec = shard.Record(row);
        RecordHeader* h = Header(rec);
        if (added) {
          InitialRow(key, Values(rec));
          float* slot_row = Values(rec) + d;
          for (int k = 0; k < slots; ++k, slot_row += d)
            std::fill(slot_row, slot_row + d, config_.slot_init[k]);
          h->count = 0;
          h->last_seen = now;
        }
        h->count = AddCount(h->count, sightings);
        h->last_seen = std::max(h->last_seen, now);  // batches may come out of time order
        shard.NoteChanged(row, h->version, added);
        h->version = static_cast<uint32_t>(version);
        CopyRow(rows.get() + j * d, Values(rec), d);
        found[j] = (s << kHandleShardShift) |
                   (static_cast<int64_t>(shard.generation[row]) << kHandleRowBits) | row;
      });
    }
    admitted_ += admitted;
    rejected_ += rejected;
    evicted_ += evicted;
  });
  // Rows out by position. An id refused its first occurrences reads the
  // missing value (handle -1) there and its row from then on.
  if (any_refused) {
    std::vector<uint32_t> seen(u, 0);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t j = distinct.index[i];
      if (seen[j]++ < refused[j]) {
        MissingRow(keys[i], values + i * d);
        if (handles != nullptr) handles[i] = -1;
      } else {
        CopyRow(values + i * d, rows.get() + j * d, d);
        if (handles != nullptr) handles[i] = found[j];
      }
    }
    return;
  }
  run(n, 4 * d + 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint32_t j = distinct.index[i];
      CopyRow(values + i * d, rows.get() + j * d, d);
      if (handles != nullptr) handles[i] = found[j];
    }
  });
}

void EmbeddingTable::Find(const int64_t* keys, int64_t n, float* values,
                          const Runner& run) const {
  if (n == 0) return;
  Distinct distinct;
  distinct.Build(keys, n);
  const int64_t u = static_cast<int64_t>(distinct.ids.size());
  const Batch batch = Partition(distinct.ids.data(), u, false, run);
  const int d = config_.dim;
  std::unique_ptr<float[]> rows(new float[u * d]);  // every row is written before it is read
  const int64_t per_shard = u / config_.num_shards + 1;
  run(config_.num_shards, per_shard * 100, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      ForEachResolved(shard, batch, s, [&](int64_t p, uint32_t row, size_t) {
        float* out = rows.get() + batch.order[p] * d;
        if (row != Shard::kNoRow) {
          CopyRow(out, Values(shard.Record(row)), d);
        } else {
          MissingRow(batch.id[p], out);
        }
      });
    }
  });
  run(n, 4 * d + 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      CopyRow(values + i * d, rows.get() + distinct.index[i] * d, d);
  });
}

namespace {

// The rows one shard's part of a batch updates, in order of first appearance,
// each with its gradient: a pointer into the batch for a row seen once, the
// sum (in batch order) for a row seen more often. A small open-addressing
// index keeps grouping linear in the batch (sorting was a tenth of a step).
class RowGroups {
 public:
  void Reset(int64_t n, int d) {
    d_ = d;
    size_t cap = 16;
    while (cap < 2 * static_cast<size_t>(n)) cap *= 2;
    bits_ = __builtin_ctzll(cap);
    index_.assign(cap, kFree);
    rows_.clear();
    grads_.clear();
    sums_.clear();
  }
  void Add(uint32_t row, const float* grad) {
    size_t at = (row * 0x9E3779B1u) >> (32 - bits_);
    const size_t mask = index_.size() - 1;
    for (; index_[at] != kFree; at = (at + 1) & mask) {
      const uint32_t k = index_[at];
      if (rows_[k] != row) continue;
      if (grads_[k].sum < 0) {  // second sighting: start a sum
        grads_[k].sum = static_cast<int64_t>(sums_.size());
        sums_.insert(sums_.end(), grads_[k].first, grads_[k].first + d_);
      }
      float* sum = sums_.data() + grads_[k].sum;
      for (int j = 0; j < d_; ++j) sum[j] += grad[j];
      return;
    }
    index_[at] = static_cast<uint32_t>(rows_.size());
    rows_.push_back(row);
    grads_.push_back({grad, -1});
  }
  size_t size() const { return rows_.size(); }
  uint32_t row(size_t k) const { return rows_[k]; }
  const float* grad(size_t k) const {
    return grads_[k].sum < 0 ? grads_[k].first : sums_.data() + grads_[k].sum;
  }

 private:
  static constexpr uint32_t kFree = ~0u;
  struct Grad {
    const float* first;
    int64_t sum;  // offset in sums_, -1 while the row was seen once
  };
  int d_ = 0, bits_ = 4;
  std::vector<uint32_t> index_;  // position in rows_, or kFree
  std::vector<uint32_t> rows_;
  std::vector<Grad> grads_;
  std::vector<float> sums_;
};

}  // namespace

std::string EmbeddingTable::CheckApply(const Optimizer& opt, const int64_t* ids,
                                       bool ids_are_handles, int64_t n) const {
  if (SlotsNeeded(opt.kind) > config_.num_slots)
    return "the optimizer needs " + std::to_string(SlotsNeeded(opt.kind)) +
           " slot rows per key but the table was created with " +
           std::to_string(config_.num_slots);
  if (!ids_are_handles) return "";
  // A row beyond those a shard ever handed out can only come from elsewhere
  // (a reset shard's old handles are stale instead: its generations
  // advanced). Shards never shrink, so their sizes now bound every handle
  // given out so far.
  std::vector<uint64_t> handed_out(config_.num_shards);
  for (int s = 0; s < config_.num_shards; ++s) {
    std::lock_guard<std::mutex> lock(shards_[s]->mu);
    handed_out[s] = shards_[s]->generation.size();
  }
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0) continue;  // a lookup that got no row
    const uint64_t shard = static_cast<uint64_t>(ids[i]) >> kHandleShardShift;
    const uint64_t row = ids[i] & ((1ULL << kHandleRowBits) - 1);
    if (shard >= static_cast<uint64_t>(config_.num_shards) || row >= handed_out[shard])
      return "row handle " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
             " does not belong to this table";
  }
  return "";
}

std::string EmbeddingTable::Apply(const Optimizer& opt, const int64_t* ids,
                                  bool ids_are_handles, const float* grads, int64_t n,
                                  const Runner& run) {
  // Every id is checked before any row changes, so a bad one updates nothing.
  const std::string error = CheckApply(opt, ids, ids_are_handles, n);
  if (!error.empty()) return error;
  const Batch batch = Partition(ids, n, ids_are_handles, run);
  const uint32_t version = static_cast<uint32_t>(++version_);
  if (n == 0) return "";
  const int d = config_.dim;
  std::atomic<int64_t> stale{0};
  const int64_t per_shard = n / config_.num_shards + 1;
  run(config_.num_shards, per_shard * (200 + 10 * d), [&](int64_t s0, int64_t s1) {
    RowGroups groups;
    for (int64_t s = s0; s < s1; ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      groups.Reset(batch.begin[s + 1] - batch.begin[s], d);
      int64_t dropped = 0;
      if (ids_are_handles) {
        for (int64_t p = batch.begin[s]; p < batch.begin[s + 1]; ++p) {
          const int64_t id = batch.id[p];
          const uint64_t row = id & ((1ULL << kHandleRowBits) - 1);
          const uint8_t gen = static_cast<uint8_t>(id >> kHandleRowBits);
          // Freed since the lookup (removed, evicted, cleared): another key
          // may hold the row now.
          if (row >= shard.rows || shard.generation[row] != gen) {
            ++dropped;
            continue;
          }
          groups.Add(static_cast<uint32_t>(row), grads + batch.order[p] * d);
        }
      } else {  // keys, resolved with the lookups' prefetching pipeline
        ForEachResolved(shard, batch, s, [&](int64_t p, uint32_t row, size_t) {
          if (row != Shard::kNoRow) groups.Add(row, grads + batch.order[p] * d);
        });
      }
      stale += dropped;
      // Each row is updated once, with the sum of its gradients (what TF's
      // sparse apply does); records are prefetched a few rows ahead.
      constexpr size_t kAhead = 4;
      const size_t rows = groups.size();
      for (size_t k = 0; k < std::min(kAhead, rows); ++k)
        __builtin_prefetch(shard.Record(groups.row(k)), 1);
      for (size_t k = 0; k < rows; ++k) {
        if (k + kAhead < rows) __builtin_prefetch(shard.Record(groups.row(k + kAhead)), 1);
        char* rec = shard.Record(groups.row(k));
        UpdateRow(opt, Values(rec), Values(rec) + d, groups.grad(k), d);
        shard.NoteChanged(groups.row(k), Header(rec)->version, false);
        Header(rec)->version = version;
      }
    }
  });
  stale_ += stale.load();
  return "";
}

int64_t EmbeddingTable::Remove(const int64_t* keys, int64_t n) {
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = HashKey(keys[i]);
    Shard& shard = *shards_[shard_bits_ == 0 ? 0 : h >> (64 - shard_bits_)];
    std::lock_guard<std::mutex> lock(shard.mu);
    bool found;
    const size_t slot = shard.Probe(keys[i], h, &found);
    if (found) {
      shard.Erase(slot);
      ++removed;
    } else if (shard.pending.erase(keys[i]) > 0) {
      shard.NoteRemoved(keys[i]);  // its admission count starts over too
    }
  }
  return removed;
}

int64_t EmbeddingTable::Evict(int64_t before) {
  int64_t removed = 0;
  for (auto& sp : shards_) {
    Shard& shard = *sp;
    std::lock_guard<std::mutex> lock(shard.mu);
    constexpr size_t kPrefetch = 16;  // records are scattered: overlap their misses
    const size_t slots = shard.groups * kGroup;
    for (size_t slot = 0; slot < slots; ++slot) {
      if (slot + kPrefetch < slots && shard.Ctrl(slot + kPrefetch) >= 0)
        __builtin_prefetch(shard.Record(shard.Row(slot + kPrefetch)));
      if (shard.Ctrl(slot) < 0 || Header(shard.Record(shard.Row(slot)))->last_seen >= before)
        continue;
      shard.Erase(slot);
      ++removed;
    }
    for (auto it = shard.pending.begin(); it != shard.pending.end();) {
      if (it->second.last_seen >= before) {
        ++it;
        continue;
      }
      shard.NoteRemoved(it->first);
      it = shard.pending.erase(it);
    }
    for (uint32_t& c : shard.sketch) c >>= 1;
  }
  evicted_ += removed;
  return removed;
}

void EmbeddingTable::Clear() {
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->Reset();
  }
}

std::vector<uint32_t> EmbeddingTable::PickRows(const Shard& s, int64_t min_version) const {
  // Live rows with version >= min_version. A shard tracking changes since a
  // mark below min_version finds them among its changed rows (a delta costs
  // what changed, not the table); those freed since have version 0 (Erase),
  // and a row freed and reused holds its new key.
  std::vector<uint32_t> rows;
  if (s.track_removals && min_version > s.mark) {
    rows = s.dirty;
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](uint32_t row) {
                 return Header(s.Record(row))->version < min_version;
               }),
               rows.end());
  } else {
    for (size_t slot = 0; slot < s.groups * kGroup; ++slot)
      if (s.Ctrl(slot) >= 0 && Header(s.Record(s.Row(slot)))->version >= min_version)
        rows.push_back(s.Row(slot));
  }
  return rows;
}

std::pair<size_t, size_t> EmbeddingTable::ShardRange(int shard) const {
  if (shard < 0) return {0, shards_.size()};
  return {static_cast<size_t>(shard), static_cast<size_t>(shard) + 1};
}

int64_t EmbeddingTable::CountRows(int64_t min_version, int shard) const {
  int64_t n = 0;
  const auto [s0, s1] = ShardRange(shard);
  for (size_t si = s0; si < s1; ++si) {
    std::lock_guard<std::mutex> lock(shards_[si]->mu);
    // Every live row has a version >= 0: no need to visit them.
    n += min_version <= 0 ? static_cast<int64_t>(shards_[si]->used.load())
                          : static_cast<int64_t>(PickRows(*shards_[si], min_version).size());
  }
  return n;
}

void EmbeddingTable::Export(int64_t min_version,
                            const std::function<ExportBuffers(int64_t n)>& alloc,
                            int shard) const {
  // The locks of every shard read are held so the count and the rows agree.
  const auto [s0, s1] = ShardRange(shard);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (size_t si = s0; si < s1; ++si) locks.emplace_back(shards_[si]->mu);
  std::vector<std::vector<uint32_t>> picked;
  int64_t n = 0;
  for (size_t si = s0; si < s1; ++si) {
    picked.push_back(PickRows(*shards_[si], min_version));
    n += static_cast<int64_t>(picked.back().size());
  }
  const ExportBuffers out = alloc(n);
  const int d = config_.dim, slot_floats = config_.num_slots * config_.dim;
  int64_t i = 0;
  for (size_t si = s0; si < s1; ++si) {
    const Shard* s = shards_[si].get();
    for (uint32_t row : picked[si - s0]) {
      char* rec = s->Record(row);
      const RecordHeader* h = Header(rec);
      if (out.keys) out.keys[i] = h->key;
      if (out.values) std::memcpy(out.values + i * d, Values(rec), sizeof(float) * d);
      if (out.slots)
        std::memcpy(out.slots + i * slot_floats, Values(rec) + d, sizeof(float) * slot_floats);
      if (out.counts) out.counts[i] = h->count;
      if (out.last_seen) out.last_seen[i] = h->last_seen;
      if (out.versions) out.versions[i] = h->version;
      ++i;
    }
  }
}

std::string EmbeddingTable::Import(const int64_t* keys, const float* values, const float* slots,
                                   const int64_t* counts, const int64_t* last_seen,
                                   const int64_t* versions, int64_t n, bool replace,
                                   const Runner& run) {
  for (int64_t i = 0; counts != nullptr && i < n; ++i)
    if (counts[i] < 0) return "negative access count " + std::to_string(counts[i]) +
                              " for key " + std::to_string(keys[i]);
  if (replace) Clear();
  const int d = config_.dim, slot_floats = config_.num_slots * config_.dim;
  std::mutex mu;  // guards the two maxima below
  int64_t max_version = 0, max_seen = 0;
  const Batch batch = Partition(keys, n, false, run);
  // Shards import side by side (a restore of a large table).
  run(config_.num_shards, (n / config_.num_shards + 1) * 200, [&](int64_t s0, int64_t s1) {
    int64_t top_version = 0, top_seen = 0;
    for (int64_t s = s0; s < s1; ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu);
      shard.Reserve(static_cast<size_t>(batch.begin[s + 1] - batch.begin[s]));
      for (int64_t p = batch.begin[s]; p < batch.begin[s + 1]; ++p) {
        const int64_t i = batch.order[p];
        bool added;
        // A restore brings back every row, even beyond max_rows.
        const uint32_t row = shard.FindOrAdd(keys[i], batch.hash[p], &added);
        char* rec = shard.Record(row);
        if (!shard.pending.empty()) shard.pending.erase(keys[i]);
        RecordHeader* h = Header(rec);
        shard.NoteChanged(row, h->version, added);
        std::memcpy(Values(rec), values + i * d, sizeof(float) * d);
        float* slot = Values(rec) + d;
        if (slots != nullptr) {
          std::memcpy(slot, slots + i * slot_floats, sizeof(float) * slot_floats);
        } else {
          for (int k = 0; k < config_.num_slots; ++k, slot += d)
            std::fill(slot, slot + d, config_.slot_init[k]);
        }
        h->count = counts ? AddCount(0, counts[i]) : 0;
        h->last_seen = last_seen ? last_seen[i] : 0;
        h->version = versions ? static_cast<uint32_t>(versions[i]) : 0;
        top_version = std::max<int64_t>(top_version, h->version);
        top_seen = std::max(top_seen, h->last_seen);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    max_version = std::max(max_version, top_version);
    max_seen = std::max(max_seen, top_seen);
  });
  AdvanceLatest(max_seen);
  // Later updates must carry versions above every imported one.
  int64_t cur = version_.load();
  while (cur < max_version && !version_.compare_exchange_weak(cur, max_version)) {
  }
  return "";
}

int64_t EmbeddingTable::sketch_size() const {
  return static_cast<int64_t>(shards_[0]->sketch.size()) * config_.num_shards;
}

int64_t EmbeddingTable::CountPending(int64_t min_version, int shard) const {
  int64_t n = 0;
  const auto [s0, s1] = ShardRange(shard);
  for (size_t si = s0; si < s1; ++si) {
    std::lock_guard<std::mutex> lock(shards_[si]->mu);
    for (const auto& entry : shards_[si]->pending) n += entry.second.version >= min_version;
  }
  return n;
}

void EmbeddingTable::ExportPending(
    int64_t min_version,
    const std::function<PendingBuffers(int64_t n, int64_t sketch)>& alloc, int shard) const {
  const auto [s0, s1] = ShardRange(shard);
  std::vector<std::unique_lock<std::mutex>> locks;  // a consistent count and contents
  int64_t n = 0;
  for (size_t si = s0; si < s1; ++si) {
    locks.emplace_back(shards_[si]->mu);
    for (const auto& entry : shards_[si]->pending) n += entry.second.version >= min_version;
  }
  const int64_t sketch = static_cast<int64_t>(shards_[0]->sketch.size() * (s1 - s0));
  const PendingBuffers out = alloc(n, sketch);
  // A failed allocator said so and returned no buffers.
  if ((n > 0 && out.keys == nullptr) || (sketch > 0 && out.sketch == nullptr)) return;
  int64_t i = 0, c = 0;
  for (size_t si = s0; si < s1; ++si) {
    const Shard& s = *shards_[si];
    for (const auto& [key, p] : s.pending) {
      if (p.version < min_version) continue;
      out.keys[i] = key;
      out.counts[i] = p.count;
      out.last_seen[i] = p.last_seen;
      ++i;
    }
    for (uint32_t v : s.sketch) out.sketch[c++] = static_cast<int32_t>(std::min<uint32_t>(v, INT32_MAX));
  }
}

std::string EmbeddingTable::ImportPending(const int64_t* keys, const int64_t* counts,
                                          const int64_t* last_seen, int64_t n,
                                          const int32_t* sketch, int64_t sketch_count) {
  for (int64_t i = 0; i < n; ++i)
    if (counts[i] < 0) return "negative admission count " + std::to_string(counts[i]) +
                              " for key " + std::to_string(keys[i]);
  // A table that counts exactly (or only reads, as in evaluation) has no use
  // for a saved sketch; one with another sketch cannot map its counters.
  if (sketch_size() == 0) sketch_count = 0;
  if (sketch_count != 0 && sketch_count != sketch_size())
    return "the admission sketch has " + std::to_string(sketch_count) +
           " counters but this table's has " + std::to_string(sketch_size()) +
           " (sketch_width or num_shards differ)";
  int64_t max_seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = HashKey(keys[i]);
    Shard& shard = *shards_[shard_bits_ == 0 ? 0 : h >> (64 - shard_bits_)];
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.FindRow(keys[i], h) != Shard::kNoRow) continue;
    // Counted now, as far as incremental checkpoints go (see Pending::version).
    shard.pending[keys[i]] =
        Shard::Pending{AddCount(0, counts[i]), last_seen[i], version_.load() + 1};
    max_seen = std::max(max_seen, last_seen[i]);
  }
  AdvanceLatest(max_seen);
  int64_t c = 0;  // sketch_count is 0 or every shard's counters, in shard order
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mu);
    for (uint32_t& v : s->sketch) {
      if (c == sketch_count) break;
      v = static_cast<uint32_t>(std::max<int32_t>(sketch[c++], 0));
    }
  }
  return "";
}

int64_t EmbeddingTable::TrackRemovals() {
  std::vector<std::unique_lock<std::mutex>> locks;  // no change goes unnoted or half-noted
  for (auto& s : shards_) locks.emplace_back(s->mu);
  const int64_t version = version_.load();
  for (auto& s : shards_) {
    if (s->track_removals) continue;
    s->track_removals = true;
    s->mark = version;
    for (size_t slot = 0; slot < s->groups * kGroup; ++slot)  // changed since, if any
      if (s->Ctrl(slot) >= 0 && Header(s->Record(s->Row(slot)))->version > version)
        s->dirty.push_back(s->Row(slot));
  }
  return version;
}

void EmbeddingTable::ExportRemoved(int64_t since,
                                   const std::function<int64_t*(int64_t n)>& alloc) {
  std::vector<std::unique_lock<std::mutex>> locks;
  int64_t n = 0;
  for (auto& s : shards_) {
    locks.emplace_back(s->mu);
    // Notes from before `since` are in the save made at `since`: forget them,
    // and the changed rows it holds (version <= since).
    auto& log = s->removed;
    log.erase(std::remove_if(log.begin(), log.end(),
                             [since](const std::pair<int64_t, int64_t>& e) {
                               return e.second < since;
                             }),
              log.end());
    if (since > s->mark) {
      Shard& shard = *s;
      shard.dirty.erase(std::remove_if(shard.dirty.begin(), shard.dirty.end(),
                                       [&](uint32_t row) {
                                         return Header(shard.Record(row))->version <= since;
                                       }),
                        shard.dirty.end());
      shard.mark = since;
    }
    n += static_cast<int64_t>(log.size());
  }
  int64_t* out = alloc(n);
  if (out == nullptr) return;  // a failed allocator said so
  for (const auto& s : shards_)
    for (const auto& e : s->removed) *out++ = e.first;
}

}  // namespace graphmod
