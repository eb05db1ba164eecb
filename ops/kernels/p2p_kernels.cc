// Point-to-point ops: the runtime's model store (a worker saves named,
// versioned tensors; any peer requests them by rank) and its accumulators
// (peers push tensors that the receiver sums and takes; asynchronous PS).
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
using tensorflow::Tensor;
using tensorflow::TensorShape;

#define KUNGFU_P2P_TYPES "T: {bool, int8, uint8, int16, int32, int64, half, bfloat16, float, double}"

namespace {
// A negative version means "the latest one saved".
uint64_t to_version(int64_t v) { return v < 0 ? kungfu::P2PStore::kLatest : static_cast<uint64_t>(v); }
}  // namespace

REGISTER_OP("KungfuSave")
    .Input("blob_name: string")
    .Input("input: T")
    .Input("version: int64")
    .Attr(KUNGFU_P2P_TYPES)
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Keeps a copy of `input` under (name, version) for peers to request.");

class SaveOp : public OpKernel {
 public:
  explicit SaveOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string name;
    OP_REQUIRES_OK(ctx, read_key(ctx, 0, "blob_name", &name));
    const Tensor &in = ctx->input(1);
    int64_t version;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, 2, "version", &version));
    auto data = in.tensor_data();
    rt->save(name, to_version(version), data.data(), data.size());
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSave").Device(tensorflow::DEVICE_CPU), SaveOp);

REGISTER_OP("KungfuRequest")
    .Input("rank: int32")
    .Input("blob_name: string")
    .Input("version: int64")
    .Input("like: T")
    .Output("output: T")
    .Attr(KUNGFU_P2P_TYPES)
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      c->set_output(0, c->input(3));
      return absl::OkStatus();
    })
    .Doc("Fetches what worker `rank` saved under (name, version); `like` gives shape and dtype.");

class RequestOp : public AsyncOpKernel {
 public:
  explicit RequestOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    int32_t rank;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 0, "rank", &rank), done);
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "blob_name", &name), done);
    int64_t version;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 2, "version", &version), done);
    const Tensor &like = ctx->input(3);
    Tensor *out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, like.shape(), &out), done);
    auto dst = out->tensor_data();
    rt->request(rank, name, to_version(version), const_cast<char *>(dst.data()), dst.size(), hold({*out}),
                finish(ctx, done));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuRequest").Device(tensorflow::DEVICE_CPU), RequestOp);

REGISTER_OP("KungfuRequestAtLeast")
    .Input("rank: int32")
    .Input("blob_name: string")
    .Input("min_version: int64")
    .Input("like: T")
    .Output("output: T")
    .Output("version: int64")
    .Attr(KUNGFU_P2P_TYPES)
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      c->set_output(0, c->input(3));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "Fetches the newest version >= `min_version` that worker `rank` saved under `blob_name`, waiting on "
        "that worker until a save makes one available (at most the runtime timeout, then "
        "DeadlineExceeded); `version` is the version received. `like` gives shape and dtype.");

class RequestAtLeastOp : public AsyncOpKernel {
 public:
  explicit RequestAtLeastOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    int32_t rank;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 0, "rank", &rank), done);
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "blob_name", &name), done);
    int64_t min_version;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 2, "min_version", &min_version), done);
    // Unlike KungfuRequest, no "latest" here: a negative bound is a mistake.
    OP_REQUIRES_ASYNC(ctx, min_version >= 0,
                      absl::InvalidArgumentError("request_at_least '" + name + "': min_version must be >= 0, got " +
                                                 std::to_string(min_version)),
                      done);
    const Tensor &like = ctx->input(3);
    Tensor *out = nullptr, *version = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, like.shape(), &out), done);
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({}), &version), done);
    Tensor version_out = *version;  // shares the buffer; stays valid in the callback
    auto dst = out->tensor_data();
    rt->request_at_least(rank, name, static_cast<uint64_t>(min_version), const_cast<char *>(dst.data()), dst.size(),
                         hold({*out}), [ctx, done, version_out](const kungfu::Status &s, uint64_t v) mutable {
                           if (s.ok()) {
                             // An unversioned save (kLatest) reads as -1, like the version input of KungfuSave.
                             version_out.scalar<int64_t>()() = static_cast<int64_t>(v);
                           } else {
                             ctx->SetStatus(to_tf_status(s));
                           }
                           done();
                         });
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuRequestAtLeast").Device(tensorflow::DEVICE_CPU), RequestAtLeastOp);

#define KUNGFU_ACCUMULATOR_TYPES "T: {half, bfloat16, float, double, int32, int64}"

REGISTER_OP("KungfuPush")
    .Input("rank: int32")
    .Input("blob_name: string")
    .Input("input: T")
    .Attr(KUNGFU_ACCUMULATOR_TYPES)
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Adds `input` element-wise into worker `rank`'s accumulator `blob_name` (created by the first push). "
        "Completes once the bytes are written to the connection (or added, for this worker's own rank), "
        "not when the receiver has added them.");

class PushOp : public AsyncOpKernel {
 public:
  explicit PushOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    int32_t rank;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, 0, "rank", &rank), done);
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "blob_name", &name), done);
    const Tensor &in = ctx->input(2);
    kungfu::DType dtype;
    OP_REQUIRES_OK_ASYNC(ctx, to_kungfu_dtype(in.dtype(), &dtype), done);
    // The tensor is sent from its own buffer; `hold` keeps it alive until the
    // transport is done with it, even if this op has failed by then (timeout).
    kungfu::Buffer buf{in.tensor_data().data(), nullptr, describe(in, dtype), hold({in})};
    rt->push(rank, name, buf, finish(ctx, done));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuPush").Device(tensorflow::DEVICE_CPU), PushOp);

REGISTER_OP("KungfuTake")
    .Input("blob_name: string")
    .Input("like: T")
    .Output("sum: T")
    .Output("count: int64")
    .Attr(KUNGFU_ACCUMULATOR_TYPES)
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "Moves the sum of everything pushed into this worker's accumulator `blob_name` since the last take "
        "into `sum` (shaped like `like`) and the number of those pushes into `count`; the accumulator starts "
        "again from empty. Never waits: nothing pushed gives zeros and 0.");

// Synchronous: a take only copies what is already here.
class TakeOp : public OpKernel {
 public:
  explicit TakeOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string name;
    OP_REQUIRES_OK(ctx, read_key(ctx, 0, "blob_name", &name));
    const Tensor &like = ctx->input(1);
    kungfu::DType dtype;
    OP_REQUIRES_OK(ctx, to_kungfu_dtype(like.dtype(), &dtype));
    Tensor *sum = nullptr, *count = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, like.shape(), &sum));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &count));
    int64_t pushes = 0;
    kungfu::Status s = rt->take(name, const_cast<char *>(sum->tensor_data().data()), describe(like, dtype), &pushes);
    OP_REQUIRES(ctx, s.ok(), to_tf_status(s));
    count->scalar<int64_t>()() = pushes;
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuTake").Device(tensorflow::DEVICE_CPU), TakeOp);

}  // namespace kungfu_tf
