// Kernels of the exchange plan ops (ops.cc): thin wrappers over
// native/exchange_plan.h, which holds the logic and its tests.
#include <algorithm>
#include <string>
#include <vector>

#include "native/exchange_plan.h"
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

// Output i of the op (or of one of its output lists) holds v.
template <typename T>
Status VectorOutput(OpKernelContext* ctx, OpOutputList* list, int i, const std::vector<T>& v) {
  Tensor* out = nullptr;
  const TensorShape shape({static_cast<int64_t>(v.size())});
  TF_RETURN_IF_ERROR(list != nullptr ? list->allocate(i, shape, &out)
                                     : ctx->allocate_output(i, shape, &out));
  std::copy(v.begin(), v.end(), out->flat<T>().data());
  return ::tensorflow::OkStatus();
}

// The op's widths attribute: n of them, each at least `least` (a row's
// floats; 2 where a flag follows a row of at least one).
Status ReadWidths(OpKernelConstruction* ctx, int n, std::vector<int32_t>* widths,
                  int least = 1) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("widths", widths));
  if (static_cast<int>(widths->size()) != n)
    return errors::InvalidArgument("graphmod exchange: widths has ", widths->size(),
                                   " entries for ", n, " tables");
  for (int i = 0; i < n; ++i)
    if ((*widths)[i] < least)
      return errors::InvalidArgument("graphmod exchange: table ", i, "'s width is ",
                                     (*widths)[i], ", below ", least);
  return ::tensorflow::OkStatus();
}

class RouteOp : public OpKernel {
 public:
  explicit RouteOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_counts", &with_counts_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    std::vector<IdSpan> spans;
    for (int i = 0; i < n_; ++i)
      spans.push_back({ids[i].flat<int64_t>().data(), ids[i].NumElements()});
    Route route;
    const std::string error = PlanRoute(spans, size_, widths_, &route);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));

    const int64_t m = static_cast<int64_t>(route.keys.size());
    const int columns = with_counts_ ? 3 : 2;
    Tensor* sent = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, columns}), &sent));
    int64_t* row = sent->flat<int64_t>().data();
    for (int64_t e = 0; e < m; ++e) {
      *row++ = route.keys[e];
      if (with_counts_) *row++ = route.counts[e];
      *row++ = route.tables[e];
    }
    OP_REQUIRES_OK(ctx, VectorOutput(ctx, nullptr, 1, route.splits));
    OP_REQUIRES_OK(ctx, VectorOutput(ctx, nullptr, 2, route.float_splits));
    OpOutputList at, occurrence;
    OP_REQUIRES_OK(ctx, ctx->output_list("at", &at));
    OP_REQUIRES_OK(ctx, ctx->output_list("occurrence", &occurrence));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &at, i, route.at[i]));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &occurrence, i, route.occurrence[i]));
    }
  }

 private:
  int n_ = 0, size_ = 1;
  bool with_counts_ = true;
  std::vector<int32_t> widths_;
};

class ServeOp : public OpKernel {
 public:
  explicit ServeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& received = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    OP_REQUIRES(ctx,
                received.dims() == 2 && (received.dim_size(1) == 2 || received.dim_size(1) == 3),
                errors::InvalidArgument("graphmod exchange: received must be [n, 3] (id, count, "
                                        "table) or [n, 2] (id, table), got shape ",
                                        received.shape().DebugString()));
    OP_REQUIRES(ctx, splits.dims() == 1 && splits.NumElements() >= 1,
                errors::InvalidArgument("graphmod exchange: received_splits must be a vector "
                                        "with an entry per rank, got shape ",
                                        splits.shape().DebugString()));
    const int64_t m = received.dim_size(0), columns = received.dim_size(1);
    const int64_t* in = received.flat<int64_t>().data();
    std::vector<int64_t> keys(m), counts(columns == 3 ? m : 0), tables(m);
    for (int64_t e = 0; e < m; ++e) {
      keys[e] = in[e * columns];
      if (columns == 3) counts[e] = in[e * columns + 1];
      tables[e] = in[e * columns + columns - 1];
    }
    Serve serve;
    const std::string error =
        PlanServe({keys.data(), columns == 3 ? counts.data() : nullptr, tables.data(), m,
                   splits.flat<int32_t>().data(), static_cast<int>(splits.NumElements())},
                  widths_, &serve);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));

    OpOutputList lookups, entry_keys, last, first, count, out_at;
    OP_REQUIRES_OK(ctx, ctx->output_list("lookups", &lookups));
    OP_REQUIRES_OK(ctx, ctx->output_list("keys", &entry_keys));
    OP_REQUIRES_OK(ctx, ctx->output_list("last", &last));
    OP_REQUIRES_OK(ctx, ctx->output_list("first", &first));
    OP_REQUIRES_OK(ctx, ctx->output_list("count", &count));
    OP_REQUIRES_OK(ctx, ctx->output_list("out_at", &out_at));
    for (int i = 0; i < n_; ++i) {
      const Serve::Table& t = serve.tables[i];
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &lookups, i, t.lookups));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &entry_keys, i, t.keys));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &last, i, t.last));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &first, i, t.first));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &count, i, t.count));
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &out_at, i, t.out_at));
    }
    OP_REQUIRES_OK(ctx, VectorOutput(ctx, nullptr, 6 * n_, serve.back_splits));
  }

 private:
  int n_ = 0;
  std::vector<int32_t> widths_;
};

class ScatterGradientsOp : public OpKernel {
 public:
  explicit ScatterGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_, 2));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& sent = ctx->input(0);
    OP_REQUIRES(ctx, sent.dims() == 2 && (sent.dim_size(1) == 2 || sent.dim_size(1) == 3),
                errors::InvalidArgument("graphmod exchange: sent must be [n, 3] or [n, 2], got "
                                        "shape ", sent.shape().DebugString()));
    const int64_t m = sent.dim_size(0), columns = sent.dim_size(1);
    const int64_t* in = sent.flat<int64_t>().data();
    std::vector<int64_t> keys(m);
    std::vector<int32_t> tables(m);
    for (int64_t e = 0; e < m; ++e) {
      keys[e] = in[e * columns];
      const int64_t table = in[e * columns + columns - 1];
      OP_REQUIRES(ctx, table >= 0 && table < n_,
                  errors::InvalidArgument("graphmod exchange: entry ", e, " names table ", table,
                                          " of ", n_));
      tables[e] = static_cast<int32_t>(table);
    }
    OpInputList ids, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &ids));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    std::vector<GradientSpan> spans;
    for (int i = 0; i < n_; ++i) {
      const int64_t n = ids[i].NumElements();
      OP_REQUIRES(ctx, grads[i].NumElements() == n * (widths_[i] - 1),
                  errors::InvalidArgument("graphmod exchange: table ", i, " has ", n,
                                          " gradient keys but ", grads[i].NumElements(),
                                          " gradient floats (dim ", widths_[i] - 1, ")"));
      spans.push_back({ids[i].flat<int64_t>().data(), grads[i].flat<float>().data(), n});
    }
    std::vector<float> floats;
    const std::string error = ScatterGradients(keys, tables, widths_, spans, &floats);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));
    OP_REQUIRES_OK(ctx, VectorOutput(ctx, nullptr, 0, floats));
  }

 private:
  int n_ = 0;
  std::vector<int32_t> widths_;
};

class GatherGradientsOp : public OpKernel {
 public:
  explicit GatherGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_, 2));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& received = ctx->input(0);
    OpInputList keys_in, at_in;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys_in));
    OP_REQUIRES_OK(ctx, ctx->input_list("out_at", &at_in));
    std::vector<std::vector<int64_t>> keys(n_);
    std::vector<std::vector<int32_t>> at(n_);
    for (int i = 0; i < n_; ++i) {
      const auto k = keys_in[i].flat<int64_t>();
      const auto a = at_in[i].flat<int32_t>();
      keys[i].assign(k.data(), k.data() + k.size());
      at[i].assign(a.data(), a.data() + a.size());
    }
    std::vector<std::vector<int64_t>> reached;
    std::vector<std::vector<float>> rows;
    const std::string error = GatherGradients(received.flat<float>().data(),
                                              received.NumElements(), widths_, keys, at,
                                              &reached, &rows);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));
    OpOutputList reached_out, rows_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("reached_keys", &reached_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("rows", &rows_out));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK(ctx, VectorOutput(ctx, &reached_out, i, reached[i]));
      Tensor* out = nullptr;
      const int64_t dim = widths_[i] - 1;
      const TensorShape shape({static_cast<int64_t>(reached[i].size()), dim});
      OP_REQUIRES_OK(ctx, rows_out.allocate(i, shape, &out));
      std::copy(rows[i].begin(), rows[i].end(), out->flat<float>().data());
    }
  }

 private:
  int n_ = 0;
  std::vector<int32_t> widths_;
};

class PackOp : public OpKernel {
 public:
  explicit PackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("H", &h_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_));
    OP_REQUIRES(ctx, h_ == 0 || h_ == n_,
                errors::InvalidArgument("graphmod exchange: handles of ", h_, " tables for ", n_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, handles, last, first, count, out_at;
    OP_REQUIRES_OK(ctx, ctx->input_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("handles", &handles));
    OP_REQUIRES_OK(ctx, ctx->input_list("last", &last));
    OP_REQUIRES_OK(ctx, ctx->input_list("first", &first));
    OP_REQUIRES_OK(ctx, ctx->input_list("count", &count));
    OP_REQUIRES_OK(ctx, ctx->input_list("out_at", &out_at));
    std::vector<PackTable> tables;
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) {
      const Tensor& r = rows[i];
      OP_REQUIRES(ctx, r.dims() == 2,
                  errors::InvalidArgument("graphmod exchange: table ", i, "'s rows must be a "
                                          "matrix, got shape ", r.shape().DebugString()));
      const int64_t entries = out_at[i].NumElements();
      OP_REQUIRES(ctx, last[i].NumElements() == entries && first[i].NumElements() == entries &&
                           count[i].NumElements() == entries,
                  errors::InvalidArgument("graphmod exchange: table ", i, "'s plan has entries "
                                          "of different counts"));
      OP_REQUIRES(ctx, h_ == 0 || handles[i].NumElements() == r.dim_size(0),
                  errors::InvalidArgument("graphmod exchange: table ", i, " has ",
                                          handles[i].NumElements(), " handles for ",
                                          r.dim_size(0), " rows"));
      // With handles, each row is followed by its entry's refused lookups.
      OP_REQUIRES(ctx, widths_[i] == r.dim_size(1) + (h_ ? 1 : 0),
                  errors::InvalidArgument("graphmod exchange: table ", i, " has width ",
                                          widths_[i], " for rows of dim ", r.dim_size(1),
                                          h_ ? " and a refused count" : ""));
      tables.push_back({r.flat<float>().data(), r.dim_size(0),
                        h_ ? handles[i].flat<int64_t>().data() : nullptr,
                        last[i].flat<int32_t>().data(), first[i].flat<int32_t>().data(),
                        count[i].flat<int32_t>().data(), out_at[i].flat<int32_t>().data(),
                        entries, static_cast<int>(r.dim_size(1)), widths_[i]});
      total += entries * widths_[i];
    }
    Tensor* back = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &back));
    float* out = back->flat<float>().data();
    std::fill(out, out + total, 0.0f);  // (a plan that misses a float sends no stale memory)
    const std::string error = PackRows(tables, total, out);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));
  }

 private:
  int n_ = 0, h_ = 0;
  std::vector<int32_t> widths_;
};

class UnpackOp : public OpKernel {
 public:
  explicit UnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_));
    OP_REQUIRES(ctx, static_cast<int>(dims_.size()) == n_,
                errors::InvalidArgument("graphmod exchange: dims has ", dims_.size(),
                                        " entries for ", n_, " tables"));
    for (int i = 0; i < n_; ++i)
      OP_REQUIRES(ctx, dims_[i] >= 1 && (widths_[i] == dims_[i] || widths_[i] == dims_[i] + 1),
                  errors::InvalidArgument("graphmod exchange: table ", i, " has dim ", dims_[i],
                                          " and width ", widths_[i], " (the dim, or one more)"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& returned = ctx->input(0);
    OpInputList at, occurrence;
    OP_REQUIRES_OK(ctx, ctx->input_list("at", &at));
    OP_REQUIRES_OK(ctx, ctx->input_list("occurrence", &occurrence));
    OpOutputList rows, no_row;
    OP_REQUIRES_OK(ctx, ctx->output_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->output_list("no_row", &no_row));
    std::vector<UnpackTable> tables;
    for (int i = 0; i < n_; ++i) {
      const int64_t n = at[i].NumElements();
      OP_REQUIRES(ctx, occurrence[i].NumElements() == n,
                  errors::InvalidArgument("graphmod exchange: table ", i, " has ", n,
                                          " positions for ", occurrence[i].NumElements(),
                                          " occurrences"));
      Tensor *r = nullptr, *none = nullptr;
      OP_REQUIRES_OK(ctx, rows.allocate(i, TensorShape({n, dims_[i]}), &r));
      OP_REQUIRES_OK(ctx, no_row.allocate(i, TensorShape({n}), &none));
      tables.push_back({at[i].flat<int32_t>().data(), occurrence[i].flat<int32_t>().data(), n,
                        dims_[i], widths_[i], r->flat<float>().data(), none->flat<bool>().data()});
    }
    const std::string error = UnpackRows(returned.flat<float>().data(), returned.NumElements(),
                                         tables);
    OP_REQUIRES(ctx, error.empty(), errors::InvalidArgument("graphmod exchange: ", error));
  }

 private:
  int n_ = 0;
  std::vector<int32_t> dims_, widths_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("GraphmodExchangePack").Device(DEVICE_CPU), PackOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeUnpack").Device(DEVICE_CPU), UnpackOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeGatherGradients").Device(DEVICE_CPU),
                        GatherGradientsOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeScatterGradients").Device(DEVICE_CPU),
                        ScatterGradientsOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeRoute").Device(DEVICE_CPU), RouteOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeServe").Device(DEVICE_CPU), ServeOp);

}  // namespace graphmod
