// The in-memory row store: records in blocks that never move.
//
// Blocks hold 64, 128, 256 rows, then 512 rows each, so small tables stay
// small and a table wastes at most one partly used block per shard. Blocks
// come from malloc until the store holds a huge page of rows, then are carved
// from 2 MB slabs (huge pages: records are read at random). Freed rows wait
// on a free list and are handed out again first.
#ifndef GRAPHMOD_NATIVE_ARENA_ROW_STORE_H_
#define GRAPHMOD_NATIVE_ARENA_ROW_STORE_H_

#include <cstdint>
#include <vector>

#include "native/memory.h"
#include "native/row_store.h"

namespace graphmod {

class ArenaRowStore final {
 public:
  explicit ArenaRowStore(const RecordLayout& layout)
      : stride_(layout.stride), read_bytes_(layout.lookup_bytes()) {}
  ArenaRowStore(const ArenaRowStore&) = delete;
  ArenaRowStore& operator=(const ArenaRowStore&) = delete;

  uint32_t Allocate(int64_t key) {
    uint32_t row;
    if (!free_rows_.empty()) {
      row = free_rows_.back();
      free_rows_.pop_back();
    } else {
      if (rows_ == arena_rows_) Grow();
      row = static_cast<uint32_t>(rows_++);
    }
    Header(Record(row))->key = key;
    return row;
  }
  char* Record(uint32_t row) const {
    size_t block;
    uint64_t offset;
    LocateRow(row, &block, &offset);
    return blocks_[block] + offset * stride_;
  }
  int64_t Key(uint32_t row) const { return Header(Record(row))->key; }
  // Every line of the record's header and values, what a lookup reads and
  // writes (at dim 16, 88 B in float32, 56 B in float16: two or three lines).
  GRAPHMOD_PREFETCHER void Prefetch(uint32_t row) const {
    PrefetchLines(Record(row), read_bytes_);
  }
  // A handle's generation lives apart from the record (it outlives the
  // row): unfetched, it was a training lookup's third miss a key, the one
  // its pipeline left in the open (half the profile's samples at 8M keys).
  GRAPHMOD_PREFETCHER void PrefetchGeneration(uint64_t row) const {
    if (row < generation_.size()) __builtin_prefetch(generation_.data() + row);
  }
  uint8_t Generation(uint32_t row) const { return generation_[row]; }
  bool IsCurrent(uint64_t row, uint8_t generation) const {
    return row < rows_ && generation_[row] == generation;
  }
  // Generations are kept for every row the blocks ever held (they outlive a
  // Reset), so this bound never shrinks.
  uint64_t RowBound() const { return generation_.size(); }
  void Free(uint32_t row) {
    free_rows_.push_back(row);
    ++generation_[row];
  }
  template <class Fn>
  void ForEachLive(Fn&& fn) const;
  void Reset();
  int64_t Bytes() const {
    return static_cast<int64_t>(arena_bytes_ + free_rows_.capacity() * sizeof(uint32_t) +
                                generation_.capacity());
  }

  // Block geometry, for the tests: rows of block b, and where row r lives.
  static uint64_t BlockRows(size_t block) {
    return block < kGeometricBlocks ? (1ULL << (kFirstBlockBits + block))
                                    : (1ULL << kMaxBlockBits);
  }
  static void LocateRow(uint64_t row, size_t* block, uint64_t* offset) {
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

 private:
  static constexpr int kFirstBlockBits = 6;
  static constexpr int kMaxBlockBits = 9;
  static constexpr int kGeometricBlocks = kMaxBlockBits - kFirstBlockBits;
  static constexpr uint64_t kGeometricRows =
      (1ULL << kMaxBlockBits) - (1ULL << kFirstBlockBits);

  // Adds the next block (out of line: once per block, not per row).
  void Grow();
  char* NewBlock(size_t bytes);

  size_t stride_;
  size_t read_bytes_;  // RecordLayout::lookup_bytes
  std::vector<char*> blocks_;
  std::vector<Memory> slabs_;  // owns the blocks' memory
  char* slab_cursor_ = nullptr;
  size_t slab_left_ = 0;
  size_t arena_bytes_ = 0;
  uint64_t rows_ = 0;        // rows [0, rows_) have been handed out
  uint64_t arena_rows_ = 0;  // rows the allocated blocks can hold
  std::vector<uint32_t> free_rows_;
  std::vector<uint8_t> generation_;  // per row (see IsCurrent)
};

template <class Fn>
void ArenaRowStore::ForEachLive(Fn&& fn) const {
  std::vector<bool> dead;  // rows waiting on the free list hold stale keys
  if (!free_rows_.empty()) {
    dead.assign(rows_, false);
    for (uint32_t r : free_rows_) dead[r] = true;
  }
  uint64_t row = 0;
  for (size_t b = 0; b < blocks_.size() && row < rows_; ++b) {
    const char* rec = blocks_[b];
    for (uint64_t i = 0, n = BlockRows(b); i < n && row < rows_; ++i, ++row, rec += stride_) {
      if (!dead.empty() && dead[row]) continue;
      fn(static_cast<uint32_t>(row), rec);
    }
  }
}

static_assert(CheckRowStore<ArenaRowStore>(), "ArenaRowStore meets the row store contract");

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_ARENA_ROW_STORE_H_
