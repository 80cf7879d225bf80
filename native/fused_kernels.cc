// Fused table ops: one op reads, or updates, the rows of many tables, so a
// model with hundreds of embedding features pays one kernel per step for its
// lookups and one for its updates instead of one per feature and step.
//
// Each table is worked on once per op: entries of the same table (features
// sharing it) are concatenated into one batch, so the table partitions it
// once and takes each shard's lock once, and an apply sums the gradients of
// a key over all entries before one optimizer step (as TF sums the
// IndexedSlices of a variable read twice). Outputs equal those of the
// per-table ops.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "native/table.h"
#include "native/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace graphmod {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// A table with at least this many keys in a step spreads its shards over the
// pool by itself; smaller tables run side by side, one thread each, since
// splitting a few thousand keys costs more than it saves, and when all the
// small ones together have fewer keys, on the op's own thread: a step's other
// ops (the dense layers' matmuls) keep the pool busy, and waiting for a turn
// there costs more than the work (TF's sparse updates run on one thread too).
constexpr int64_t kSpreadKeys = 16384;

// One table of a fused op and the op's entries (list positions) that use it.
struct TableWork {
  TableResource* resource = nullptr;
  std::vector<int> entries;
  std::vector<int64_t> offsets;  // where each entry's ids start in the table's batch
  int64_t n = 0;                 // ids of all entries
  EmbeddingTable& table() const { return resource->table; }
};

// The fused op's tables, each once, in order of first appearance; holds a
// reference to each for the duration of Compute.
class FusedTables {
 public:
  ~FusedTables() {
    for (auto& w : work_) w.resource->Unref();
  }
  Status Init(OpKernelContext* ctx, int num_entries, const OpInputList& ids) {
    std::map<TableResource*, size_t> index;
    for (int i = 0; i < num_entries; ++i) {
      TableResource* r = nullptr;
      TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, i), &r));
      auto it = index.find(r);
      if (it == index.end()) {
        it = index.emplace(r, work_.size()).first;
        work_.emplace_back();
        work_.back().resource = r;
      } else {
        r->Unref();  // one reference per table is enough
      }
      TableWork& w = work_[it->second];
      w.entries.push_back(i);
      w.offsets.push_back(w.n);
      w.n += ids[i].NumElements();
    }
    return ::tensorflow::OkStatus();
  }
  const std::vector<TableWork>& work() const { return work_; }

  // Runs fn(table, runner) for every table: large batches one after another,
  // each spread over the pool; small ones in parallel, each on one thread
  // (or all on this thread when they are few keys together).
  template <typename Fn>
  void ForEach(OpKernelContext* ctx, int64_t cost_per_key, Fn&& fn) const {
    const Runner pool = IntraOpRunner(ctx);
    std::vector<const TableWork*> small;
    int64_t small_keys = 0;
    for (const auto& w : work_) {
      if (w.n >= kSpreadKeys) {
        fn(w, pool);
      } else {
        small.push_back(&w);
        small_keys += w.n;
      }
    }
    if (small_keys < kSpreadKeys) {  // all of it less than one large table's worth
      for (const TableWork* w : small) fn(*w, SerialRunner);
      return;
    }
    const int64_t cost = cost_per_key * (small_keys / static_cast<int64_t>(small.size()) + 1);
    pool(static_cast<int64_t>(small.size()), cost, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) fn(*small[k], SerialRunner);
    });
  }

 private:
  std::vector<TableWork> work_;
};

// The first failure of tables worked on side by side.
class FirstStatus {
 public:
  void Note(const Status& status) {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = status;
  }
  Status Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  Status status_;
};

// The table's batch: the entry's own buffer when it has the table to itself,
// else the entries' elements concatenated into `joined`.
template <typename T>
const T* Joined(const TableWork& w, const OpInputList& list, int64_t width, std::vector<T>* joined) {
  if (w.entries.size() == 1) return list[w.entries[0]].flat<T>().data();
  joined->resize(w.n * width);
  for (size_t k = 0; k < w.entries.size(); ++k) {
    const Tensor& t = list[w.entries[k]];
    std::memcpy(joined->data() + w.offsets[k] * width, t.flat<T>().data(),
                sizeof(T) * t.NumElements());
  }
  return joined->data();
}

Status CheckListAttr(OpKernelConstruction* ctx, const char* name, size_t size, int n) {
  if (size != static_cast<size_t>(n))
    return errors::InvalidArgument("graphmod fused op '", ctx->def().name(), "': attr ", name,
                                   " has ", size, " entries for ", n, " tables");
  return ::tensorflow::OkStatus();
}

// Allocates values[i] (keys[i].shape + [dim]) and, when asked, handles[i].
Status AllocateRows(OpKernelContext* ctx, const OpInputList& keys, const std::vector<int>& dims,
                    OpOutputList* values, OpOutputList* handles) {
  TF_RETURN_IF_ERROR(ctx->output_list("values", values));
  if (handles != nullptr) TF_RETURN_IF_ERROR(ctx->output_list("handles", handles));
  for (int i = 0; i < keys.size(); ++i) {
    TensorShape shape = keys[i].shape();
    shape.AddDim(dims[i]);
    Tensor* out;
    TF_RETURN_IF_ERROR(values->allocate(i, shape, &out));
    if (handles != nullptr) TF_RETURN_IF_ERROR(handles->allocate(i, keys[i].shape(), &out));
  }
  return ::tensorflow::OkStatus();
}

Status CheckDims(const FusedTables& tables, const std::vector<int>& dims) {
  for (const auto& w : tables.work())
    for (int i : w.entries)
      if (dims[i] != w.table().config().dim)
        return TableError(w.table(), "fused entry " + std::to_string(i) + " was built for dim " +
                                         std::to_string(dims[i]) + " but the table has dim " +
                                         std::to_string(w.table().config().dim));
  return ::tensorflow::OkStatus();
}

// Copies a table's joined rows (width floats or ints per id) back to its entries' outputs.
template <typename T>
void Split(const TableWork& w, const std::vector<T>& joined, int64_t width, OpOutputList* out) {
  for (size_t k = 0; k < w.entries.size(); ++k) {
    Tensor* t = (*out)[w.entries[k]];
    std::memcpy(t->flat<T>().data(), joined.data() + w.offsets[k] * width,
                sizeof(T) * t->NumElements());
  }
}

class FusedFindOrInsertOp : public OpKernel {
 public:
  explicit FusedFindOrInsertOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("access_thresholds", &thresholds_));
    OP_REQUIRES_OK(ctx, CheckListAttr(ctx, "dims", dims_.size(), n_));
    OP_REQUIRES_OK(ctx, CheckListAttr(ctx, "access_thresholds", thresholds_.size(), n_));
  }
  void Compute(OpKernelContext* ctx) override {
    OpInputList keys, now;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("now", &now));
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Init(ctx, n_, keys));
    OP_REQUIRES_OK(ctx, CheckDims(tables, dims_));
    for (const auto& w : tables.work()) {
      for (int i : w.entries) {
        OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(now[i].shape()),
                    TableError(w.table(), "`now` must be a scalar, got shape " +
                                              now[i].shape().DebugString()));
        const int first = w.entries[0];
        OP_REQUIRES(ctx, now[i].scalar<int64_t>()() == now[first].scalar<int64_t>()() &&
                             thresholds_[i] == thresholds_[first],
                    TableError(w.table(), "fused entries " + std::to_string(first) + " and " +
                                              std::to_string(i) +
                                              " read it with different clocks or access "
                                              "thresholds"));
      }
    }
    OpOutputList values, handles;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, keys, dims_, &values, &handles));
    FirstStatus failed;
    tables.ForEach(ctx, 150, [&](const TableWork& w, const Runner& run) {
      const int first = w.entries[0];
      const int64_t dim = w.table().config().dim;
      std::vector<int64_t> joined_keys, joined_handles;
      std::vector<float> joined_values;
      const int64_t* k = Joined<int64_t>(w, keys, 1, &joined_keys);
      const bool alone = w.entries.size() == 1;
      if (!alone) {
        joined_values.resize(w.n * dim);
        joined_handles.resize(w.n);
      }
      failed.Note(StorageError(w.table(), w.resource->table.FindOrInsert(
          k, w.n, now[first].scalar<int64_t>()(), thresholds_[first],
          alone ? values[first]->flat<float>().data() : joined_values.data(),
          alone ? handles[first]->flat<int64_t>().data() : joined_handles.data(), run)));
      if (!alone) {
        Split(w, joined_values, dim, &values);
        Split(w, joined_handles, 1, &handles);
      }
    });
    OP_REQUIRES_OK(ctx, failed.Take());
  }

 private:
  int n_;
  std::vector<int> dims_;
  std::vector<int64_t> thresholds_;
};

class FusedFindOp : public OpKernel {
 public:
  explicit FusedFindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, CheckListAttr(ctx, "dims", dims_.size(), n_));
  }
  void Compute(OpKernelContext* ctx) override {
    OpInputList keys;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Init(ctx, n_, keys));
    OP_REQUIRES_OK(ctx, CheckDims(tables, dims_));
    OpOutputList values;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, keys, dims_, &values, nullptr));
    FirstStatus failed;
    tables.ForEach(ctx, 100, [&](const TableWork& w, const Runner& run) {
      const int64_t dim = w.table().config().dim;
      std::vector<int64_t> joined_keys;
      const int64_t* k = Joined<int64_t>(w, keys, 1, &joined_keys);
      if (w.entries.size() == 1) {
        failed.Note(StorageError(
            w.table(), w.table().Find(k, w.n, values[w.entries[0]]->flat<float>().data(), run)));
        return;
      }
      std::vector<float> joined_values(w.n * dim);
      failed.Note(StorageError(w.table(), w.table().Find(k, w.n, joined_values.data(), run)));
      Split(w, joined_values, dim, &values);
    });
    OP_REQUIRES_OK(ctx, failed.Take());
  }

 private:
  int n_;
  std::vector<int> dims_;
};

class FusedApplyOp : public OpKernel {
 public:
  explicit FusedApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<std::string> names;
    std::vector<bool> nesterov;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizers", &names));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &nesterov));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("by_address", &by_address_));
    OP_REQUIRES_OK(ctx, CheckListAttr(ctx, "optimizers", names.size(), n_));
    OP_REQUIRES_OK(ctx, CheckListAttr(ctx, "nesterov", nesterov.size(), n_));
    opts_.resize(n_);
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(ctx, ParseOptimizer(names[i], &opts_[i].kind),
                  errors::InvalidArgument("graphmod fused apply '", ctx->def().name(),
                                          "': unknown optimizer '", names[i], "'"));
      opts_[i].nesterov = nesterov[i];
    }
  }
  void Compute(OpKernelContext* ctx) override {
    OpInputList ids, grads, hparams;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, ctx->input_list("hparams", &hparams));
    FusedTables tables;
    OP_REQUIRES_OK(ctx, tables.Init(ctx, n_, ids));
    // Everything is checked before any table changes: a bad entry updates nothing.
    std::vector<Optimizer> opts(opts_);
    for (const auto& w : tables.work()) {
      const EmbeddingTable& t = w.table();
      const int first = w.entries[0];
      for (int i : w.entries) {
        TensorShape want = ids[i].shape();
        want.AddDim(t.config().dim);
        OP_REQUIRES(ctx, grads[i].shape() == want,
                    TableError(t, "gradients of shape " + grads[i].shape().DebugString() +
                                      " do not match ids of shape " +
                                      ids[i].shape().DebugString() + " and dim " +
                                      std::to_string(t.config().dim)));
        OP_REQUIRES_OK(ctx, ReadHparams(t, hparams[i], &opts[i]));
        OP_REQUIRES(ctx, SameStep(opts[i], opts[first]),
                    TableError(t, "fused entries " + std::to_string(first) + " and " +
                                      std::to_string(i) +
                                      " update it with different optimizers or "
                                      "hyper-parameters"));
        const std::string error = t.CheckApply(opts[i], ids[i].flat<int64_t>().data(),
                                               by_address_, ids[i].NumElements(),
                                               IntraOpRunner(ctx));
        OP_REQUIRES(ctx, error.empty(), TableError(t, error));
      }
    }
    FirstStatus failed;
    tables.ForEach(ctx, 200, [&](const TableWork& w, const Runner& run) {
      const int64_t dim = w.table().config().dim;
      std::vector<int64_t> joined_ids;
      std::vector<float> joined_grads;
      const int64_t* i = Joined<int64_t>(w, ids, 1, &joined_ids);
      const float* g = Joined<float>(w, grads, dim, &joined_grads);
      // The ids were checked above; what may still fail is a disk tier's
      // read of cold rows an apply by key brings up (that table changes nothing).
      failed.Note(StorageError(w.table(), w.resource->table.Apply(opts[w.entries[0]], i,
                                                                  by_address_, g, w.n, run)));
    });
    OP_REQUIRES_OK(ctx, failed.Take());
  }

 private:
  static bool SameStep(const Optimizer& a, const Optimizer& b) {
    if (a.kind != b.kind || a.nesterov != b.nesterov) return false;
    for (const auto& f : SpecOf(a.kind).hparams)  // bitwise: a NaN matches itself
      if (std::memcmp(&(a.*(f.second)), &(b.*(f.second)), sizeof(float)) != 0) return false;
    return true;
  }
  int n_;
  bool by_address_;
  std::vector<Optimizer> opts_;
};

REGISTER_KERNEL_BUILDER(Name("GraphmodFusedFindOrInsert").Device(DEVICE_CPU),
                        FusedFindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodFusedFind").Device(DEVICE_CPU), FusedFindOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodFusedApply").Device(DEVICE_CPU), FusedApplyOp);

}  // namespace
}  // namespace graphmod
