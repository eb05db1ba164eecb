// Configuration ops (KungFu §5.1): they read the runtime at every run and are
// stateful, so a graph traced once keeps seeing the current cluster after the
// topology or membership changes instead of a constant folded at trace time.
#include <map>
#include <string>

#include "runtime_access.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace kungfu_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// One kernel for the int32 scalars; `Reader` picks the field.
template <int (*Reader)(const kungfu::Runtime &)>
class ClusterScalarOp : public OpKernel {
 public:
  explicit ClusterScalarOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = Reader(*rt);
  }
};

int read_rank(const kungfu::Runtime &rt) { return rt.rank(); }
int read_size(const kungfu::Runtime &rt) { return rt.size(); }
int read_local_rank(const kungfu::Runtime &rt) { return rt.local_rank(); }
int read_local_size(const kungfu::Runtime &rt) { return rt.local_size(); }
int read_version(const kungfu::Runtime &rt) { return static_cast<int>(rt.cluster_version()); }
// Wraps past 2^31 samples: readers compare two reads a step apart.
int read_auto_probe_samples(const kungfu::Runtime &rt) { return static_cast<int>(rt.auto_probe_samples()); }

#define KUNGFU_SCALAR_OP(OpName, Reader, DocText)           \
  REGISTER_OP(OpName)                                       \
      .Output("value: int32")                               \
      .SetIsStateful()                                      \
      .SetShapeFn(tensorflow::shape_inference::ScalarShape) \
      .Doc(DocText);                                        \
  REGISTER_KERNEL_BUILDER(Name(OpName).Device(tensorflow::DEVICE_CPU), ClusterScalarOp<Reader>);

KUNGFU_SCALAR_OP("KungfuRank", read_rank, "This worker's position in the cluster.")
KUNGFU_SCALAR_OP("KungfuClusterSize", read_size, "Number of workers.")
KUNGFU_SCALAR_OP("KungfuLocalRank", read_local_rank, "Position among the workers on this host.")
KUNGFU_SCALAR_OP("KungfuLocalSize", read_local_size, "Number of workers on this host.")
KUNGFU_SCALAR_OP("KungfuClusterVersion", read_version, "Membership version; changes on every resize.")
KUNGFU_SCALAR_OP("KungfuAutoProbeSamples", read_auto_probe_samples,
                 "Samples AUTO's probes have started; stops growing once every class called has decided.")

REGISTER_OP("KungfuTopology")
    .Output("name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Name of the all-reduce topology in force (STAR, RING, ..., AUTO).");

class TopologyOp : public OpKernel {
 public:
  explicit TopologyOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = kungfu::topology_name(rt->topology());
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuTopology").Device(tensorflow::DEVICE_CPU), TopologyOp);

REGISTER_OP("KungfuAutoChoice")
    .Input("bytes: int64")
    .Output("name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "The topology AUTO's probe chose (or recalled) for messages of `bytes` on the current cluster version; "
        "empty until the workers agreed on one.");

class AutoChoiceOp : public OpKernel {
 public:
  explicit AutoChoiceOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(ctx->input(0).shape()),
                absl::InvalidArgumentError("auto_choice: bytes must be a scalar, got shape " +
                                           ctx->input(0).shape().DebugString()));
    const int64_t bytes = ctx->input(0).scalar<int64_t>()();
    OP_REQUIRES(ctx, bytes >= 0,
                absl::InvalidArgumentError("auto_choice: bytes must be >= 0, got " + std::to_string(bytes)));
    const std::map<int, kungfu::TopologyKind> chosen = rt->auto_choices();
    auto it = chosen.find(kungfu::auto_size_class(static_cast<size_t>(bytes)));
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = it == chosen.end() ? "" : kungfu::topology_name(it->second);
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuAutoChoice").Device(tensorflow::DEVICE_CPU), AutoChoiceOp);

REGISTER_OP("KungfuSetTopology")
    .Input("topology: string")
    .Input("key: string")
    .Output("changed: bool")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Consistent topology switch (Alg. 1 consensus, switch, barrier); every worker must run it.");

class SetTopologyOp : public AsyncOpKernel {
 public:
  explicit SetTopologyOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    std::string name, key;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_string(ctx, 0, "topology", &name), done);
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "key", &key), done);
    kungfu::TopologyKind kind;
    kungfu::Status parsed = kungfu::parse_topology(name, &kind);
    OP_REQUIRES_ASYNC(ctx, parsed.ok(), to_tf_status(parsed), done);
    Tensor *out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    Tensor result = *out;
    rt->set_topology(key, kind, [ctx, done, result](const kungfu::Status &s, bool changed) mutable {
      if (!s.ok()) ctx->SetStatus(to_tf_status(s));
      result.scalar<bool>()() = changed;
      done();
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSetTopology").Device(tensorflow::DEVICE_CPU), SetTopologyOp);

}  // namespace kungfu_tf
