// GraphmodTableRestore: reads a table's checkpoint entries (as
// GraphmodTableSave or a saveable's SaveV2 wrote them) straight from the
// tensor bundle into the table, one stored slice at a time.
//
// A Saver's RestoreV2 reads every entry whole before the table imports it:
// the whole table in memory at once, which a table larger than memory
// (a disk tier) cannot afford. GraphmodTableSave writes a table's rows as
// slices of about 64 MiB; this kernel imports them slice by slice, so a
// restore holds one slice of rows beside the table (whose import spills as
// it goes). Entries written whole (a small table, another Saver) are read
// whole. Every check that can fail on the checkpoint's contents (format,
// types, shapes, slices covering every row once, negative counts, the
// sketch's size) runs before the table changes. A V1 checkpoint (no bundle
// index) is read too, each entry whole.
#include <algorithm>
#include <memory>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "native/exchange_plan.h"
#include "native/table.h"
#include "native/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/tensor_slice_reader.h"
#include "tensorflow/core/util/tensor_bundle/naming.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace graphmod {

using ::tensorflow::BundleReader;
using ::tensorflow::DataType;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorSlice;
using ::tensorflow::checkpoint::TensorSliceReader;

namespace {

constexpr const char* kRowFields[] = {"keys", "values", "slots", "counts", "last_seen",
                                      "versions"};

// The checkpoint names of one table's entries: `<name>-<field>`.
struct Entry {
  std::string name;
  std::string operator()(const std::string& field) const { return name + "-" + field; }
};

// A checkpoint's entries: a V2 tensor bundle, whose slices are read one at
// a time, or a V1 checkpoint (TensorSliceReader, as RestoreV2 falls back
// to), whose entries are read whole: V1 predates tables larger than memory.
class Checkpoint {
 public:
  Checkpoint(::tensorflow::Env* env, const std::string& prefix) {
    if (env->FileExists(::tensorflow::MetaFilename(prefix)).ok()) {
      bundle_ = std::make_unique<BundleReader>(env, prefix);
    } else {
      v1_ = std::make_unique<TensorSliceReader>(prefix);
    }
  }
  Status status() const { return bundle_ ? bundle_->status() : v1_->status(); }

  Status TypeAndShape(const std::string& key, DataType* type, TensorShape* shape) {
    if (bundle_) return bundle_->LookupDtypeAndShape(key, type, shape);
    if (!v1_->HasTensor(key, shape, type))
      return ::tensorflow::errors::NotFound("Key ", key, " not found in checkpoint");
    return ::tensorflow::OkStatus();
  }
  // The stored slices of key; none when it is stored whole.
  Status Slices(const std::string& key, std::vector<TensorSlice>* slices) {
    slices->clear();
    return bundle_ ? bundle_->LookupTensorSlices(key, slices) : ::tensorflow::OkStatus();
  }
  Status Whole(const std::string& key, Tensor* out) {
    DataType type;
    TensorShape shape;
    TF_RETURN_IF_ERROR(TypeAndShape(key, &type, &shape));
    if (!bundle_) {
      std::unique_ptr<Tensor> whole;
      TF_RETURN_IF_ERROR(v1_->GetTensor(key, &whole));
      *out = *whole;
      return ::tensorflow::OkStatus();
    }
    // BundleReader::Lookup assembles slices only into a tensor of the
    // entry's type and shape.
    *out = Tensor(type, shape);
    return bundle_->Lookup(key, out);
  }
  // A slice of key into out (of the slice's shape): V2 only, where Slices
  // listed some.
  Status Slice(const std::string& key, const TensorSlice& slice, Tensor* out) {
    return bundle_->LookupSlice(key, slice, out);
  }

 private:
  std::unique_ptr<BundleReader> bundle_;
  std::unique_ptr<TensorSliceReader> v1_;
};

// The row ranges of the stored slices of entry `key` with n rows, in order
// (one range for an entry stored whole, none for no rows); an
// InvalidArgument error unless they cover the rows exactly once, each whole
// in its other dims.
Status StoredRanges(Checkpoint& reader, const std::string& key, const std::string& prefix,
                    int64_t n, std::vector<std::pair<int64_t, int64_t>>* ranges) {
  std::vector<TensorSlice> slices;
  TF_RETURN_IF_ERROR(reader.Slices(key, &slices));
  if (slices.empty()) {
    if (n > 0) ranges->emplace_back(0, n);
    return ::tensorflow::OkStatus();
  }
  for (const TensorSlice& s : slices) {
    for (int dim = 1; dim < s.dims(); ++dim)
      if (!s.IsFullAt(dim))
        return ::tensorflow::errors::InvalidArgument(
            "a stored slice of ", key, " in '", prefix, "' is cut along dimension ", dim,
            ", not along its rows only");
    ranges->emplace_back(s.start(0), s.IsFullAt(0) ? n : s.length(0));
  }
  std::sort(ranges->begin(), ranges->end());
  int64_t end = 0;
  for (const auto& [start, length] : *ranges) {
    if (start != end) {
      end = -1;  // a gap or an overlap
      break;
    }
    end += length;
  }
  if (end != n)
    return ::tensorflow::errors::InvalidArgument("the stored slices of ", key, " in '", prefix,
                                                 "' do not cover its ", n, " rows once");
  return ::tensorflow::OkStatus();
}

class RestoreOp : public TableKernel {
 public:
  explicit RestoreOp(OpKernelConstruction* ctx) : TableKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("checkpoint_format", &format_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replace", &replace_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_removed", &with_removed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("owner_rank", &owner_rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("owner_size", &owner_size_));
    OP_REQUIRES(ctx, owner_size_ >= 1 && owner_rank_ >= 0 && owner_rank_ < owner_size_,
                ::tensorflow::errors::InvalidArgument("graphmod: a table restore's owner_rank ",
                                                      owner_rank_, " is not in [0, owner_size ",
                                                      owner_size_, ")"));
  }

  void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* t) override {
    const Tensor& prefix_in = ctx->input(1);
    const Tensor& entry_in = ctx->input(2);
    OP_REQUIRES(ctx, prefix_in.dims() == 0 && entry_in.dims() == 0,
                TableError(*t, "a restore's `prefix` and `entry` must be scalars"));
    const std::string prefix(prefix_in.scalar<::tensorflow::tstring>()());
    const Entry entry{std::string(entry_in.scalar<::tensorflow::tstring>()())};
    Checkpoint reader(ctx->env(), prefix);
    OP_REQUIRES_OK(ctx, Named(*t, prefix, reader.status()));

    OP_REQUIRES_OK(ctx, CheckTypes(*t, entry, prefix, reader, with_removed_));
    Tensor format;
    OP_REQUIRES_OK(ctx, Named(*t, prefix, reader.Whole(entry("format"), &format)));
    OP_REQUIRES(ctx, format.dims() == 0,
                TableError(*t, entry("format") + " in '" + prefix + "' is not a scalar"));
    const int64_t saved_format = format.scalar<int64_t>()();
    OP_REQUIRES(ctx, saved_format == format_,
                TableError(*t, "'" + prefix + "' saves it in checkpoint format " +
                                   std::to_string(saved_format) + "; this graphmod reads format " +
                                   std::to_string(format_) +
                                   " (a checkpoint from a newer graphmod?)"));
    std::vector<std::pair<int64_t, int64_t>> pieces;
    OP_REQUIRES_OK(ctx, Pieces(*t, entry, prefix, reader, &pieces));
    Tensor removed;
    if (with_removed_)
      OP_REQUIRES_OK(ctx, Named(*t, prefix, reader.Whole(entry("removed_keys"), &removed)));
    Tensor pending[4];
    const char* pending_fields[4] = {"pending_keys", "pending_counts", "pending_last_seen",
                                     "pending_sketch"};
    for (int i = 0; i < 4; ++i)
      OP_REQUIRES_OK(ctx, Named(*t, prefix, reader.Whole(entry(pending_fields[i]), &pending[i])));
    const int64_t p = pending[0].NumElements();
    for (int i = 0; i < 3; ++i)
      OP_REQUIRES(ctx, pending[i].dims() == 1 && pending[i].NumElements() == p,
                  TableError(*t, entry(pending_fields[i]) + " has shape " +
                                     pending[i].shape().DebugString() + ", not [" +
                                     std::to_string(p) + "], in '" + prefix + "'"));

    // What Import and ImportPending would refuse only after changing rows.
    for (const auto& [start, length] : pieces) {
      Tensor counts;
      OP_REQUIRES_OK(ctx, Named(*t, prefix, Read(reader, entry, 3, start, length, &counts)));
      OP_REQUIRES_OK(ctx, NotNegative(*t, prefix, entry("counts"), counts, start));
    }
    OP_REQUIRES_OK(ctx, NotNegative(*t, prefix, entry("pending_counts"), pending[1], 0));
    // (A part of several owners' keys leaves its sketch out, below.)
    if (owner_size_ <= 1)
      OP_REQUIRES_OK(ctx, CheckSketchShards(*t, pending[3],
                                            entry("pending_sketch") + " in '" + prefix + "'"));
    const int64_t sketch = pending[3].NumElements();
    OP_REQUIRES(ctx, owner_size_ > 1 || t->sketch_size() == 0 || sketch == 0 ||
                         sketch == t->sketch_size(),
                TableError(*t, entry("pending_sketch") + " in '" + prefix + "' has " +
                                   std::to_string(sketch) + " counters but the table's sketch " +
                                   std::to_string(t->sketch_size()) +
                                   " (sketch_width or num_shards differ)"));

    // The checks passed: the table changes from here on. (Removals name
    // keys of one old rank's part: a rank without them removes nothing.)
    if (replace_) t->Clear();
    if (with_removed_) t->Remove(removed.flat<int64_t>().data(), removed.NumElements());
    const bool keep_slots = t->config().num_slots > 0;
    // Rows saved in another form than the table's (a float32 checkpoint
    // into a float16 table, say) convert on the way in.
    StorageType values_form, slots_form;
    OP_REQUIRES_OK(ctx, SavedForm(*t, entry, prefix, reader, "values", &values_form));
    OP_REQUIRES_OK(ctx, SavedForm(*t, entry, prefix, reader, "slots", &slots_form));
    std::vector<char> values_buf, slots_buf;
    int64_t restored = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto [start, length] = pieces[i];
      Tensor rows[6];
      for (int f = 0; f < 6; ++f) {
        if (f == 2 && !keep_slots) continue;  // an eval/predict table keeps no slots
        OP_REQUIRES_OK(ctx, Named(*t, prefix, Read(reader, entry, f, start, length, &rows[f])));
      }
      const int64_t kept = KeepOwned(length, rows, 6);
      const TableConfig& c = t->config();
      const void* values =
          InForm(rows[1], values_form, c.values_type, kept, c.dim, &values_buf);
      const void* slots = keep_slots ? InForm(rows[2], slots_form, c.slots_type,
                                              kept * c.num_slots, c.dim, &slots_buf)
                                     : nullptr;
      const std::string error = t->Import(
          rows[0].flat<int64_t>().data(), values, slots, rows[3].flat<int64_t>().data(),
          rows[4].flat<int64_t>().data(), rows[5].flat<int64_t>().data(), kept,
          /*replace=*/false, IntraOpRunner(ctx));
      OP_REQUIRES(ctx, error.empty(), TableError(*t, error));
      restored += kept;
    }
    // After the rows: their import clears their keys' pending counts. A
    // rank that keeps some of a part's keys leaves its sketch out (the
    // sketch counts every rank's keys).
    const int64_t kept = KeepOwned(p, pending, 3);
    const std::string error = t->ImportPending(
        pending[0].flat<int64_t>().data(), pending[1].flat<int64_t>().data(),
        pending[2].flat<int64_t>().data(), kept, pending[3].flat<int32_t>().data(),
        owner_size_ > 1 ? 0 : pending[3].NumElements());
    OP_REQUIRES(ctx, error.empty(), TableError(*t, error));
    OP_REQUIRES_OK(ctx, ScalarOutput(ctx, restored));
  }

 private:
  // Keeps the first n rows of columns[0..count) (columns[0]: the keys; an
  // uninitialized column is skipped) whose key owner_rank_ owns, moved to
  // the front in order; returns how many. All of them with one owner.
  int64_t KeepOwned(int64_t n, Tensor* columns, int count) const {
    if (owner_size_ == 1) return n;
    const int64_t* keys = columns[0].flat<int64_t>().data();
    std::vector<int64_t> owned;
    for (int64_t i = 0; i < n; ++i)
      if (OwnerRank(keys[i], owner_size_) == owner_rank_) owned.push_back(i);
    for (int c = 0; c < count; ++c) {
      if (!columns[c].IsInitialized() || n == 0) continue;
      char* data = const_cast<char*>(columns[c].tensor_data().data());
      const size_t row = columns[c].TotalBytes() / n;
      for (size_t j = 0; j < owned.size(); ++j)
        if (owned[j] != static_cast<int64_t>(j))
          std::memmove(data + j * row, data + owned[j] * row, row);
    }
    return static_cast<int64_t>(owned.size());
  }

  // The first n rows of d values in `rows`, saved as `from`, as the table
  // stores them (`to`): the tensor's own bytes, or converted into buf.
  static const void* InForm(const Tensor& rows, StorageType from, StorageType to, int64_t n,
                            int d, std::vector<char>* buf) {
    if (from == to) return rows.tensor_data().data();
    buf->resize(RowBytes(to, d) * n);
    ConvertRows(from, rows.tensor_data().data(), to, buf->data(), n, d);
    return buf->data();
  }

  // The form field ("values" or "slots") was saved in (CheckTypes has
  // checked it is one).
  static Status SavedForm(const EmbeddingTable& t, const Entry& entry, const std::string& prefix,
                          Checkpoint& reader, const char* field, StorageType* form) {
    DataType type;
    TensorShape shape;
    TF_RETURN_IF_ERROR(Named(t, prefix, reader.TypeAndShape(entry(field), &type, &shape)));
    StorageTypeOf(type, form);
    return ::tensorflow::OkStatus();
  }

  static Status Named(const EmbeddingTable& t, const std::string& prefix, const Status& s) {
    if (s.ok()) return s;
    return Status(s.code(), "graphmod table '" + t.config().name + "': cannot restore from '" +
                                prefix + "': " + std::string(s.message()));
  }

  // An error unless every entry read has the type the table's saveable
  // gives it (a tensor read as another type would abort the process); rows
  // may be in any form a table stores (row_codec.h).
  static Status CheckTypes(const EmbeddingTable& t, const Entry& entry, const std::string& prefix,
                           Checkpoint& reader, bool with_removed) {
    using ::tensorflow::DataType;
    const DataType i64 = ::tensorflow::DT_INT64, f32 = ::tensorflow::DT_FLOAT;
    const std::pair<const char*, DataType> entries[] = {
        {"format", i64},       {"keys", i64},           {"values", f32},
        {"slots", f32},        {"counts", i64},         {"last_seen", i64},
        {"versions", i64},     {"pending_keys", i64},   {"pending_counts", i64},
        {"pending_last_seen", i64}, {"pending_sketch", ::tensorflow::DT_INT32},
        {"removed_keys", i64}};
    for (const auto& [field, want] : entries) {
      if (!with_removed && std::string(field) == "removed_keys") continue;
      DataType type;
      TensorShape shape;
      TF_RETURN_IF_ERROR(Named(t, prefix, reader.TypeAndShape(entry(field), &type, &shape)));
      StorageType form;
      const bool rows = want == f32 && (std::string(field) == "values" ||
                                        std::string(field) == "slots");
      if (rows ? !StorageTypeOf(type, &form) : type != want)
        return TableError(t, entry(field) + " in '" + prefix + "' holds " +
                                 ::tensorflow::DataTypeString(type) + ", not " +
                                 (rows ? std::string("float, half, bfloat16 or uint8 (int8 rows)")
                                       : ::tensorflow::DataTypeString(want)));
    }
    return ::tensorflow::OkStatus();
  }

  // The row ranges [start, start + length) to import, in order: the stored
  // slices of `<entry>-keys`; an error unless every row field has the shape
  // the table needs and its stored slices cover its rows exactly once.
  static Status Pieces(const EmbeddingTable& t, const Entry& entry, const std::string& prefix,
                       Checkpoint& reader, std::vector<std::pair<int64_t, int64_t>>* pieces) {
    const int64_t d = t.config().dim, k = t.config().num_slots;
    TensorShape keys;
    ::tensorflow::DataType type;
    TF_RETURN_IF_ERROR(Named(t, prefix, reader.TypeAndShape(entry("keys"), &type, &keys)));
    if (keys.dims() != 1)
      return TableError(t, entry("keys") + " has shape " + keys.DebugString() + " in '" + prefix +
                               "', not a vector");
    const int64_t n = keys.dim_size(0);
    for (int f = 1; f < 6; ++f) {
      TensorShape shape;
      TF_RETURN_IF_ERROR(
          Named(t, prefix, reader.TypeAndShape(entry(kRowFields[f]), &type, &shape)));
      StorageType form = StorageType::kFloat32;
      StorageTypeOf(type, &form);
      const int64_t w = StoredWidth(form, d);  // a row's width as saved
      const bool fits = f == 1   ? shape == TensorShape({n, w})
                        : f == 2 ? shape.dims() == 3 && shape.dim_size(0) == n &&
                                       (k == 0 || shape.dim_size(1) == k) && shape.dim_size(2) == w
                                 : shape == TensorShape({n});
      if (!fits)
        return TableError(t, entry(kRowFields[f]) + " has shape " + shape.DebugString() + " in '" +
                                 prefix + "' but the table (dim " + std::to_string(d) + ", " +
                                 std::to_string(k) + " slots) needs " + std::to_string(n) +
                                 " rows of it");
    }
    // Every row field's stored slices must cover its rows once (a gap or an
    // overlap fails only once rows are read); the keys' slices are the pieces.
    for (int f = 5; f >= 0; --f) {
      pieces->clear();
      TF_RETURN_IF_ERROR(Ranges(t, entry(kRowFields[f]), prefix, reader, n, pieces));
    }
    return ::tensorflow::OkStatus();
  }

  // StoredRanges, its errors naming the table.
  static Status Ranges(const EmbeddingTable& t, const std::string& key, const std::string& prefix,
                       Checkpoint& reader, int64_t n,
                       std::vector<std::pair<int64_t, int64_t>>* ranges) {
    const Status s = StoredRanges(reader, key, prefix, n, ranges);
    if (s.ok() || s.code() != ::tensorflow::error::INVALID_ARGUMENT) return Named(t, prefix, s);
    return TableError(t, std::string(s.message()));
  }

  // An error naming the first negative count of `counts` (rows from `first`).
  static Status NotNegative(const EmbeddingTable& t, const std::string& prefix,
                            const std::string& key, const Tensor& counts, int64_t first) {
    const auto c = counts.flat<int64_t>();
    for (int64_t i = 0; i < c.size(); ++i)
      if (c(i) < 0)
        return TableError(t, key + " in '" + prefix + "' holds a negative count " +
                                 std::to_string(c(i)) + " at row " + std::to_string(first + i));
    return ::tensorflow::OkStatus();
  }

  // Rows [start, start + length) of row field f.
  static Status Read(Checkpoint& reader, const Entry& entry, int f, int64_t start,
                     int64_t length, Tensor* out) {
    ::tensorflow::DataType type;
    TensorShape shape;
    TF_RETURN_IF_ERROR(reader.TypeAndShape(entry(kRowFields[f]), &type, &shape));
    if (start == 0 && length == shape.dim_size(0)) return reader.Whole(entry(kRowFields[f]), out);
    TensorSlice slice(shape.dims());
    slice.set_start(0, start);
    slice.set_length(0, length);
    shape.set_dim(0, length);
    *out = Tensor(type, shape);
    return reader.Slice(entry(kRowFields[f]), slice, out);
  }

  int64_t format_;
  bool replace_;
  bool with_removed_;
  int owner_rank_;
  int owner_size_;
};

REGISTER_KERNEL_BUILDER(Name("GraphmodTableRestore").Device(::tensorflow::DEVICE_CPU), RestoreOp);

// GraphmodCheckpointRowSlices: what a reader of one stored slice at a time
// (graphmod.checkpoint.warm_start) reads, from the bundle's index alone.
class RowSlicesOp : public ::tensorflow::OpKernel {
 public:
  explicit RowSlicesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& prefix_in = ctx->input(0);
    const Tensor& key_in = ctx->input(1);
    OP_REQUIRES(ctx, prefix_in.dims() == 0 && key_in.dims() == 0,
                ::tensorflow::errors::InvalidArgument(
                    "graphmod: GraphmodCheckpointRowSlices takes a scalar prefix and entry"));
    const std::string prefix(prefix_in.scalar<::tensorflow::tstring>()());
    const std::string key(key_in.scalar<::tensorflow::tstring>()());
    Checkpoint reader(ctx->env(), prefix);
    DataType type;
    TensorShape shape;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    Status s = reader.status();
    if (s.ok()) s = reader.TypeAndShape(key, &type, &shape);
    if (s.ok() && shape.dims() == 0)
      s = ::tensorflow::errors::InvalidArgument(key, " in '", prefix, "' is a scalar, not rows");
    if (s.ok()) s = StoredRanges(reader, key, prefix, shape.dim_size(0), &ranges);
    OP_REQUIRES(ctx, s.ok(),
                Status(s.code(), "graphmod: cannot read the stored slices of '" + key +
                                     "' in '" + prefix + "': " + std::string(s.message())));
    const int64_t k = static_cast<int64_t>(ranges.size());
    Tensor* starts = nullptr;
    Tensor* lengths = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &starts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k}), &lengths));
    for (int64_t i = 0; i < k; ++i) {
      starts->vec<int64_t>()(i) = ranges[i].first;
      lengths->vec<int64_t>()(i) = ranges[i].second;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("GraphmodCheckpointRowSlices").Device(::tensorflow::DEVICE_CPU),
                        RowSlicesOp);

}  // namespace
}  // namespace graphmod
