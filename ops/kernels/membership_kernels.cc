// Membership ops (elastic training): switch this worker to a new cluster
// version in place, leave the cluster, interrupt what is in flight, and read
// the members (current, lost, self). All stateful: they act on or read the
// runtime at every run, so a traced graph keeps working across changes.
#include <limits>

#include "runtime_access.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace kungfu_tf {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// A string vector output of the peers' "host:port", in order.
absl::Status output_peers(OpKernelContext *ctx, const std::vector<kungfu::PeerID> &peers) {
  Tensor *out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({static_cast<int64_t>(peers.size())}), &out));
  auto v = out->vec<tensorflow::tstring>();
  for (size_t i = 0; i < peers.size(); ++i) v(i) = peers[i].str();
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("KungfuUpdateCluster")
    .Input("peers: string")
    .Input("version: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Switches this worker to cluster `version` (peers in rank order, \"host:port\"; must contain this worker "
        "and be newer than the current version): ops in flight on the old version fail, the new one is in force "
        "when the op returns.");

class UpdateClusterOp : public OpKernel {
 public:
  explicit UpdateClusterOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    const Tensor &peers = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(peers.shape()),
                absl::InvalidArgumentError(input_label(ctx, "peers") +
                                           " must be a vector of \"host:port\" strings, "
                                           "got shape " +
                                           peers.shape().DebugString()));
    int64_t version = 0;
    OP_REQUIRES_OK(ctx, scalar_input<int64_t>(ctx, 1, "version", &version));
    OP_REQUIRES(ctx, version > 0 && version <= std::numeric_limits<uint32_t>::max(),
                absl::InvalidArgumentError(input_label(ctx, "version") + " must be in 1..4294967295, got " +
                                           std::to_string(version)));
    std::vector<kungfu::PeerID> list;
    auto v = peers.vec<tensorflow::tstring>();
    for (int64_t i = 0; i < v.size(); ++i) {
      kungfu::PeerID p;
      kungfu::Status s = kungfu::parse_peer(std::string(v(i)), &p);
      OP_REQUIRES(ctx, s.ok(),
                  absl::InvalidArgumentError(input_label(ctx, "peers") + " [" + std::to_string(i) +
                                             "]: " + s.message()));
      list.push_back(p);
    }
    OP_REQUIRES(ctx, !list.empty(), absl::InvalidArgumentError(input_label(ctx, "peers") + " lists no peer"));
    OP_REQUIRES_OK(ctx, to_tf_status(rt->update_cluster(kungfu::Cluster(static_cast<uint32_t>(version), list))));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuUpdateCluster").Device(tensorflow::DEVICE_CPU), UpdateClusterOp);

REGISTER_OP("KungfuLeaveCluster")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Leaves the cluster in order (queued frames written, peers told goodbye); every later op fails.");

class LeaveClusterOp : public OpKernel {
 public:
  explicit LeaveClusterOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    rt->shutdown();
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuLeaveCluster").Device(tensorflow::DEVICE_CPU), LeaveClusterOp);

REGISTER_OP("KungfuInterrupt")
    .Input("reason: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Fails every op in flight on the current cluster version, and every new one until the next "
        "KungfuUpdateCluster, with UnavailableError(reason).");

class InterruptOp : public OpKernel {
 public:
  explicit InterruptOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string reason;
    OP_REQUIRES_OK(ctx, scalar_string(ctx, 0, "reason", &reason));
    OP_REQUIRES(ctx, !reason.empty(), absl::InvalidArgumentError(input_label(ctx, "reason") + " must not be empty"));
    rt->interrupt(reason);
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuInterrupt").Device(tensorflow::DEVICE_CPU), InterruptOp);

// One kernel for the peer lists; `Reader` picks which.
template <std::vector<kungfu::PeerID> (*Reader)(const kungfu::Runtime &)>
class PeersOp : public OpKernel {
 public:
  explicit PeersOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    OP_REQUIRES_OK(ctx, output_peers(ctx, Reader(*rt)));
  }
};

std::vector<kungfu::PeerID> read_lost_peers(const kungfu::Runtime &rt) { return rt.lost_peers(); }
std::vector<kungfu::PeerID> read_cluster_peers(const kungfu::Runtime &rt) { return rt.cluster().peers(); }

#define KUNGFU_PEERS_OP(OpName, Reader, DocText)                                                 \
  REGISTER_OP(OpName)                                                                            \
      .Output("peers: string")                                                                   \
      .SetIsStateful()                                                                           \
      .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {                         \
        c->set_output(0, c->Vector(tensorflow::shape_inference::InferenceContext::kUnknownDim)); \
        return absl::OkStatus();                                                                 \
      })                                                                                         \
      .Doc(DocText);                                                                             \
  REGISTER_KERNEL_BUILDER(Name(OpName).Device(tensorflow::DEVICE_CPU), PeersOp<Reader>);

KUNGFU_PEERS_OP("KungfuLostPeers", read_lost_peers,
                "\"host:port\" of the members of the current version lost without a goodbye, in rank order.")
KUNGFU_PEERS_OP("KungfuClusterPeers", read_cluster_peers, "\"host:port\" of the current cluster, in rank order.")

REGISTER_OP("KungfuSelfPeer")
    .Output("peer: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("This worker's \"host:port\".");

class SelfPeerOp : public OpKernel {
 public:
  explicit SelfPeerOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = rt->self().str();
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSelfPeer").Device(tensorflow::DEVICE_CPU), SelfPeerOp);

}  // namespace kungfu_tf
