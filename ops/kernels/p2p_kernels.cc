// Point-to-point ops over the runtime's model store: a worker saves named,
// versioned tensors; any peer requests them by rank.
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
    OP_REQUIRES_OK(ctx, scalar_string(ctx, 0, &name));
    const Tensor &in = ctx->input(1);
    int64_t version = ctx->input(2).scalar<int64_t>()();
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
    int rank = ctx->input(0).scalar<int32_t>()();
    std::string name;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_string(ctx, 1, &name), done);
    int64_t version = ctx->input(2).scalar<int64_t>()();
    const Tensor &like = ctx->input(3);
    Tensor *out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, like.shape(), &out), done);
    auto dst = out->tensor_data();
    rt->request(rank, name, to_version(version), const_cast<char *>(dst.data()), dst.size(), hold({*out}),
                finish(ctx, done));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuRequest").Device(tensorflow::DEVICE_CPU), RequestOp);

}  // namespace kungfu_tf
