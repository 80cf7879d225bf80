#include "native/arena_row_store.h"

namespace graphmod {

void ArenaRowStore::Grow() {
  const uint64_t n = BlockRows(blocks_.size());
  blocks_.push_back(NewBlock(n * stride_));
  arena_rows_ += n;
  if (generation_.size() < arena_rows_) {
    // Grown by an eighth, not doubled: a byte per row, not two, at the top of a growth.
    if (generation_.capacity() < arena_rows_) generation_.reserve(arena_rows_ + arena_rows_ / 8);
    generation_.resize(arena_rows_, 0);
  }
}

char* ArenaRowStore::NewBlock(size_t bytes) {
  if (arena_bytes_ < kHugePage || bytes > kHugePage) {
    slabs_.push_back(AllocateAligned(bytes));
    arena_bytes_ += bytes;
    return slabs_.back().get();
  }
  if (slab_left_ < bytes) {  // the rest of the old slab (< one block) stays unused
    slabs_.push_back(AllocateAligned(kHugePage));
    slab_cursor_ = slabs_.back().get();
    slab_left_ = kHugePage;
    arena_bytes_ += kHugePage;
  }
  char* block = slab_cursor_;
  slab_cursor_ += bytes;
  slab_left_ -= bytes;
  return block;
}

void ArenaRowStore::Reset() {
  blocks_.clear();
  slabs_.clear();
  slab_cursor_ = nullptr;
  slab_left_ = arena_bytes_ = 0;
  rows_ = arena_rows_ = 0;
  free_rows_.clear();
  free_rows_.shrink_to_fit();
  for (uint8_t& g : generation_) ++g;  // handles of the old rows are stale from now
}

}  // namespace graphmod
