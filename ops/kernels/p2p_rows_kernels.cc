// Point-to-point ops for parameter servers with sparse gradients, on the
// runtime's table accumulators and row store: only touched or changed rows
// travel. A worker pushes the rows of its gradient to the owner
// (KungfuPushRows), the owner takes their sums (KungfuTakeRows), applies
// them and publishes the rows its update changed (KungfuSaveRows); the other
// workers fetch the rows changed since their last fetch (KungfuRequestRows).
#include <numeric>

#include "runtime_access.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kungfu_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Tensor;
using tensorflow::TensorShape;

#define KUNGFU_ROWS_TYPES "T: {half, bfloat16, float, double, int32, int64}"

namespace {

// Rows of a table of `shape` (rank >= 1): dim 0 counts rows. `what` names
// where the shape came from in the error.
absl::Status rows_desc(tensorflow::DataType dt, const TensorShape &shape, const std::string &what,
                       kungfu::RowsDesc *out) {
  if (shape.dims() < 1) {
    return absl::InvalidArgumentError(what + ": a table needs at least one dimension (rows), got shape " +
                                      shape.DebugString());
  }
  kungfu::DType dtype;
  TF_RETURN_IF_ERROR(to_kungfu_dtype(dt, &dtype));
  size_t row_len = 1;
  for (int d = 1; d < shape.dims(); ++d) row_len *= static_cast<size_t>(shape.dim_size(d));
  *out = kungfu::RowsDesc{dtype, static_cast<size_t>(shape.dim_size(0)), row_len};
  return absl::OkStatus();
}

// Row indices of any integer dtype, as int64.
std::vector<int64_t> as_int64(const Tensor &indices) {
  std::vector<int64_t> out(indices.NumElements());
  if (indices.dtype() == tensorflow::DT_INT32) {
    auto v = indices.flat<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = v(i);
  } else {
    auto v = indices.flat<int64_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = v(i);
  }
  return out;
}

// Allocates outputs `indices_at` ([n], int64) and `indices_at + 1` ([n] + row shape).
absl::Status allocate_rows(OpKernelContext *ctx, int indices_at, const TensorShape &table, int64_t n, Tensor **indices,
                           Tensor **values) {
  TensorShape shape = table;
  shape.set_dim(0, n);
  TF_RETURN_IF_ERROR(ctx->allocate_output(indices_at, TensorShape({n}), indices));
  return ctx->allocate_output(indices_at + 1, shape, values);
}

// Outputs: indices [n] (int64), values [n] + the table's row shape, and a scalar.
absl::Status rows_outputs(tensorflow::shape_inference::InferenceContext *c) {
  PartialTensorShape table;
  TF_RETURN_IF_ERROR(c->GetAttr("shape", &table));
  if (table.dims() < 1) {  // also unknown rank: the kernel needs the whole shape
    return absl::InvalidArgumentError(
        "attr 'shape': a table needs at least one dimension (rows), "
        "got shape " +
        table.DebugString());
  }
  tensorflow::shape_inference::ShapeHandle row, values;
  TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(table, &row));
  TF_RETURN_IF_ERROR(c->ReplaceDim(row, 0, c->UnknownDim(), &values));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, values);
  c->set_output(2, c->Scalar());
  return absl::OkStatus();
}

// The table an op that returns rows works on: its `shape` and `T` attrs, read once.
struct TableAttrs {
  TensorShape shape;
  kungfu::RowsDesc desc;
};

absl::Status read_table_attrs(OpKernelConstruction *ctx, TableAttrs *out) {
  tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(ctx->GetAttr("shape", &out->shape));
  TF_RETURN_IF_ERROR(ctx->GetAttr("T", &dtype));
  return rows_desc(dtype, out->shape, ctx->def().op() + ": attr 'shape'", &out->desc);
}

}  // namespace

REGISTER_OP("KungfuPushRows")
    .Input("rank: int32")
    .Input("blob_name: string")
    .Input("indices: Tindices")
    .Input("values: T")
    .Input("num_rows: int64")
    .Attr(KUNGFU_ROWS_TYPES)
    .Attr("Tindices: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Adds the rows `values` (row indices[i] gets values[i]) into worker `rank`'s table accumulator "
        "`blob_name`, a table of `num_rows` rows shaped like values[0]. Only these rows travel. Completes "
        "once the bytes are written to the connection, like KungfuPush.");

class PushRowsOp : public AsyncOpKernel {
 public:
  explicit PushRowsOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    int32_t rank;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 0, "rank", &rank), done);
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "blob_name", &name), done);
    const Tensor &indices = ctx->input(2), &values = ctx->input(3);
    int64_t num_rows;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 4, "num_rows", &num_rows), done);
    OP_REQUIRES_ASYNC(ctx, values.dims() >= 1 && indices.dims() == 1 && indices.dim_size(0) == values.dim_size(0),
                      absl::InvalidArgumentError("push_rows '" + name + "': indices " + indices.shape().DebugString() +
                                                 " do not match values " + values.shape().DebugString()),
                      done);
    OP_REQUIRES_ASYNC(ctx, num_rows >= 0,
                      absl::InvalidArgumentError("push_rows '" + name + "': num_rows must be >= 0, got " +
                                                 std::to_string(num_rows)),
                      done);
    TensorShape table = values.shape();
    table.set_dim(0, num_rows);
    kungfu::RowsDesc desc;
    OP_REQUIRES_OK_ASYNC(ctx, rows_desc(values.dtype(), table, input_label(ctx, "values"), &desc), done);
    std::vector<int64_t> rows = as_int64(indices);
    // The runtime copies what it sends before returning: no tensor to hold.
    rt->push_rows(rank, name, desc, rows.size(), rows.data(), values.tensor_data().data(), finish(ctx, done));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuPushRows").Device(tensorflow::DEVICE_CPU), PushRowsOp);

REGISTER_OP("KungfuTakeRows")
    .Input("blob_name: string")
    .Output("indices: int64")
    .Output("values: T")
    .Output("count: int64")
    .Attr(KUNGFU_ROWS_TYPES)
    .Attr("shape: shape")
    .SetIsStateful()
    .SetShapeFn(rows_outputs)
    .Doc(
        "Moves the rows pushed into this worker's table accumulator `blob_name` (a table of `shape`) since "
        "the last take out of it: their indices (ascending), their sums, and the number of pushes. Never "
        "waits.");

class TakeRowsOp : public OpKernel {
 public:
  explicit TakeRowsOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, read_table_attrs(ctx, &table_));
  }
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string name;
    OP_REQUIRES_OK(ctx, read_key(ctx, 0, "blob_name", &name));
    std::vector<int64_t> rows;
    std::vector<char> values;
    int64_t pushes = 0;
    kungfu::Status s = rt->take_rows(name, table_.desc, &rows, &values, &pushes);
    OP_REQUIRES(ctx, s.ok(), to_tf_status(s));
    Tensor *indices_out = nullptr, *values_out = nullptr, *count = nullptr;
    auto n = static_cast<int64_t>(rows.size());
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, table_.shape, n, &indices_out, &values_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &count));
    std::copy(rows.begin(), rows.end(), indices_out->flat<int64_t>().data());
    if (!values.empty())
      std::memcpy(const_cast<char *>(values_out->tensor_data().data()), values.data(), values.size());
    count->scalar<int64_t>()() = pushes;
  }

 private:
  TableAttrs table_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuTakeRows").Device(tensorflow::DEVICE_CPU), TakeRowsOp);

REGISTER_OP("KungfuSaveRows")
    .Input("blob_name: string")
    .Input("table: T")
    .Input("rows: Tindices")
    .Input("version: int64")
    .Attr(KUNGFU_ROWS_TYPES)
    .Attr("Tindices: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Publishes `table` as `version` of table `blob_name` for peers' KungfuRequestRows, changed since the "
        "previous version in `rows` only (the first save keeps the whole table).");

class SaveRowsOp : public OpKernel {
 public:
  explicit SaveRowsOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string name;
    OP_REQUIRES_OK(ctx, read_key(ctx, 0, "blob_name", &name));
    const Tensor &table = ctx->input(1);
    const Tensor &rows_in = ctx->input(2);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(rows_in.shape()),
                absl::InvalidArgumentError(input_label(ctx, "rows") + " must be a vector of row indices, got shape " +
                                           rows_in.shape().DebugString()));
    int64_t version;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, 3, "version", &version));
    OP_REQUIRES(ctx, version > 0,
                absl::InvalidArgumentError("save_rows '" + name + "': version must be > 0, got " +
                                           std::to_string(version)));
    kungfu::RowsDesc desc;
    OP_REQUIRES_OK(ctx, rows_desc(table.dtype(), table.shape(), input_label(ctx, "table"), &desc));
    std::vector<int64_t> rows = as_int64(rows_in);
    kungfu::Status s = rt->save_rows(name, static_cast<uint64_t>(version), table.tensor_data().data(), desc,
                                     rows.data(), rows.size());
    OP_REQUIRES(ctx, s.ok(), to_tf_status(s));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSaveRows").Device(tensorflow::DEVICE_CPU), SaveRowsOp);

REGISTER_OP("KungfuRequestRows")
    .Input("rank: int32")
    .Input("blob_name: string")
    .Input("min_version: int64")
    .Output("indices: int64")
    .Output("values: T")
    .Output("version: int64")
    .Attr(KUNGFU_ROWS_TYPES)
    .Attr("shape: shape")
    .SetIsStateful()
    .SetShapeFn(rows_outputs)
    .Doc(
        "Fetches from worker `rank` the rows of table `blob_name` (of `shape`) that changed since the version "
        "this worker last received, as of its newest version >= `min_version` (waiting there until one is "
        "saved, at most the runtime timeout); the first fetch returns every row. Writing `values` into rows "
        "`indices` of the previous copy gives the table at `version`.");

class RequestRowsOp : public AsyncOpKernel {
 public:
  explicit RequestRowsOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, read_table_attrs(ctx, &table_));
  }
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    int32_t rank;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 0, "rank", &rank), done);
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "blob_name", &name), done);
    int64_t min_version;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 2, "min_version", &min_version), done);
    OP_REQUIRES_ASYNC(ctx, min_version >= 0,
                      absl::InvalidArgumentError("request_rows '" + name + "': min_version must be >= 0, got " +
                                                 std::to_string(min_version)),
                      done);
    rt->request_rows(rank, name, static_cast<uint64_t>(min_version),
                     [ctx, done, table = table_, name](const kungfu::Status &s, kungfu::RowsReply reply) {
                       if (!s.ok()) {
                         ctx->SetStatus(to_tf_status(s));
                       } else {
                         ctx->SetStatus(unpack(ctx, name, table.desc, table.shape, reply));
                       }
                       done();
                     });
  }

 private:
  // The reply as outputs, checked against the table this worker expects.
  static absl::Status unpack(OpKernelContext *ctx, const std::string &name, const kungfu::RowsDesc &desc,
                             const TensorShape &shape, const kungfu::RowsReply &reply) {
    if (reply.num_rows != desc.num_rows || reply.row_bytes != desc.row_bytes()) {
      return absl::InvalidArgumentError(
          "request_rows '" + name + "': the owner's table has " + std::to_string(reply.num_rows) + " rows of " +
          std::to_string(reply.row_bytes) + " bytes, this worker's " + shape.DebugString() + " has " +
          std::to_string(desc.num_rows) + " rows of " + std::to_string(desc.row_bytes()) + " bytes");
    }
    const size_t size = reply.payload ? reply.payload->size() : 0;
    const size_t per_row = reply.all_rows ? desc.row_bytes() : sizeof(int64_t) + desc.row_bytes();
    const bool fits = reply.all_rows ? size == desc.num_rows * desc.row_bytes() : per_row > 0 && size % per_row == 0;
    if (!fits) {
      return absl::InvalidArgumentError("request_rows '" + name + "': the owner's table does not have this one's " +
                                        "shape " + shape.DebugString() + " (" + std::to_string(size) +
                                        " bytes received)");
    }
    auto n = static_cast<int64_t>(reply.all_rows ? desc.num_rows : (per_row > 0 ? size / per_row : 0));
    Tensor *indices = nullptr, *values = nullptr, *version = nullptr;
    TF_RETURN_IF_ERROR(allocate_rows(ctx, 0, shape, n, &indices, &values));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({}), &version));
    int64_t *idx = indices->flat<int64_t>().data();
    const char *data = reply.payload ? reply.payload->data() : nullptr;
    if (reply.all_rows) {
      std::iota(idx, idx + n, int64_t{0});
    } else if (n > 0) {
      std::memcpy(idx, data, static_cast<size_t>(n) * sizeof(int64_t));
      data += static_cast<size_t>(n) * sizeof(int64_t);
      for (int64_t i = 0; i < n; ++i) {
        if (idx[i] < 0 || idx[i] >= static_cast<int64_t>(desc.num_rows)) {
          return absl::InvalidArgumentError("request_rows '" + name + "': the owner sent row " +
                                            std::to_string(idx[i]) + " of a table of " + std::to_string(desc.num_rows) +
                                            " rows here");
        }
      }
    }
    size_t value_bytes = static_cast<size_t>(n) * desc.row_bytes();
    if (value_bytes > 0) std::memcpy(const_cast<char *>(values->tensor_data().data()), data, value_bytes);
    version->scalar<int64_t>()() = static_cast<int64_t>(reply.version);
    return absl::OkStatus();
  }

  TableAttrs table_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuRequestRows").Device(tensorflow::DEVICE_CPU), RequestRowsOp);

}  // namespace kungfu_tf
