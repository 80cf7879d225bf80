// How a batch of ids reaches the shards: grouped by shard and deduplicated
// within each shard (Batch), run over threads (Runner), and the gradients of
// rows seen more than once summed (RowGroups) before the optimizer runs once
// per row. Every step of it runs in parallel: the grouping over chunks of
// the batch, the dedup and what follows shard by shard.
#ifndef GRAPHMOD_NATIVE_BATCH_H_
#define GRAPHMOD_NATIVE_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace graphmod {

// Runs fn(begin, end) over [0, n) in parallel. cost_per_unit is a rough count
// of cycles per unit, so the runner can decide how finely to split.
using Runner = std::function<void(int64_t n, int64_t cost_per_unit,
                                  const std::function<void(int64_t, int64_t)>& fn)>;
// Runs everything on the calling thread.
void SerialRunner(int64_t n, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn);

// A buffer that only grows: each batch reuses the memory of the one before
// (fresh vectors, page-faulted on every call, cost a large lookup a tenth of
// its time). Its contents are not initialized.
template <class T>
class Scratch {
 public:
  T* Get(size_t n) {
    if (n > size_) {
      size_ = n + n / 4;
      data_.reset(new T[size_]);
    }
    return data_.get();
  }
  // Frees the buffer if it holds more than max_bytes.
  void Trim(size_t max_bytes) {
    if (size_ * sizeof(T) <= max_bytes) return;
    data_.reset();
    size_ = 0;
  }

 private:
  std::unique_ptr<T[]> data_;
  size_t size_ = 0;
};

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

// Ids of one batch grouped by shard. Positions [begin[s], begin[s+1]) hold
// the ids that live in shard s; id[p] and hash[p] are the id at batch
// position order[p] and its hash, stored in that order so the per-shard
// passes read them sequentially (read through `order`, they were a cache
// miss per key on large batches).
//
// A batch of keys to look up is also deduplicated, shard by shard
// (Dedup(s), on the shard's own thread): a Zipf-distributed batch repeats
// its hot ids many times, and resolving each once costs one probe of a
// small, cache-resident map per repeat instead of a table probe. Then
// [begin[s], distinct_end[s]) hold each of the shard's ids once, in order of
// first appearance, count[p] its occurrences; [distinct_end[s], begin[s+1])
// hold the repeats, each with first[p], the position of its id's entry, and
// count[p], which occurrence it is (1: the second), and no hash. index[i]
// is, for batch position i (the caller's order), the position of its id's
// entry.
//
// A batch holds fewer than 2^32 ids, and keeps its buffers for the next one
// (see BatchPool).
class Batch {
 public:
  // Groups ids by shard (the top bits of their hash, or the shard of a
  // handle when ids_are_handles; negative handles go to a last bucket,
  // num_shards, which no shard processes). num_shards is a power of two.
  // With dedup, Dedup(s) must then run for every shard s before its
  // positions are read (until then distinct_end[s] == begin[s]).
  void Partition(const int64_t* ids, int64_t n, bool ids_are_handles, bool dedup,
                 int num_shards, const Runner& run);
  void Dedup(int64_t s);
  // Ids in shard s's positions after Dedup (or all of them, without).
  int64_t distinct(int64_t s) const { return distinct_end[s] - begin[s]; }

  int64_t* order = nullptr;
  int64_t* id = nullptr;
  uint64_t* hash = nullptr;  // none for handles
  uint32_t* count = nullptr;
  uint32_t* first = nullptr;
  uint32_t* index = nullptr;
  // Per distinct position, for a training lookup's pass over its shard: how
  // many of the id's first occurrences were refused a row, and the row's
  // handle (-1: none), which its repeats then read.
  uint32_t* refused = nullptr;
  int64_t* found = nullptr;
  std::vector<int64_t> begin, distinct_end;
  std::vector<RowGroups> groups;  // per shard, for Apply
  // Room for n rows of d floats (a lookup's distinct rows, by position).
  float* Rows(int64_t n, int d) { return rows_.Get(static_cast<size_t>(std::max<int64_t>(n, 1)) * d); }
  // Frees buffers above max_bytes each (a rare huge batch does not keep
  // its memory for good; the next one that large allocates again).
  void Trim(size_t max_bytes) {
    order_.Trim(max_bytes), id_.Trim(max_bytes), hash_.Trim(max_bytes), raw_.Trim(max_bytes);
    count_.Trim(max_bytes), first_.Trim(max_bytes), index_.Trim(max_bytes);
    refused_.Trim(max_bytes), map_.Trim(max_bytes), found_.Trim(max_bytes);
    rows_.Trim(max_bytes);
  }
  // Distinct ids of every shard (after Dedup of each).
  int64_t Distinct() const {
    int64_t u = 0;
    for (size_t s = 0; s + 1 < begin.size(); ++s) u += distinct_end[s] - begin[s];
    return u;
  }

 private:
  static constexpr uint32_t kFree = ~0u;
  Scratch<int64_t> order_, id_;
  Scratch<uint64_t> hash_;
  Scratch<uint32_t> raw_;
  Scratch<uint32_t> count_, first_, index_, refused_, map_;
  Scratch<float> rows_;
  Scratch<int64_t> found_;
  std::vector<int64_t> chunk_counts_, map_begin_;
  // Before Dedup: the batch's positions grouped by shard (all Dedup(s) needs
  // to read the ids from the caller's batch: a fifth of the bytes).
  const int64_t* ids_ = nullptr;
  uint32_t* raw_p_ = nullptr;
  uint32_t* map_p_ = nullptr;  // each shard's dedup map, at map_begin_[s]
};

// Batches kept between calls, one per call in flight (steps of asynchronous
// workers running side by side each take their own), at most kKeep of them
// and none of their buffers above kKeepBytes.
class BatchPool {
 public:
  class Lease {
   public:
    Lease(BatchPool* pool, std::unique_ptr<Batch> batch)
        : pool_(pool), batch_(std::move(batch)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (batch_) pool_->Return(std::move(batch_));
    }
    Batch& operator*() const { return *batch_; }
    Batch* operator->() const { return batch_.get(); }

   private:
    BatchPool* pool_;
    std::unique_ptr<Batch> batch_;
  };
  Lease Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return Lease(this, std::unique_ptr<Batch>(new Batch));
    std::unique_ptr<Batch> batch = std::move(free_.back());
    free_.pop_back();
    return Lease(this, std::move(batch));
  }

 private:
  static constexpr size_t kKeep = 4, kKeepBytes = size_t{64} << 20;
  void Return(std::unique_ptr<Batch> batch) {
    batch->Trim(kKeepBytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKeep) free_.push_back(std::move(batch));
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<Batch>> free_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_BATCH_H_
