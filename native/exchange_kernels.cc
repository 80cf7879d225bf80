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

Status ReadWidths(OpKernelConstruction* ctx, int n, std::vector<int32_t>* widths) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("widths", widths));
  if (static_cast<int>(widths->size()) != n)
    return errors::InvalidArgument("graphmod exchange: widths has ", widths->size(),
                                   " entries for ", n, " tables");
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
    for (int i = 0; i < n_; ++i) spans.push_back({ids[i].flat<int64_t>().data(), ids[i].NumElements()});
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
    OP_REQUIRES(ctx, received.dims() == 2 && (received.dim_size(1) == 2 || received.dim_size(1) == 3),
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
    OP_REQUIRES_OK(ctx, ReadWidths(ctx, n_, &widths_));
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
      tables[e] = static_cast<int32_t>(in[e * columns + columns - 1]);
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

}  // namespace

REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeScatterGradients").Device(DEVICE_CPU),
                        ScatterGradientsOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeRoute").Device(DEVICE_CPU), RouteOp);
REGISTER_KERNEL_BUILDER(Name("GraphmodExchangeServe").Device(DEVICE_CPU), ServeOp);

}  // namespace graphmod
