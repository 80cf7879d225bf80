// CPU kernels adapting graphmod::EmbeddingTable to TensorFlow: one thin
// kernel per single-table op (ops.cc) that checks its inputs, names the
// table in every error, and calls the table (the resource holding it is in
// table_resource.h; the fused many-table ops in fused_kernels.cc).
#include <string>
#include <utility>
#include <vector>

#include "native/table.h"
#include "native/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

namespace graphmod {

using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::ResourceHandle;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

class TableOp : public OpKernel {
 public:
  explicit TableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string init;
    int64_t seed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &config_.name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &config_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &config_.num_slots));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_init", &config_.slot_init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_a", &config_.init_a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_b", &config_.init_b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &config_.num_shards));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("missing_is_initializer", &config_.missing_is_initializer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("default_value", &config_.default_value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &config_.max_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sketch_width", &config_.sketch_width));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layout", &config_.layout));
    float memory_budget;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory_budget", &memory_budget));
    config_.memory_budget = memory_budget;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage_path", &config_.storage_path));
    std::string values_type, slots_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage_dtype", &values_type));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_storage_dtype", &slots_type));
    if (slots_type.empty()) slots_type = values_type;  // slots as the values
    for (const auto& [name, type] : {std::pair<const std::string&, StorageType*>{
                                         values_type, &config_.values_type},
                                     {slots_type, &config_.slots_type}}) {
      OP_REQUIRES(ctx, ParseStorageType(name, type),
                  errors::InvalidArgument("graphmod table '", config_.name,
                                          "': unknown storage dtype '", name,
                                          "' (float32, float16, bfloat16 or int8)"));
    }
    std::string when_full;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("when_full", &when_full));
    OP_REQUIRES(ctx, WhenFull::Parse(when_full, &config_.when_full),
                errors::InvalidArgument("graphmod table '", config_.name,
                                        "': unknown capacity policy '", when_full,
                                        "' (refuse, lru or lfu)"));
    config_.seed = static_cast<uint64_t>(seed);
    OP_REQUIRES(ctx, ParseInitializer(init, &config_.init),
                errors::InvalidArgument("graphmod table '", config_.name,
                                        "': unknown initializer '", init, "'"));
    const std::string error = ValidateConfig(config_);
    OP_REQUIRES(ctx, error.empty(),
                errors::InvalidArgument("graphmod table '", config_.name, "': ", error));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::ContainerInfo cinfo;
    OP_REQUIRES_OK(ctx, cinfo.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
    TableResource* resource = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<TableResource>(
                            cinfo.container(), cinfo.name(), &resource,
                            [this](TableResource** out) {
                              *out = new TableResource(config_);
                              const std::string error = (*out)->table.open_error();
                              if (error.empty()) return ::tensorflow::OkStatus();
                              (*out)->Unref();
                              *out = nullptr;
                              return ::tensorflow::errors::FailedPrecondition(
                                  "graphmod table '", config_.name,
                                  "': cannot open its disk tier: ", error);
                            }));
    ::tensorflow::core::ScopedUnref unref(resource);
    const TableConfig& existing = resource->table.config();
    OP_REQUIRES(ctx, existing.dim == config_.dim && existing.num_slots == config_.num_slots &&
                         existing.sketch_width == config_.sketch_width &&
                         existing.max_rows == config_.max_rows &&
                         existing.when_full == config_.when_full &&
                         existing.values_type == config_.values_type &&
                         existing.slots_type == config_.slots_type,
                errors::InvalidArgument("graphmod table '", config_.name, "' already exists as '",
                                        existing.name, "' with dim ", existing.dim, ", ",
                                        existing.num_slots, " slots, sketch width ",
                                        existing.sketch_width, ", max_rows ", existing.max_rows,
                                        "; asked for dim ", config_.dim, ", ", config_.num_slots,
                                        " slots, sketch width ", config_.sketch_width,
                                        ", max_rows ", config_.max_rows,
                                        " (or another capacity policy or storage dtype)"));
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<ResourceHandle>()() = ::tensorflow::MakeResourceHandle<TableResource>(
        ctx, cinfo.container(), cinfo.name());
  }

 private:
  TableConfig config_;
};

class FindOrInsertOp : public TableKernel {
 public:
  explicit FindOrInsertOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("access_threshold", &access_threshold_));
    OP_REQUIRES(ctx, access_threshold_ >= -1,
                errors::InvalidArgument("graphmod lookup '", ctx->def().name(),
                                        "': access_threshold must be >= -1, got ",
                                        access_threshold_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    OP_REQUIRES_OK(ctx, CheckDim(*t, dim_));
    const Tensor& keys = ctx->input(1);
    int64_t now;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 2, "now", &now));
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    Tensor *values, *handles;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &handles));
    OP_REQUIRES_OK(ctx, StorageError(*t, t->FindOrInsert(
                            keys.flat<int64_t>().data(), keys.NumElements(), now,
                            access_threshold_, values->flat<float>().data(),
                            handles->flat<int64_t>().data(), IntraOpRunner(ctx))));
  }

 private:
  int dim_;
  int64_t access_threshold_;
};

class FindOp : public TableKernel {
 public:
  explicit FindOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    OP_REQUIRES_OK(ctx, CheckDim(*t, dim_));
    const Tensor& keys = ctx->input(1);
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &values));
    OP_REQUIRES_OK(ctx, StorageError(*t, t->Find(keys.flat<int64_t>().data(),
                                                  keys.NumElements(),
                                                  values->flat<float>().data(),
                                                  IntraOpRunner(ctx))));
  }

 private:
  int dim_;
};

class ApplyOp : public TableKernel {
 public:
  explicit ApplyOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &name));
    OP_REQUIRES(ctx, ParseOptimizer(name, &opt_.kind),
                errors::InvalidArgument("unknown optimizer '", name, "' (known: ",
                                        OptimizerNames(), ")"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("by_address", &by_address_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &opt_.nesterov));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& ids = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    const Tensor& hparams = ctx->input(3);
    const int64_t dim = t->config().dim;
    TensorShape want = ids.shape();
    want.AddDim(dim);
    OP_REQUIRES(ctx, grads.shape() == want,
                TableError(*t, "gradients of shape " + grads.shape().DebugString() +
                                   " do not match ids of shape " + ids.shape().DebugString() +
                                   " and dim " + std::to_string(dim)));
    Optimizer opt = opt_;
    OP_REQUIRES_OK(ctx, ReadHparams(*t, hparams, &opt));
    const std::string error =
        t->Apply(opt, ids.flat<int64_t>().data(), by_address_, grads.flat<float>().data(),
                 ids.NumElements(), IntraOpRunner(ctx));
    OP_REQUIRES(ctx, error.empty(), TableError(*t, error));
  }

 private:
  Optimizer opt_;
  bool by_address_;
};

// The form rows in a tensor of `dtype` are in, moving to or from table t
// whose `what` are stored as `stored`: float32 (decoded, or to be encoded),
// or the table's own form (as stored, bit for bit); else an error.
Status RowsForm(const EmbeddingTable& t, const std::string& what, DataType dtype,
                StorageType stored, StorageType* form) {
  if (dtype == ::tensorflow::DT_FLOAT) {
    *form = StorageType::kFloat32;
    return ::tensorflow::OkStatus();
  }
  if (dtype == StoredDataType(stored)) {
    *form = stored;
    return ::tensorflow::OkStatus();
  }
  return TableError(t, what + " as " + ::tensorflow::DataTypeString(dtype) +
                           ": the table stores them as " + StorageTypeName(stored) +
                           " (rows move as float32 or as stored)");
}

class ExportOp : public TableKernel {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tvalues", &tvalues_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tslots", &tslots_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const int64_t dim = t->config().dim, slots = t->config().num_slots;
    int64_t min_version;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 1, "min_version", &min_version));
    // Rows come out as stored (a saveable's checkpoint keeps them so) or
    // as float32, decoded here.
    const StorageType vt = t->config().values_type, st = t->config().slots_type;
    StorageType vform, sform;
    OP_REQUIRES_OK(ctx, RowsForm(*t, "export values", tvalues_, vt, &vform));
    OP_REQUIRES_OK(ctx, RowsForm(*t, "export slots", tslots_, st, &sform));
    Status status;
    Tensor* tensors[6];
    std::vector<char> values_buf, slots_buf;
    int64_t rows = 0;
    const std::string error = t->Export(min_version, [&](int64_t n) {
      ExportBuffers out;
      const TensorShape shapes[6] = {
          {n}, {n, StoredWidth(vform, dim)}, {n, slots, StoredWidth(sform, dim)}, {n}, {n}, {n}};
      for (int i = 0; i < 6 && status.ok(); ++i)
        status = ctx->allocate_output(i, shapes[i], &tensors[i]);
      if (!status.ok()) return out;
      rows = n;
      out.keys = tensors[0]->flat<int64_t>().data();
      out.values = TensorBytes(*tensors[1]);
      out.slots = TensorBytes(*tensors[2]);
      if (vform != vt) {
        values_buf.resize(RowBytes(vt, dim) * n);
        out.values = values_buf.data();
      }
      if (sform != st) {
        slots_buf.resize(RowBytes(st, dim) * n * slots);
        out.slots = slots_buf.data();
      }
      out.counts = tensors[3]->flat<int64_t>().data();
      out.last_seen = tensors[4]->flat<int64_t>().data();
      out.versions = tensors[5]->flat<int64_t>().data();
      return out;
    });
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES_OK(ctx, StorageError(*t, error));
    if (vform != vt) ConvertRows(vt, values_buf.data(), vform, TensorBytes(*tensors[1]), rows, dim);
    if (sform != st)
      ConvertRows(st, slots_buf.data(), sform, TensorBytes(*tensors[2]), rows * slots, dim);
  }

 private:
  DataType tvalues_, tslots_;
};

class ImportOp : public TableKernel {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
  }
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const int64_t dim = t->config().dim, slots = t->config().num_slots;
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                TableError(*t, "import keys must be a vector, got shape " +
                                   keys.shape().DebugString()));
    // Rows come in float32 (encoded here) or as the table stores them.
    const StorageType vt = t->config().values_type, st = t->config().slots_type;
    StorageType vform, sform;
    OP_REQUIRES_OK(ctx, RowsForm(*t, "import values", ctx->input(2).dtype(), vt, &vform));
    OP_REQUIRES_OK(ctx, RowsForm(*t, "import slots", ctx->input(3).dtype(), st, &sform));
    const int64_t n = keys.NumElements();
    const char* names[6] = {"keys", "values", "slots", "counts", "last_seen", "versions"};
    const TensorShape want[6] = {
        {n}, {n, StoredWidth(vform, dim)}, {n, slots, StoredWidth(sform, dim)}, {n}, {n}, {n}};
    for (int i = 2; i < 7; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == want[i - 1],
                  TableError(*t, std::string("import ") + names[i - 1] + " have shape " +
                                     ctx->input(i).shape().DebugString() + " but the table (dim " +
                                     std::to_string(dim) + ", " + std::to_string(slots) +
                                     " slots) needs " + want[i - 1].DebugString()));
    }
    std::vector<char> values_buf, slots_buf;
    const char* values = ctx->input(2).tensor_data().data();
    const char* slot_rows = ctx->input(3).tensor_data().data();
    if (vform != vt) {
      values_buf.resize(RowBytes(vt, dim) * n);
      ConvertRows(vform, values, vt, values_buf.data(), n, dim);
      values = values_buf.data();
    }
    if (sform != st) {
      slots_buf.resize(RowBytes(st, dim) * n * slots);
      ConvertRows(sform, slot_rows, st, slots_buf.data(), n * slots, dim);
      slot_rows = slots_buf.data();
    }
    const std::string error = t->Import(
        keys.flat<int64_t>().data(), values, slot_rows, ctx->input(4).flat<int64_t>().data(),
        ctx->input(5).flat<int64_t>().data(), ctx->input(6).flat<int64_t>().data(), n, replace_,
        IntraOpRunner(ctx));
    OP_REQUIRES(ctx, error.empty(), TableError(*t, error));
  }

 private:
  bool replace_;
};

class InfoOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const TableCounters c = t->counters();
    const int64_t values[11] = {c.rows,     t->memory_bytes(), t->version(), c.admitted,
                                c.rejected, c.evicted,         c.pending,    c.latest,
                                c.stale,    c.ids_looked_up,   c.lookups};
    for (int i = 0; i < 11; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int64_t>()() = values[i];
    }
  }
};

class TierInfoOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const TableCounters c = t->counters();
    const int64_t values[12] = {c.rows - c.cold_rows, c.cold_rows,       c.promoted,
                                c.spilled,            c.disk_reads,      c.disk_read_bytes,
                                c.read_passes,        c.disk_file_bytes, c.disk_live_bytes,
                                c.compactions,
                                static_cast<int64_t>(c.compaction_seconds * 1000),
                                c.prefetched};
    for (int i = 0; i < 12; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int64_t>()() = values[i];
    }
  }
};

class PrefetchOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& keys = ctx->input(1);
    const std::string error =
        t->Prefetch(keys.flat<int64_t>().data(), keys.NumElements(), IntraOpRunner(ctx));
    // (Raised in the input pipeline: say where it comes from.)
    OP_REQUIRES_OK(ctx, StorageError(*t, error.empty() ? error : "prefetch: " + error));
  }
};

class RemoveOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, t->Remove(keys.flat<int64_t>().data(),
                                                    keys.NumElements())));
  }
};

class EvictOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    int64_t before;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 1, "before", &before));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, t->Evict(before, IntraOpRunner(ctx))));
  }
};

class ExportPendingOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    int64_t min_version;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 1, "min_version", &min_version));
    Status status;
    t->ExportPending(min_version, [&](int64_t n, int64_t sketch) {
      PendingBuffers out;
      Tensor* tensors[4];
      for (int i = 0; i < 4 && status.ok(); ++i)
        status = ctx->allocate_output(i, i < 3 ? TensorShape({n}) : SketchShape(*t, sketch),
                                      &tensors[i]);
      if (!status.ok()) return out;
      out.keys = tensors[0]->flat<int64_t>().data();
      out.counts = tensors[1]->flat<int64_t>().data();
      out.last_seen = tensors[2]->flat<int64_t>().data();
      out.sketch = tensors[3]->flat<int32_t>().data();
      return out;
    });
    OP_REQUIRES_OK(ctx, status);
  }
};

class ImportPendingOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& keys = ctx->input(1);
    const char* names[3] = {"keys", "counts", "last_seen"};
    for (int i = 1; i < 4; ++i)
      OP_REQUIRES(ctx, ctx->input(i).dims() == 1 && ctx->input(i).NumElements() == keys.NumElements(),
                  TableError(*t, std::string("pending ") + names[i - 1] + " must be a vector of " +
                                     std::to_string(keys.NumElements()) + ", got shape " +
                                     ctx->input(i).shape().DebugString()));
    const Tensor& sketch = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckSketchShards(*t, sketch, "the admission sketch"));
    const std::string error = t->ImportPending(
        keys.flat<int64_t>().data(), ctx->input(2).flat<int64_t>().data(),
        ctx->input(3).flat<int64_t>().data(), keys.NumElements(), sketch.flat<int32_t>().data(),
        sketch.NumElements());
    OP_REQUIRES(ctx, error.empty(), TableError(*t, error));
  }
};

class TrackRemovalsOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, t->TrackRemovals()));
  }
};

class ExportRemovedOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    int64_t since;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 1, "since", &since));
    Status status;
    t->ExportRemoved(since, [&](int64_t n) -> int64_t* {
      Tensor* out;
      status = ctx->allocate_output(0, TensorShape({n}), &out);
      return status.ok() ? out->flat<int64_t>().data() : nullptr;
    });
    OP_REQUIRES_OK(ctx, status);
  }
};

class ClearOp : public TableKernel {
 public:
  using TableKernel::TableKernel;
  void ComputeWithTable(OpKernelContext*, EmbeddingTable* t) override { t->Clear(); }
};

REGISTER_KERNEL_BUILDER(Name("GraphmodTable").Device(DEVICE_CPU), TableOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableFindOrInsert").Device(DEVICE_CPU), FindOrInsertOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableFind").Device(DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableApply").Device(DEVICE_CPU), ApplyOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableExport").Device(DEVICE_CPU), ExportOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableImport").Device(DEVICE_CPU), ImportOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableInfo").Device(DEVICE_CPU), InfoOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableTierInfo").Device(DEVICE_CPU), TierInfoOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTablePrefetch").Device(DEVICE_CPU), PrefetchOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableRemove").Device(DEVICE_CPU), RemoveOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableClear").Device(DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableEvict").Device(DEVICE_CPU), EvictOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableExportPending").Device(DEVICE_CPU), ExportPendingOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableImportPending").Device(DEVICE_CPU), ImportPendingOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableTrackRemovals").Device(DEVICE_CPU), TrackRemovalsOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodTableExportRemoved").Device(DEVICE_CPU), ExportRemovedOp);

}  // namespace
}  // namespace graphmod
