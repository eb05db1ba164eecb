// The step clock: a worker's compute time per step, from the start of the
// step until its gradients are ready, without the time it waits for peers.
// In synchronous training every worker sees the same step time, so only this
// tells a slow worker apart (KungFu §4.1: monitoring per-worker throughput).
//
// KungfuStepClockStart has no data inputs, so the executor runs it as soon as
// the step (a tf.function call or a Session.run) starts; KungfuStepClockLap
// takes the gradients as inputs, so it runs the moment the last one is ready.
// Both are stateful: they read the clock, and must never be constant-folded or
// merged across steps.
//
// The start op takes a resource handle it never reads (`anchor`, a variable
// of the monitor that nothing else uses). Without one, tf.function's automatic
// control dependencies would chain it, like every stateful op without
// resource inputs, after all such ops created before it in program order --
// e.g. a tf.py_function in the forward pass -- and the clock would start late.
// With one, it is ordered only against other users of that resource: none.
#include <chrono>
#include <cstdint>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kungfu_tf {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {
int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

REGISTER_OP("KungfuStepClockStart")
    .Input("anchor: resource")
    .Output("start_ns: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "The monotonic clock in nanoseconds when this op ran; its only input is a resource handle it never "
        "reads (available when the step starts), so it runs when the step starts.");

class StepClockStartOp : public OpKernel {
 public:
  explicit StepClockStartOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  // Inexpensive: the executor runs it inline as soon as it is ready (at the
  // start of the step). An "expensive" kernel goes to the inter-op pool; with
  // one inter-op thread that thread is busy running the ready chain inline, so
  // the clock started after the gradients (compute_time ~1 us on most steps
  // once TF's cost estimates had settled).
  bool IsExpensive() override { return false; }
  void Compute(OpKernelContext *ctx) override {
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = steady_now_ns();
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStepClockStart").Device(tensorflow::DEVICE_CPU), StepClockStartOp);

REGISTER_OP("KungfuStepClockLap")
    .Input("start_ns: int64")
    .Input("ready: T")
    .Output("seconds: double")
    .Attr("T: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Seconds from `start_ns` (a KungfuStepClockStart) until every tensor of `ready` was available.");

class StepClockLapOp : public OpKernel {
 public:
  explicit StepClockLapOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  // Inexpensive too: it runs inline the moment the last gradient is ready,
  // not after whatever the inter-op pool is running then.
  bool IsExpensive() override { return false; }
  void Compute(OpKernelContext *ctx) override {
    int64_t now = steady_now_ns();
    const Tensor &start = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(start.shape()),
                absl::InvalidArgumentError("KungfuStepClockLap: input 'start_ns' must be a scalar, got shape " +
                                           start.shape().DebugString()));
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<double>()() = static_cast<double>(now - start.scalar<int64_t>()()) * 1e-9;
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStepClockLap").Device(tensorflow::DEVICE_CPU), StepClockLapOp);

}  // namespace kungfu_tf
