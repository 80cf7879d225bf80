// How a batch of ids reaches the shards: deduplicated (Distinct), grouped by
// shard (Partition), run over threads (Runner), and the gradients of rows
// seen more than once summed (RowGroups) before the optimizer runs once per row.
#ifndef GRAPHMOD_NATIVE_BATCH_H_
#define GRAPHMOD_NATIVE_BATCH_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace graphmod {

// Runs fn(begin, end) over [0, n) in parallel. cost_per_unit is a rough count
// of cycles per unit, so the runner can decide how finely to split.
using Runner = std::function<void(int64_t n, int64_t cost_per_unit,
                                  const std::function<void(int64_t, int64_t)>& fn)>;
// Runs everything on the calling thread.
void SerialRunner(int64_t n, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn);

// Ids of one batch grouped by shard: positions order[begin[s], begin[s+1])
// of the batch hold the ids that live in shard s; id[p] and hash[p] are the
// id at order[p] and its hash, stored in that same order so the per-shard
// passes read them sequentially (read through `order`, they were a cache
// miss per key on large batches).
struct Batch {
  std::vector<int64_t> order;
  std::vector<int64_t> id;
  std::vector<uint64_t> hash;
  std::vector<int64_t> begin;
};

// Groups ids by shard (the top bits of their hash, or the shard of a handle
// when ids_are_handles; negative handles go to a last bucket, num_shards,
// which no shard processes). num_shards is a power of two.
Batch Partition(const int64_t* ids, int64_t n, bool ids_are_handles, int num_shards,
                const Runner& run);

// The distinct ids of a batch, in order of first appearance, and for each
// position the index of its id. Tables see each id of a batch once: a
// Zipf-distributed batch repeats its hot ids many times, and resolving each
// once (then copying rows out by position) costs one hash probe of a small,
// cache-resident map per repeat instead of a table probe.
struct Distinct {
  std::vector<int64_t> ids;
  std::vector<uint32_t> count;  // occurrences of ids[j]
  std::vector<uint32_t> index;  // per position: j of its id
  void Build(const int64_t* keys, int64_t n);

 private:
  static constexpr uint32_t kFree = ~0u;
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

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_BATCH_H_
