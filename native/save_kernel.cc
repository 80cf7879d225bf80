// GraphmodTableSave: writes tables' checkpoint entries as one TensorFlow
// tensor bundle, a chunk of rows at a time.
//
// A Saver's SaveV2 takes every tensor it writes as an input, so saving a
// table through it first exports the whole table: a second copy of it in
// memory. This kernel copies a table's rows a chunk of about 64 MiB at a
// time (EmbeddingTable::Snapshot) into buffers it writes as slices of the
// entries and frees before the next chunk: peak extra memory is one chunk,
// and a tiered table's disk rows stream through it. The snapshot holds
// every shard's lock from the count until the shard is copied, so steps of
// other workers (asynchronous parameter-server training, where the chief
// saves while workers train) wait for a shard rather than move it under the
// save. The bundle holds the entries SaveV2s of the tables' saveables would
// (graphmod/table.py names them), so RestoreV2 reads them whole, and it
// becomes one part of a sharded checkpoint (graphmod/saver.py merges the
// parts). A failed save removes its bundle's files.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "native/exchange_plan.h"
#include "native/table.h"
#include "native/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/util/tensor_bundle/naming.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace graphmod {

using ::tensorflow::BundleWriter;
using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorSlice;

namespace {

// Entries written as slices along their first dimension: each shard's part
// at its offset. Entries with no rows at all are written whole, once.
class SlicedEntries {
 public:
  SlicedEntries(BundleWriter* writer, std::string table, int64_t total)
      : writer_(writer), table_(std::move(table)), total_(total) {}

  // Writes `part` as rows [offset, offset + its rows) of `<table>-<field>`,
  // whose full shape is part's with total rows.
  Status Add(const char* field, const Tensor& part, int64_t offset) {
    TensorShape full = part.shape();
    full.set_dim(0, total_);
    const std::string key = table_ + "-" + field;
    if (total_ == 0) {
      if (!empty_written_.insert(key).second) return ::tensorflow::OkStatus();
      return writer_->Add(key, part);
    }
    if (part.dim_size(0) == 0) return ::tensorflow::OkStatus();
    TensorSlice slice(full.dims());
    slice.set_start(0, offset);
    slice.set_length(0, part.dim_size(0));
    return writer_->AddSlice(key, full, slice, part);
  }

 private:
  BundleWriter* writer_;
  std::string table_;
  int64_t total_;
  std::set<std::string> empty_written_;
};

class SaveOp : public OpKernel {
 public:
  explicit SaveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("checkpoint_format", &format_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_removed", &with_removed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("owned_only", &owned_only_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("owner_rank", &owner_rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("owner_size", &owner_size_));
    OP_REQUIRES(ctx, owner_size_ >= 1 && owner_rank_ >= 0 && owner_rank_ < owner_size_,
                ::tensorflow::errors::InvalidArgument(
                    "graphmod: a table save's owner_rank must be in [0, owner_size), got ",
                    owner_rank_, " of ", owner_size_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() - 2;  // tables, then prefix and min_versions
    const Tensor& prefix = ctx->input(n);
    const Tensor& min_versions = ctx->input(n + 1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(prefix.shape()),
                ::tensorflow::errors::InvalidArgument("graphmod: a table save's `prefix` must "
                                                      "be a scalar, got shape ",
                                                      prefix.shape().DebugString()));
    OP_REQUIRES(ctx, min_versions.dims() == 1 && min_versions.NumElements() == n,
                ::tensorflow::errors::InvalidArgument(
                    "graphmod: a table save's `min_versions` must hold one version per "
                    "table (", n, "), got shape ", min_versions.shape().DebugString()));
    OP_REQUIRES(ctx, owned_only_.empty() || static_cast<int>(owned_only_.size()) == n,
                ::tensorflow::errors::InvalidArgument(
                    "graphmod: a table save's owned_only must be empty or hold one entry per "
                    "table (", n, "), got ", owned_only_.size()));
    const std::string path(prefix.scalar<::tensorflow::tstring>()());
    bool finishing = false;
    const Status status = WriteBundle(ctx, path, n, min_versions.vec<int64_t>(), &finishing);
    if (!status.ok()) RemoveBundle(ctx->env(), path, finishing);
    OP_REQUIRES_OK(ctx, status);
  }

 private:
  // Writes the tables as the bundle `path`; *finishing is set once the
  // writer's Finish (which renames its files into place) has begun.
  Status WriteBundle(OpKernelContext* ctx, const std::string& path, int n,
                     ::tensorflow::TTypes<int64_t>::ConstVec min_versions,
                     bool* finishing) const {
    BundleWriter writer(ctx->env(), path);
    TF_RETURN_IF_ERROR(writer.status());
    for (int i = 0; i < n; ++i) {
      TableResource* resource = nullptr;
      TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, i), &resource));
      ::tensorflow::core::ScopedUnref unref(resource);
      const bool owned_only = !owned_only_.empty() && owned_only_[i];
      TF_RETURN_IF_ERROR(
          WriteTable(ctx, resource->table, min_versions(i), owned_only, &writer));
    }
    *finishing = true;
    return writer.Finish();
  }

  // What a failed save wrote goes (its writer is closed by now): the
  // writer's temporary data file, and, if Finish had begun, the files it
  // renamed into place (whatever was at `path` before was replaced then).
  static void RemoveBundle(::tensorflow::Env* env, const std::string& path, bool finishing) {
    const std::string data = ::tensorflow::DataFilename(path, 0, 1);
    std::vector<std::string> temporary;
    env->GetMatchingPaths(data + ".tempstate*", &temporary).IgnoreError();
    for (const std::string& file : temporary) env->DeleteFile(file).IgnoreError();
    if (!finishing) return;
    env->DeleteFile(data).IgnoreError();
    env->DeleteFile(::tensorflow::MetaFilename(path)).IgnoreError();
  }

  Status WriteTable(OpKernelContext* ctx, EmbeddingTable& t, int64_t min_version,
                    bool owned_only, BundleWriter* writer) const {
    const int rank = static_cast<int>(owner_rank_), size = static_cast<int>(owner_size_);
    const std::function<bool(int64_t)> keep =
        owned_only ? std::function<bool(int64_t)>(
                         [rank, size](int64_t key) { return OwnerRank(key, size) == rank; })
                   : nullptr;
    TF_RETURN_IF_ERROR(WriteRowsAndPending(ctx, t, min_version, keep, writer));
    const std::string& name = t.config().name;
    Tensor format(::tensorflow::DT_INT64, TensorShape({}));
    format.scalar<int64_t>()() = format_;
    TF_RETURN_IF_ERROR(writer->Add(name + "-format", format));
    if (!with_removed_) return ::tensorflow::OkStatus();
    // A delta's tombstones: keys removed since the save it follows, made at
    // version min_version - 1.
    Tensor removed;
    Status status;
    t.ExportRemoved(min_version - 1, [&](int64_t k) -> int64_t* {
      status = ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({k}), &removed);
      return status.ok() ? removed.flat<int64_t>().data() : nullptr;
    });
    TF_RETURN_IF_ERROR(status);
    if (keep) TF_RETURN_IF_ERROR(KeepRows(ctx, keep, &removed, {}));
    return writer->Add(name + "-removed_keys", removed);
  }

  // Keeps the rows i (of every tensor in `also`, all of keys' rows) whose
  // key keys[i] passes `keep`, in order: each tensor is replaced by its kept rows.
  static Status KeepRows(OpKernelContext* ctx, const std::function<bool(int64_t)>& keep,
                         Tensor* keys, std::initializer_list<Tensor*> also) {
    const int64_t n = keys->dim_size(0);
    std::vector<int64_t> kept;
    const int64_t* k = keys->flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      if (keep(k[i])) kept.push_back(i);
    }
    const int64_t m = static_cast<int64_t>(kept.size());
    std::vector<Tensor*> tensors{keys};
    tensors.insert(tensors.end(), also.begin(), also.end());
    for (Tensor* t : tensors) {
      TensorShape shape = t->shape();
      shape.set_dim(0, m);
      Tensor out;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(t->dtype(), shape, &out));
      const int64_t row = n ? t->TotalBytes() / n : 0;  // bytes of one row
      const char* from = static_cast<const char*>(t->tensor_data().data());
      char* to = const_cast<char*>(out.tensor_data().data());
      for (int64_t j = 0; j < m; ++j) std::memcpy(to + j * row, from + kept[j] * row, row);
      *t = out;
    }
    return ::tensorflow::OkStatus();
  }

  // Rows per chunk a save copies and writes: about 64 MiB of buffers
  // (GRAPHMOD_TEST_SAVE_CHUNK_ROWS: fewer, so tests see many chunks).
  static int64_t ChunkRows(const EmbeddingTable& t) {
    if (const char* rows = std::getenv("GRAPHMOD_TEST_SAVE_CHUNK_ROWS"))
      return std::max<int64_t>(1, std::atoll(rows));
    const TableConfig& c = t.config();
    const int64_t row_bytes = 4 * sizeof(int64_t) + RowBytes(c.values_type, c.dim) +
                              RowBytes(c.slots_type, c.dim) * c.num_slots;
    return std::max<int64_t>(4096, (int64_t{64} << 20) / row_bytes);
  }

  // One snapshot of the table: its pending keys (whole: they are few), then
  // its rows, chunk by chunk, each written as slices of the entries as soon
  // as it is full. With `keep`, only the rows and pending keys whose key it
  // keeps: the rows are then gathered in memory and written once, whole
  // (the entries' full shape is written with their first slice).
  static Status WriteRowsAndPending(OpKernelContext* ctx, const EmbeddingTable& t,
                                    int64_t min_version,
                                    const std::function<bool(int64_t)>& keep,
                                    BundleWriter* writer) {
    // Rows as the table stores them (a float16 table's checkpoint holds halves).
    const TableConfig& c = t.config();
    const int64_t k = c.num_slots, vw = StoredWidth(c.values_type, c.dim),
                  sw = StoredWidth(c.slots_type, c.dim);
    const std::string& name = c.name;
    Status status;
    Tensor pending_keys, pending_counts, pending_seen, sketch;
    auto pending = [&](int64_t n, int64_t counters) {
      PendingBuffers out;
      for (Tensor* tensor : {&pending_keys, &pending_counts, &pending_seen}) {
        status = ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({n}), tensor);
        if (!status.ok()) return out;
      }
      status = ctx->allocate_temp(::tensorflow::DT_INT32, SketchShape(t, counters), &sketch);
      if (!status.ok()) return out;
      out.keys = pending_keys.flat<int64_t>().data();
      out.counts = pending_counts.flat<int64_t>().data();
      out.last_seen = pending_seen.flat<int64_t>().data();
      out.sketch = sketch.flat<int32_t>().data();
      return out;
    };
    Tensor keys, values, slots, counts, last_seen, versions;
    std::unique_ptr<SlicedEntries> entries;
    int64_t offset = 0;
    // With keep: the kept rows' chunks, written once the snapshot ends.
    std::vector<std::array<Tensor, 6>> kept;
    const std::string error = t.Snapshot(
        min_version, ChunkRows(t), pending,
        [&](int64_t total, int64_t n) {
          ExportBuffers out;
          if (!status.ok()) return out;  // the pending keys' allocation failed: emit stops
          if (!entries) entries.reset(new SlicedEntries(writer, name, total));
          const std::pair<Tensor*, TensorShape> buffers[] = {
              {&keys, {n}}, {&values, {n, vw}}, {&slots, {n, k, sw}},
              {&counts, {n}}, {&last_seen, {n}}, {&versions, {n}}};
          for (const auto& [tensor, shape] : buffers) {
            const DataType type = tensor == &values   ? StoredDataType(c.values_type)
                                  : tensor == &slots ? StoredDataType(c.slots_type)
                                                     : ::tensorflow::DT_INT64;
            status = ctx->allocate_temp(type, shape, tensor);
            if (!status.ok()) return out;
          }
          out.keys = keys.flat<int64_t>().data();
          out.values = TensorBytes(values);
          out.slots = TensorBytes(slots);
          out.counts = counts.flat<int64_t>().data();
          out.last_seen = last_seen.flat<int64_t>().data();
          out.versions = versions.flat<int64_t>().data();
          return out;
        },
        [&](int64_t n) -> std::string {
          if (keep) {
            if (status.ok())
              status = KeepRows(ctx, keep, &keys, {&values, &slots, &counts, &last_seen,
                                                   &versions});
            kept.push_back({keys, values, slots, counts, last_seen, versions});
            return status.ok() ? "" : "stopped";
          }
          for (const auto& [field, part] :
               {std::pair<const char*, const Tensor*>{"keys", &keys}, {"values", &values},
                {"slots", &slots}, {"counts", &counts}, {"last_seen", &last_seen},
                {"versions", &versions}}) {
            if (status.ok()) status = entries->Add(field, *part, offset);
          }
          offset += n;
          // The kernel reports `status` itself; any text stops the export.
          return status.ok() ? "" : "stopped";
        });
    TF_RETURN_IF_ERROR(status);
    TF_RETURN_IF_ERROR(StorageError(t, error));
    if (keep) {
      TF_RETURN_IF_ERROR(WriteKept(ctx, name, kept, writer));
      TF_RETURN_IF_ERROR(KeepRows(ctx, keep, &pending_keys, {&pending_counts, &pending_seen}));
    }
    for (const auto& [field, part] :
         {std::pair<const char*, const Tensor*>{"pending_keys", &pending_keys},
          {"pending_counts", &pending_counts}, {"pending_last_seen", &pending_seen},
          {"pending_sketch", &sketch}}) {
      TF_RETURN_IF_ERROR(writer->Add(name + "-" + field, *part));
    }
    return ::tensorflow::OkStatus();
  }

  // Writes the kept chunks' rows as the table's row entries, whole.
  // (There is always a chunk: one, empty, when there are no rows.)
  static Status WriteKept(OpKernelContext* ctx, const std::string& name,
                          const std::vector<std::array<Tensor, 6>>& kept,
                          BundleWriter* writer) {
    static const char* const kFields[] = {"keys", "values", "slots",
                                          "counts", "last_seen", "versions"};
    int64_t total = 0;
    for (const auto& chunk : kept) total += chunk[0].dim_size(0);
    for (int f = 0; f < 6; ++f) {
      TensorShape shape = kept[0][f].shape();
      shape.set_dim(0, total);
      Tensor whole;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(kept[0][f].dtype(), shape, &whole));
      char* to = const_cast<char*>(whole.tensor_data().data());
      for (const auto& chunk : kept) {
        const auto data = chunk[f].tensor_data();
        std::memcpy(to, data.data(), data.size());
        to += data.size();
      }
      TF_RETURN_IF_ERROR(writer->Add(name + "-" + kFields[f], whole));
    }
    return ::tensorflow::OkStatus();
  }

  int64_t format_;
  bool with_removed_;
  std::vector<bool> owned_only_;
  int64_t owner_rank_, owner_size_;
};

REGISTER_KERNEL_BUILDER(Name("GraphmodTableSave").Device(DEVICE_CPU), SaveOp);

}  // namespace
}  // namespace graphmod
