// KungfuKeepAlive: a stateful op that takes tensors as data inputs and does nothing.
//
// Why it exists: our data collectives are stateless (so that TF does not
// serialise them), and Grappler turns a stateless op whose outputs feed only
// control edges into a NoOp. A collective whose result this worker does not
// use (a non-root's `reduce`, a root's own `broadcast`) would then silently
// not run, and its peers would wait for it until their timeout. Feeding its
// output into this stateful op keeps a data edge, so it runs, without a
// variable or any work per step.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace kungfu_tf {

REGISTER_OP("KungfuKeepAlive")
    .Input("inputs: T")
    .Attr("T: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *) { return absl::OkStatus(); })
    .Doc("Makes every input run (a data edge into a stateful op); outputs nothing.");

class KeepAliveOp : public tensorflow::OpKernel {
 public:
  explicit KeepAliveOp(tensorflow::OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(tensorflow::OpKernelContext *) override {}
};
REGISTER_KERNEL_BUILDER(Name("KungfuKeepAlive").Device(tensorflow::DEVICE_CPU), KeepAliveOp);

}  // namespace kungfu_tf
