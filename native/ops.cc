// Op registrations and shape functions of graphmod's table ops.
// Kernels live in kernels.cc; the table itself in table.h.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace graphmod {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// values = keys.shape + [dim]
Status RowsShape(InferenceContext* c, int keys_input, int output) {
  int dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(keys_input), c->Vector(dim), &out));
  c->set_output(output, out);
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("GraphmodTable")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("table_name: string")
    .Attr("dim: int")
    .Attr("num_slots: int = 0")
    .Attr("slot_init: list(float) = []")
    .Attr("initializer: string = 'truncated_normal'")
    .Attr("init_a: float = 0.0")
    .Attr("init_b: float = 0.05")
    .Attr("seed: int = 0")
    .Attr("num_shards: int = 16")
    .Attr("missing_is_initializer: bool = true")
    .Attr("default_value: float = 0.0")
    .Attr("max_rows: int = -1")
    .Attr("when_full: string = 'lru'")  // checked once, by the kernel (WhenFull::Parse)
    .Attr("sketch_width: int = 0")
    .Attr("layout: string = 'arena'")  // checked by the kernel (ValidateConfig)
    .Attr("memory_budget: float = 0.0")  // 0: no disk tier; (0, 1]: a fraction of rows; bytes
    .Attr("storage_path: string = ''")
    .Attr("storage_dtype: string = 'float32'")  // how rows are stored (row_codec.h)
    .Attr("slot_storage_dtype: string = ''")    // '': as storage_dtype
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Creates (on first run) or finds a graphmod embedding table.");

REGISTER_OP("GraphmodTableFindOrInsert")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("now: int64")
    .Output("values: float")
    .Output("handles: int64")
    .Attr("dim: int")
    .Attr("access_threshold: int = -1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, 1, 0));
      c->set_output(1, c->input(1));
      return ::tensorflow::OkStatus();
    })
    .Doc("Training lookup: rows of all keys, inserting new keys (a key without a row is "
         "admitted on its access_threshold-th sighting); also row handles.");

REGISTER_OP("GraphmodTableFind")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("values: float")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RowsShape(c, 1, 0); })
    .Doc("Read-only lookup; keys without a row get the table's missing value.");

REGISTER_OP("GraphmodTableApply")
    .Input("table: resource")
    .Input("ids: int64")
    .Input("grads: float")
    .Input("hparams: float")
    .Attr("optimizer: string")  // an OptimizerSpec's name, checked by the kernel
    .Attr("by_address: bool = false")
    .Attr("nesterov: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Sparse optimizer step on the rows of ids (keys, or row handles when by_address).");

// Fused forms: one op for the lookups (or updates) of many tables in a step.
// Entry i reads table i; a table may appear in several entries (features
// sharing it): it then sees one batch, and an apply sums a key's gradients
// over all its entries.
namespace {

// values[i] = keys[i].shape + [dims[i]] for the N entries.
Status FusedRowsShape(InferenceContext* c, bool with_handles) {
  int n;
  std::vector<int> dims;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
  if (dims.size() != static_cast<size_t>(n))
    return ::tensorflow::errors::InvalidArgument("dims has ", dims.size(), " entries for ", n,
                                                 " tables");
  for (int i = 0; i < n; ++i) {
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->Concatenate(c->input(n + i), c->Vector(dims[i]), &out));
    c->set_output(i, out);
    if (with_handles) c->set_output(n + i, c->input(n + i));
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("GraphmodFusedFindOrInsert")
    .Input("tables: N * resource")
    .Input("keys: N * int64")
    .Input("now: N * int64")
    .Output("values: N * float")
    .Output("handles: N * int64")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .Attr("access_thresholds: list(int)")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return FusedRowsShape(c, true); })
    .Doc("GraphmodTableFindOrInsert of N (table, keys, now) entries in one op.");

REGISTER_OP("GraphmodFusedFind")
    .Input("tables: N * resource")
    .Input("keys: N * int64")
    .Output("values: N * float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return FusedRowsShape(c, false); })
    .Doc("GraphmodTableFind of N (table, keys) entries in one op.");

REGISTER_OP("GraphmodFusedApply")
    .Input("tables: N * resource")
    .Input("ids: N * int64")
    .Input("grads: N * float")
    .Input("hparams: N * float")
    .Attr("N: int >= 1")
    .Attr("optimizers: list(string)")
    .Attr("nesterov: list(bool)")
    .Attr("by_address: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("GraphmodTableApply of N entries in one op; everything is checked before any "
         "table changes.");

// Rows as float32, or (Tvalues / Tslots the table's stored dtype: half,
// bfloat16, or uint8 for int8 rows of dim + 8 bytes) as the table stores them.
REGISTER_OP("GraphmodTableExport")
    .Input("table: resource")
    .Input("min_version: int64")
    .Output("keys: int64")
    .Output("values: Tvalues")
    .Output("slots: Tslots")
    .Output("counts: int64")
    .Output("last_seen: int64")
    .Output("versions: int64")
    .Attr("dim: int")
    .Attr("num_slots: int")
    .Attr("Tvalues: {float, half, bfloat16, uint8} = DT_FLOAT")
    .Attr("Tslots: {float, half, bfloat16, uint8} = DT_FLOAT")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int dim, num_slots;
      ::tensorflow::DataType tvalues, tslots;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
      TF_RETURN_IF_ERROR(c->GetAttr("Tvalues", &tvalues));
      TF_RETURN_IF_ERROR(c->GetAttr("Tslots", &tslots));
      // (an int8 row is its scale and bias, 8 bytes, then dim codes)
      auto width = [&](::tensorflow::DataType t) {
        return c->MakeDim(t == ::tensorflow::DT_UINT8 ? dim + 8 : dim);
      };
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, width(tvalues)));
      c->set_output(2, c->MakeShape({n, c->MakeDim(num_slots), width(tslots)}));
      for (int i = 3; i < 6; ++i) c->set_output(i, c->Vector(n));
      return ::tensorflow::OkStatus();
    })
    .Doc("Every row with version >= min_version: keys, values, slots and metadata.");

REGISTER_OP("GraphmodTableImport")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("values: Tvalues")
    .Input("slots: Tslots")
    .Input("counts: int64")
    .Input("last_seen: int64")
    .Input("versions: int64")
    .Attr("Tvalues: {float, half, bfloat16, uint8} = DT_FLOAT")
    .Attr("Tslots: {float, half, bfloat16, uint8} = DT_FLOAT")
    .Attr("replace: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Inserts or overwrites rows (clearing the table first when replace).");

REGISTER_OP("GraphmodTableTierInfo")
    .Input("table: resource")
    .Output("memory_rows: int64")
    .Output("disk_rows: int64")
    .Output("promoted: int64")
    .Output("spilled: int64")
    .Output("disk_reads: int64")
    .Output("disk_read_bytes: int64")
    .Output("read_passes: int64")
    .Output("disk_file_bytes: int64")
    .Output("disk_live_bytes: int64")
    .Output("compactions: int64")
    .Output("compaction_ms: int64")
    .Output("prefetched: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 12; ++i) c->set_output(i, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("The memory and disk tiers of a table with a memory budget (zeros without): rows "
         "in each, rows brought up from disk by training steps (of GraphmodTableInfo's lookups), "
         "rows moved down, records and bytes read, batched read passes, the segment files' "
         "bytes and their live share, segment compactions and their time, and the rows "
         "GraphmodTablePrefetch brought up ahead of their step.");

REGISTER_OP("GraphmodTablePrefetch")
    .Input("table: resource")
    .Input("keys: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("A hint for a table with a disk tier (nothing without one): brings the cold rows of "
         "keys the next training step will look up into memory, and keeps them there until "
         "that step. Rows move whole and none changes, so training is the same without it.");

REGISTER_OP("GraphmodTableInfo")
    .Input("table: resource")
    .Output("size: int64")
    .Output("memory_bytes: int64")
    .Output("version: int64")
    .Output("admitted: int64")
    .Output("rejected: int64")
    .Output("evicted: int64")
    .Output("pending: int64")
    .Output("latest: int64")
    .Output("stale: int64")
    .Output("ids_looked_up: int64")
    .Output("lookups: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 11; ++i) c->set_output(i, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Rows, bytes held, Apply calls so far, the admission/eviction counters, and the "
         "ids training lookups were given (every occurrence) and the distinct ones per call.");

REGISTER_OP("GraphmodTableEvict")
    .Input("table: resource")
    .Input("before: int64")
    .Output("evicted: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Removes every row and pending key last seen before `before`; returns rows removed.");

REGISTER_OP("GraphmodTableExportPending")
    .Input("table: resource")
    .Input("min_version: int64")
    .Output("keys: int64")
    .Output("counts: int64")
    .Output("last_seen: int64")
    .Output("sketch: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(3, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("Keys counted towards admission that have no row yet, counted at version >= "
         "min_version, with their counts; the admission sketch's counters, a row per "
         "shard (no columns when counting exactly).");

REGISTER_OP("GraphmodTableImportPending")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("counts: int64")
    .Input("last_seen: int64")
    .Input("sketch: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Sets the admission counts of keys that have no row, and the sketch's counters.");

REGISTER_OP("GraphmodTableRemove")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("removed: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Removes the rows of keys; returns how many existed.");

REGISTER_OP("GraphmodTableTrackRemovals")
    .Input("table: resource")
    .Output("version: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("From now on notes every key that loses its row or admission count (incremental "
         "checkpoints' tombstones); returns the table's version.");

REGISTER_OP("GraphmodTableExportRemoved")
    .Input("table: resource")
    .Input("since: int64")
    .Output("keys: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("Keys removed at version >= since (noted since TrackRemovals); forgets older notes.");

REGISTER_OP("GraphmodTableSave")
    .Input("tables: N * resource")
    .Input("prefix: string")
    .Input("min_versions: int64")
    .Attr("N: int >= 1")
    .Attr("checkpoint_format: int")
    .Attr("with_removed: bool = false")
    .Attr("owned_only: list(bool) = []")
    .Attr("owner_rank: int = 0")
    .Attr("owner_size: int = 1")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Writes a tensor bundle at `prefix` holding, per table, the entries its saveable "
         "saves (rows and pending ids at version >= its min_versions entry, the sketch, the "
         "format number, and with_removed the keys removed since that version - 1), "
         "copying one table shard at a time. A table whose owned_only entry is true (a "
         "copy of the whole table on every rank) writes only the rows, pending ids and "
         "removed keys that rank owner_rank of owner_size owns (OwnerRank), gathered in "
         "memory first, so that its part of a checkpoint holds a hash range like a "
         "sharded table's.");

REGISTER_OP("GraphmodTableRestore")
    .Input("table: resource")
    .Input("prefix: string")
    .Input("entry: string")
    .Output("rows: int64")
    .Attr("checkpoint_format: int")
    .Attr("replace: bool = true")
    .Attr("with_removed: bool = false")
    .Attr("owner_rank: int = 0")
    .Attr("owner_size: int = 1")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Imports the table's entries `<entry>-*` of the tensor bundle at `prefix` (as "
         "GraphmodTableSave wrote them) one stored slice of rows at a time, then its pending "
         "ids; with replace the table is cleared first, with_removed the entry's removed keys "
         "are removed first (a delta). With owner_size > 1, only the rows and pending ids "
         "whose keys rank owner_rank owns (graphmod.distributed.partition) and not the "
         "sketch. Checks the format, every type and shape before any change. Returns the rows "
         "imported. A V1 checkpoint is read too, each entry whole.");

REGISTER_OP("GraphmodCheckpointRowSlices")
    .Input("prefix: string")
    .Input("entry: string")
    .Output("starts: int64")
    .Output("lengths: int64")
    .SetIsStateful()  // reads a file, which may change between runs
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc("The row ranges [start, start + length) of the stored slices of checkpoint entry "
         "`entry` at `prefix`, in order: one range for an entry stored whole (or in a V1 "
         "checkpoint), none for no rows. Fails unless they cover the entry's rows exactly once, "
         "each cut along rows only. A reader that restores one range at a time (RestoreV2 with "
         "that slice) reads each stored slice once and never the entry whole.");

REGISTER_OP("GraphmodTableClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Removes every row.");

}  // namespace graphmod

namespace graphmod {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;

// Per table i of N: a vector as long as ids i (flattened).
Status PerIdVectors(InferenceContext* c, int first_output, int n) {
  for (int i = 0; i < n; ++i) {
    DimensionHandle count = c->NumElements(c->input(i));
    c->set_output(first_output + i, c->Vector(count));
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("GraphmodExchangeRoute")
    .Input("ids: N * int64")
    .Output("sent: int64")
    .Output("splits: int32")
    .Output("float_splits: int32")
    .Output("at: N * int32")
    .Output("occurrence: N * int32")
    .Attr("N: int >= 1")
    .Attr("size: int >= 1")
    .Attr("widths: list(int)")
    .Attr("with_counts: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      int n, size;
      bool with_counts;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      TF_RETURN_IF_ERROR(c->GetAttr("with_counts", &with_counts));
      c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, with_counts ? 3 : 2));
      c->set_output(1, c->Vector(size));
      c->set_output(2, c->Vector(size));
      TF_RETURN_IF_ERROR(PerIdVectors(c, 3, n));
      return PerIdVectors(c, 3 + n, n);
    })
    .Doc("The sender's plan of an exchange with keys' owners (native/exchange_plan.h): "
         "each table's distinct ids as rows (id, count, table) or (id, table), by owner "
         "rank, then table, then first occurrence; entries and floats per owner; per id, "
         "its row's first float in the buffer sent back (widths[table] floats an entry) "
         "and its occurrence among its key's ids.");

REGISTER_OP("GraphmodExchangeServe")
    .Input("received: int64")
    .Input("received_splits: int32")
    .Output("lookups: N * int64")
    .Output("keys: N * int64")
    .Output("last: N * int32")
    .Output("first: N * int32")
    .Output("count: N * int32")
    .Output("out_at: N * int32")
    .Output("back_splits: int32")
    .Attr("N: int >= 1")
    .Attr("widths: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle received;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &received));
      for (int i = 0; i < 6 * n; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(6 * n, c->input(1));
      return ::tensorflow::OkStatus();
    })
    .Doc("The owner's plan of an exchange (native/exchange_plan.h) from the rows "
         "(id, count, table) or (id, table) that arrived, received_splits per source rank: "
         "per table, the keys to look up (each as often as it occurred), and per entry its "
         "key, the lookup holding its key's row, where its own lookups start and how many, "
         "and its row's first float in the buffer sent back; floats per source rank.");

REGISTER_OP("GraphmodExchangeScatterGradients")
    .Input("sent: int64")
    .Input("keys: N * int64")
    .Input("grads: N * float")
    .Output("floats: float")
    .Attr("N: int >= 1")
    .Attr("widths: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("Each table's gradient rows (grads i: [n, widths[i] - 1] of keys i) summed into "
         "the entries of `sent` (GraphmodExchangeRoute's, which sent the lookups' ids), "
         "laid out as the rows that came back: per entry its summed gradient, then 1 when "
         "a gradient reached it, else 0 (native/exchange_plan.h).");

REGISTER_OP("GraphmodExchangeGatherGradients")
    .Input("received: float")
    .Input("keys: N * int64")
    .Input("out_at: N * int32")
    .Output("reached_keys: N * int64")
    .Output("rows: N * float")
    .Attr("N: int >= 1")
    .Attr("widths: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      std::vector<int> widths;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("widths", &widths));
      if (static_cast<int>(widths.size()) != n)
        return ::tensorflow::errors::InvalidArgument("widths has ", widths.size(),
                                                     " entries for ", n, " tables");
      for (int i = 0; i < n; ++i) {
        if (widths[i] < 2)
          return ::tensorflow::errors::InvalidArgument("table ", i, "'s width ", widths[i],
                                                       " holds no gradient and flag");
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(n + i, c->Matrix(InferenceContext::kUnknownDim, widths[i] - 1));
      }
      return ::tensorflow::OkStatus();
    })
    .Doc("The owner's side of GraphmodExchangeScatterGradients: from the floats received "
         "(entries at out_at i, of keys i, as GraphmodExchangeServe placed them), per "
         "table the keys a gradient reached and their gradient rows.");

REGISTER_OP("GraphmodExchangePack")
    .Input("rows: N * float")
    .Input("handles: H * int64")
    .Input("last: N * int32")
    .Input("first: N * int32")
    .Input("count: N * int32")
    .Input("out_at: N * int32")
    .Output("back: float")
    .Attr("N: int >= 1")
    .Attr("H: int >= 0")
    .Attr("widths: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc("The rows an owner sends back (native/exchange_plan.h's PackRows): per entry of "
         "table i (GraphmodExchangeServe's plan), rows i's row of its key's last lookup at "
         "out_at, then, where widths[i] exceeds the rows' dim, how many of its lookups were "
         "refused a row (handles i below 0; H is N then, else 0).");

REGISTER_OP("GraphmodExchangeUnpack")
    .Input("returned: float")
    .Input("at: N * int32")
    .Input("occurrence: N * int32")
    .Output("rows: N * float")
    .Output("no_row: N * bool")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .Attr("widths: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      std::vector<int> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      if (static_cast<int>(dims.size()) != n)
        return ::tensorflow::errors::InvalidArgument("dims has ", dims.size(), " entries for ",
                                                     n, " tables");
      for (int i = 0; i < n; ++i) {
        if (dims[i] < 1)
          return ::tensorflow::errors::InvalidArgument("table ", i, "'s dim is ", dims[i]);
        DimensionHandle ids = c->NumElements(c->input(1 + i));
        c->set_output(i, c->Matrix(ids, dims[i]));
        c->set_output(n + i, c->Vector(ids));
      }
      return ::tensorflow::OkStatus();
    })
    .Doc("The sender's rows from what came back (native/exchange_plan.h's UnpackRows): per "
         "id of table i, the dims[i] floats at `at`, and (where widths[i] exceeds dims[i]) "
         "whether it is one of its key's lookups that were refused a row.");

}  // namespace graphmod
