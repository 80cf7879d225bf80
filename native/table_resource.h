// What graphmod's TensorFlow kernels share (kernels.cc and save_kernel.cc:
// one table per op; fused_kernels.cc: many tables per op): the resource
// holding a table, the runner that spreads table work over the session's
// threads, errors that name the table, the reading of an apply's
// hyper-parameters, and the base of single-table kernels.
#ifndef GRAPHMOD_NATIVE_TABLE_RESOURCE_H_
#define GRAPHMOD_NATIVE_TABLE_RESOURCE_H_

#include <string>
#include <utility>
#include <vector>

#include "native/table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

namespace graphmod {

class TableResource : public ::tensorflow::ResourceBase {
 public:
  explicit TableResource(TableConfig config) : table(std::move(config)) {}
  std::string DebugString() const override { return "graphmod table " + table.config().name; }
  int64_t MemoryUsed() const override { return table.memory_bytes(); }
  EmbeddingTable table;
};

// Spreads table work over the session's intra-op threads.
inline Runner IntraOpRunner(::tensorflow::OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    pool->ParallelFor(n, cost, fn);
  };
}

inline ::tensorflow::Status TableError(const EmbeddingTable& t, const std::string& what) {
  return ::tensorflow::errors::InvalidArgument("graphmod table '", t.config().name, "': ",
                                               what);
}

// The admission sketch as saved: a row of counters per shard (each shard
// counts its own keys in its own counters), so that a restore can tell a
// table of another shard count, where the counters would count other keys.
inline ::tensorflow::TensorShape SketchShape(const EmbeddingTable& t, int64_t counters) {
  const int64_t shards = t.config().num_shards;
  return ::tensorflow::TensorShape({shards, counters / shards});
}

// Whether a saved sketch (`what` names it) can be imported into t: a row per
// shard of t, or a vector (checkpoints from before the rows; of those only
// the size is checked, by the import).
inline ::tensorflow::Status CheckSketchShards(const EmbeddingTable& t,
                                              const ::tensorflow::Tensor& sketch,
                                              const std::string& what) {
  if (sketch.dims() == 1) return ::tensorflow::OkStatus();
  if (sketch.dims() != 2)
    return TableError(t, what + " must hold a row of counters per shard, got shape " +
                             sketch.shape().DebugString());
  if (sketch.NumElements() == 0 || t.sketch_size() == 0) return ::tensorflow::OkStatus();
  const int64_t saved = sketch.dim_size(0), shards = t.config().num_shards;
  if (saved == shards) return ::tensorflow::OkStatus();
  return TableError(t, what + " was saved by a table of " + std::to_string(saved) +
                           " shards and this one has " + std::to_string(shards) +
                           ": each shard counts its own keys, so the counters would count "
                           "other keys here (create the table with num_shards=" +
                           std::to_string(saved) + " to restore its admission counts)");
}

// How tensors hold rows stored as `type` (row_codec.h), in checkpoints: a
// tensor of StoredDataType(type) whose last dimension is StoredWidth(type,
// dim): dim values of float32, half or bfloat16; an int8 row as dim + 8
// uint8 bytes, its scale and bias (float32, little-endian) then its codes.
inline ::tensorflow::DataType StoredDataType(StorageType type) {
  switch (type) {
    case StorageType::kFloat32: return ::tensorflow::DT_FLOAT;
    case StorageType::kFloat16: return ::tensorflow::DT_HALF;
    case StorageType::kBFloat16: return ::tensorflow::DT_BFLOAT16;
    case StorageType::kInt8: return ::tensorflow::DT_UINT8;
  }
  return ::tensorflow::DT_INVALID;
}
inline int64_t StoredWidth(StorageType type, int64_t dim) {
  return type == StorageType::kInt8 ? static_cast<int64_t>(kInt8Params) + dim : dim;
}
// The form rows in a tensor of `dtype` are in (false: none).
inline bool StorageTypeOf(::tensorflow::DataType dtype, StorageType* out) {
  for (StorageType t : {StorageType::kFloat32, StorageType::kFloat16, StorageType::kBFloat16,
                        StorageType::kInt8}) {
    if (StoredDataType(t) == dtype) {
      *out = t;
      return true;
    }
  }
  return false;
}
inline char* TensorBytes(const ::tensorflow::Tensor& t) {
  return const_cast<char*>(t.tensor_data().data());
}

// An error of the table's disk tier ("" is OK): the files, not the input
// (the tier's messages name the file).
inline ::tensorflow::Status StorageError(const EmbeddingTable& t, const std::string& what) {
  if (what.empty()) return ::tensorflow::OkStatus();
  return ::tensorflow::errors::Internal("graphmod table '", t.config().name, "': disk tier ",
                                        what);
}

// Fills opt's hyper-parameters from the vector `hparams` (in SpecOf(kind)'s
// order), or says what the vector should have been.
inline ::tensorflow::Status ReadHparams(const EmbeddingTable& t,
                                        const ::tensorflow::Tensor& hparams, Optimizer* opt) {
  const auto& fields = SpecOf(opt->kind).hparams;
  if (hparams.dims() != 1 || hparams.NumElements() != static_cast<int64_t>(fields.size())) {
    std::string names;
    for (const auto& f : fields) names += std::string(names.empty() ? "" : ", ") + f.first;
    return TableError(t, "hyper-parameters must be the vector [" + names + "], got shape " +
                             hparams.shape().DebugString());
  }
  for (size_t i = 0; i < fields.size(); ++i) opt->*(fields[i].second) = hparams.flat<float>()(i);
  return ::tensorflow::OkStatus();
}

// Base of every kernel taking the table as input 0: looks it up, keeps a
// reference for the duration of Compute.
class TableKernel : public ::tensorflow::OpKernel {
 public:
  using ::tensorflow::OpKernel::OpKernel;
  void Compute(::tensorflow::OpKernelContext* ctx) override {
    TableResource* resource = nullptr;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    ComputeWithTable(ctx, &resource->table);
  }

 protected:
  virtual void ComputeWithTable(::tensorflow::OpKernelContext* ctx, EmbeddingTable* table) = 0;

  // The `dim` attr the Python side built the op with must match the table.
  static ::tensorflow::Status CheckDim(const EmbeddingTable& t, int dim) {
    if (dim != t.config().dim)
      return TableError(t, "the op was built for dim " + std::to_string(dim) +
                               " but the table has dim " + std::to_string(t.config().dim));
    return ::tensorflow::OkStatus();
  }

  // The int64 scalar input `index` (its name for the error), or an error.
  static ::tensorflow::Status ScalarInput(::tensorflow::OpKernelContext* ctx,
                                          const EmbeddingTable& t, int index, const char* name,
                                          int64_t* value) {
    const ::tensorflow::Tensor& in = ctx->input(index);
    if (!::tensorflow::TensorShapeUtils::IsScalar(in.shape()))
      return TableError(t, std::string("`") + name + "` must be a scalar, got shape " +
                               in.shape().DebugString());
    *value = in.scalar<int64_t>()();
    return ::tensorflow::OkStatus();
  }

  static ::tensorflow::Status ScalarOutput(::tensorflow::OpKernelContext* ctx, int64_t value) {
    ::tensorflow::Tensor* out;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, ::tensorflow::TensorShape({}), &out));
    out->scalar<int64_t>()() = value;
    return ::tensorflow::OkStatus();
  }
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_TABLE_RESOURCE_H_
