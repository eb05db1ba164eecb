// Communication monitoring: per-peer traffic totals and rates from the runtime's counters.
#include <chrono>
#include <mutex>
#include <vector>

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

REGISTER_OP("KungfuCommRates")
    .Output("rates: double")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      c->set_output(0, c->Vector(tensorflow::shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc("Bytes per second exchanged with each peer (sent + received) since the previous call; 0 for self.");

class CommRatesOp : public OpKernel {
 public:
  explicit CommRatesOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    // One snapshot of one cluster version: size and counters agree even
    // while the cluster changes.
    const std::vector<kungfu::Runtime::PeerTraffic> traffic = rt->traffic();
    const uint32_t version = rt->cluster_version();
    int n = static_cast<int>(traffic.size());
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    auto rates = out->vec<double>();
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (last_bytes_.size() != static_cast<size_t>(n) || version != last_version_) {
      // A new cluster version counts from zero on new connections.
      last_bytes_.assign(n, 0);
      last_version_ = version;
      last_time_ = start_;
    }
    double secs = std::chrono::duration<double>(now - last_time_).count();
    for (int r = 0; r < n; ++r) {
      uint64_t bytes = traffic[r].sent + traffic[r].received;
      rates(r) = secs > 0 && bytes >= last_bytes_[r] ? static_cast<double>(bytes - last_bytes_[r]) / secs : 0.0;
      last_bytes_[r] = bytes;
    }
    last_time_ = now;
  }

 private:
  std::mutex mu_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_time_;
  std::vector<uint64_t> last_bytes_;
  uint32_t last_version_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("KungfuCommRates").Device(tensorflow::DEVICE_CPU), CommRatesOp);

REGISTER_OP("KungfuCommBytes")
    .Output("bytes: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      c->set_output(0, c->Matrix(2, tensorflow::shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(
        "Bytes sent to (row 0) and received from (row 1) each peer (by rank) since the current cluster version "
        "began (the runtime started, without elastic changes), frame headers included; 0 for self.");

// Totals rather than rates: a caller can attribute traffic to one operation
// by the difference across it, which rates over wall-clock intervals cannot do.
class CommBytesOp : public OpKernel {
 public:
  explicit CommBytesOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    // Since the current cluster version began (a one-worker runtime without
    // a port has no transport: zeros).
    const std::vector<kungfu::Runtime::PeerTraffic> traffic = rt->traffic();
    int n = static_cast<int>(traffic.size());
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2, n}), &out));
    auto bytes = out->matrix<int64_t>();
    for (int r = 0; r < n; ++r) {
      bytes(0, r) = static_cast<int64_t>(traffic[r].sent);
      bytes(1, r) = static_cast<int64_t>(traffic[r].received);
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuCommBytes").Device(tensorflow::DEVICE_CPU), CommBytesOp);

}  // namespace kungfu_tf
