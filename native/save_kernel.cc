// GraphmodTableSave: writes a table's checkpoint entries as a TensorFlow
// tensor bundle, one shard at a time.
//
// A Saver's SaveV2 takes every tensor it writes as an input, so saving a
// table through it first exports the whole table: a second copy of it in
// memory. This kernel counts the rows of every shard first (the entries'
// full shapes), then copies one shard's rows, under that shard's lock only,
// into buffers it writes as slices of the entries and frees before the next
// shard. Peak extra memory is one shard's rows, and a concurrent step waits
// for one shard's copy at most. The bundle holds the entries a SaveV2 of the
// table's saveable would (graphmod/table.py names them), so RestoreV2 reads
// them whole, and it becomes one part of a sharded checkpoint
// (graphmod/saver.py merges the parts).
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "native/table.h"
#include "native/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace graphmod {

using ::tensorflow::BundleWriter;
using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
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

class SaveOp : public TableKernel {
 public:
  explicit SaveOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("checkpoint_format", &format_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_removed", &with_removed_));
  }

  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& prefix = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(prefix.shape()),
                TableError(*t, "`prefix` must be a scalar, got shape " +
                                   prefix.shape().DebugString()));
    int64_t min_version;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *t, 2, "min_version", &min_version));
    BundleWriter writer(ctx->env(), prefix.scalar<::tensorflow::tstring>()());
    OP_REQUIRES_OK(ctx, writer.status());
    OP_REQUIRES_OK(ctx, WriteRows(*t, min_version, &writer));
    OP_REQUIRES_OK(ctx, WritePending(*t, min_version, &writer));
    const std::string& name = t->config().name;
    Tensor format(::tensorflow::DT_INT64, TensorShape({}));
    format.scalar<int64_t>()() = format_;
    OP_REQUIRES_OK(ctx, writer.Add(name + "-format", format));
    if (with_removed_) {
      // A delta's tombstones: keys removed since the save it follows, made
      // at version min_version - 1.
      Tensor removed;
      t->ExportRemoved(min_version - 1, [&](int64_t n) {
        removed = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        return removed.flat<int64_t>().data();
      });
      OP_REQUIRES_OK(ctx, writer.Add(name + "-removed_keys", removed));
    }
    OP_REQUIRES_OK(ctx, writer.Finish());
  }

 private:
  static Status Changed(const EmbeddingTable& t, const char* what, int shard, int64_t counted,
                        int64_t found) {
    return TableError(t, std::string("its ") + what + " changed while it was being saved (shard " +
                             std::to_string(shard) + " had " + std::to_string(counted) +
                             " when the save began and " + std::to_string(found) +
                             " when it was copied); save between training steps");
  }

  static Status WriteRows(const EmbeddingTable& t, int64_t min_version, BundleWriter* writer) {
    const int shards = t.config().num_shards;
    const int64_t d = t.config().dim, k = t.config().num_slots;
    std::vector<int64_t> counted(shards);
    int64_t total = 0;
    for (int s = 0; s < shards; ++s) total += counted[s] = t.CountRows(min_version, s);
    SlicedEntries entries(writer, t.config().name, total);
    int64_t offset = 0;
    // Every shard is read, empty ones too: a shard that gained rows since
    // they were counted fails the save rather than leaving them out.
    for (int s = 0; s < shards; ++s) {
      Tensor keys, values, slots, counts, last_seen, versions;
      int64_t found = -1;
      t.Export(min_version, [&](int64_t n) {
        found = n;
        ExportBuffers out;
        if (n != counted[s]) return out;  // nothing is written
        keys = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        values = Tensor(::tensorflow::DT_FLOAT, TensorShape({n, d}));
        slots = Tensor(::tensorflow::DT_FLOAT, TensorShape({n, k, d}));
        counts = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        last_seen = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        versions = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        out.keys = keys.flat<int64_t>().data();
        out.values = values.flat<float>().data();
        out.slots = slots.flat<float>().data();
        out.counts = counts.flat<int64_t>().data();
        out.last_seen = last_seen.flat<int64_t>().data();
        out.versions = versions.flat<int64_t>().data();
        return out;
      }, s);
      if (found != counted[s]) return Changed(t, "row count", s, counted[s], found);
      TF_RETURN_IF_ERROR(entries.Add("keys", keys, offset));
      TF_RETURN_IF_ERROR(entries.Add("values", values, offset));
      TF_RETURN_IF_ERROR(entries.Add("slots", slots, offset));
      TF_RETURN_IF_ERROR(entries.Add("counts", counts, offset));
      TF_RETURN_IF_ERROR(entries.Add("last_seen", last_seen, offset));
      TF_RETURN_IF_ERROR(entries.Add("versions", versions, offset));
      offset += found;
    }
    return ::tensorflow::OkStatus();
  }

  // Pending ids as rows are; the sketch's counters are sliced by shard too.
  static Status WritePending(const EmbeddingTable& t, int64_t min_version,
                             BundleWriter* writer) {
    const int shards = t.config().num_shards;
    std::vector<int64_t> counted(shards);
    int64_t total = 0;
    for (int s = 0; s < shards; ++s) total += counted[s] = t.CountPending(min_version, s);
    SlicedEntries entries(writer, t.config().name, total);
    SlicedEntries sketch_entries(writer, t.config().name, t.sketch_size());
    int64_t offset = 0, sketch_offset = 0;
    for (int s = 0; s < shards; ++s) {
      Tensor keys, counts, last_seen, sketch;
      int64_t found = -1;
      t.ExportPending(min_version, [&](int64_t n, int64_t counters) {
        found = n;
        PendingBuffers out;
        if (n != counted[s]) return out;
        keys = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        counts = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        last_seen = Tensor(::tensorflow::DT_INT64, TensorShape({n}));
        sketch = Tensor(::tensorflow::DT_INT32, TensorShape({counters}));
        out.keys = keys.flat<int64_t>().data();
        out.counts = counts.flat<int64_t>().data();
        out.last_seen = last_seen.flat<int64_t>().data();
        out.sketch = sketch.flat<int32_t>().data();
        return out;
      }, s);
      if (found != counted[s]) return Changed(t, "admission count", s, counted[s], found);
      TF_RETURN_IF_ERROR(entries.Add("pending_keys", keys, offset));
      TF_RETURN_IF_ERROR(entries.Add("pending_counts", counts, offset));
      TF_RETURN_IF_ERROR(entries.Add("pending_last_seen", last_seen, offset));
      TF_RETURN_IF_ERROR(sketch_entries.Add("pending_sketch", sketch, sketch_offset));
      offset += found;
      sketch_offset += sketch.NumElements();
    }
    return ::tensorflow::OkStatus();
  }

  int64_t format_;
  bool with_removed_;
};

REGISTER_KERNEL_BUILDER(Name("GraphmodTableSave").Device(DEVICE_CPU), SaveOp);

}  // namespace
}  // namespace graphmod
