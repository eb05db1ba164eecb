// Collective ops. Data collectives wait on the network, so they are
// AsyncOpKernels: they hand the work to the runtime and return, and the
// runtime's callback completes them; no TF thread blocks.
//
// Data collectives are not marked stateful. They take their message key from
// a stateful KungfuCollectiveKey op (in graphs), which keeps Grappler from
// constant-folding or merging them, while tf.function's automatic control
// dependencies do not serialise them in program order, so many all-reduces can
// be in flight at once and overlap with backprop. Ops with side effects of
// their own (barrier, consensus) are stateful.
#include <atomic>
#include <cstring>
#include <memory>

#include "output_cache.h"
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
using tensorflow::shape_inference::InferenceContext;

#define KUNGFU_COLLECTIVE_TYPES "T: {uint8, int32, int64, half, bfloat16, float, double}"

REGISTER_OP("KungfuCollectiveKey")
    .Output("key: string")
    .Attr("key_name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("The message key of one collective in a graph (see module comment).");

class CollectiveKeyOp : public OpKernel {
 public:
  explicit CollectiveKeyOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_name", &name_));
    OP_REQUIRES_OK(ctx, validate_user_key(name_, "KungfuCollectiveKey: attr 'key_name'"));
  }
  void Compute(OpKernelContext *ctx) override {
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = name_;
  }

 private:
  std::string name_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuCollectiveKey").Device(tensorflow::DEVICE_CPU), CollectiveKeyOp);

// Common start of every data collective: runtime, key, dtype.
struct CollectiveStart {
  kungfu::Runtime *rt = nullptr;
  std::string key;
  kungfu::DType dtype;
};

// How the runtime will see the data of a collective: as input 0's own shape
// (whose rank must fit a frame header, checked here, before the one-worker
// shortcut, so a program that runs at np=1 runs at any np), or as one fused
// 1-D buffer.
enum class Described { kAsInput0, kFused };

bool begin(OpKernelContext *ctx, int key_index, tensorflow::DataType dt, Described described, CollectiveStart *out) {
  if (!check_runtime(ctx, &out->rt)) return false;
  absl::Status s = read_key(ctx, key_index, "key", &out->key);
  if (s.ok()) s = to_kungfu_dtype(dt, &out->dtype);
  if (s.ok() && described == Described::kAsInput0) {
    s = check_rank_fits(ctx->input(0), ctx->op_kernel().type_string() + " '" + out->key + "'");
  }
  if (!s.ok()) {
    ctx->SetStatus(s);
    return false;
  }
  return true;
}

// 'mean' is a sum divided by the cluster size when the op completes, in the
// runtime's callback: no second pass through TensorFlow, no second tensor,
// and the size is the one in force at run time.
struct ReduceSpec {
  kungfu::ReduceOp op = kungfu::ReduceOp::kSum;
  bool mean = false;
};

absl::Status parse_reduce_spec(OpKernelConstruction *ctx, ReduceSpec *spec) {
  std::string op;
  TF_RETURN_IF_ERROR(ctx->GetAttr("op", &op));
  spec->mean = op == "mean";
  if (!spec->mean && !kungfu::parse_reduce_op(op, &spec->op)) return absl::InvalidArgumentError("bad reduce op " + op);
  tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(ctx->GetAttr("T", &dtype));
  // The runtime divides floating types only; an integer 'mean' would silently be the sum.
  if (spec->mean && !tensorflow::DataTypeIsFloating(dtype)) {
    return absl::InvalidArgumentError(ctx->def().op() + ": attr 'op': 'mean' needs a floating-point dtype, got " +
                                      tensorflow::DataTypeString(dtype) + "; use 'sum'");
  }
  return absl::OkStatus();
}

// The all-reduce topology a kernel asked for: '' means the runtime's current
// one, read at every run (so set_topology applies to graphs traced before it);
// a name pins this op to that topology, e.g. for a strategy that syncs one
// merge group over RING and another over STAR. The name is checked when the
// kernel is built, so a typo fails before anything is sent.
struct TopologyChoice {
  bool pinned = false;
  kungfu::TopologyKind kind = kungfu::TopologyKind::kAuto;

  void all_reduce(kungfu::Runtime *rt, const std::string &key, const kungfu::Buffer &buf, kungfu::ReduceOp op,
                  kungfu::DoneCallback done) const {
    if (pinned) {
      rt->all_reduce_on(kind, key, buf, op, std::move(done));
    } else {
      rt->all_reduce(key, buf, op, std::move(done));
    }
  }
};

absl::Status parse_topology_choice(OpKernelConstruction *ctx, TopologyChoice *out) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("topology", &name));
  out->pinned = !name.empty();
  if (!out->pinned) return absl::OkStatus();
  kungfu::Status s = kungfu::parse_topology(name, &out->kind);
  if (!s.ok()) return absl::InvalidArgumentError(ctx->def().name() + ": " + s.message());
  return absl::OkStatus();
}

// Completes a reduction: divides for 'mean', then finishes the kernel.
kungfu::DoneCallback finish_reduce(OpKernelContext *ctx, tensorflow::AsyncOpKernel::DoneCallback done,
                                   const ReduceSpec &spec, kungfu::Runtime *rt, kungfu::Buffer buf) {
  if (!spec.mean) return finish(ctx, done);
  return [ctx, done, rt, buf](const kungfu::Status &s) {
    if (s.ok()) {
      if (rt->size() > 1) kungfu::scale_inplace(buf.recv, buf.desc.count, buf.desc.dtype, 1.0 / rt->size());
    } else {
      ctx->SetStatus(to_tf_status(s));
    }
    done();
  };
}

// All-reduces up to this size wait for their answer on the kernel's thread
// a moment, reading same-host peers' rings themselves (Runtime::poll_until):
// their frames then skip the receiving thread's hand-off and wake-up, which
// cost more than the whole exchange. Larger ones return at once, as before.
constexpr size_t kPolledAllReduceBytes = 64 * 1024;

// Runs `start` (an op that calls the callback it is given when done), then
// polls for its completion as above when `bytes` is small. `done` runs once,
// on whichever thread completes the op (this one when polling caught it).
void run_polled(kungfu::Runtime *rt, size_t bytes, const std::function<void(kungfu::DoneCallback)> &start,
                kungfu::DoneCallback done) {
  if (bytes > kPolledAllReduceBytes || rt->size() == 1) return start(std::move(done));
  auto finished = std::make_shared<std::atomic<bool>>(false);
  start([done = std::move(done), finished](const kungfu::Status &s) {
    done(s);
    finished->store(true, std::memory_order_release);
  });
  rt->poll_until([&finished] { return finished->load(std::memory_order_acquire); });
}

// A cluster of one: every reduction (sum, mean, min, max, prod) of a single
// contribution is that contribution, so inputs 0..n-1 become the outputs as
// they are, without a copy. The size is read at run time (clusters resize).
bool alone(OpKernelContext *ctx, kungfu::Runtime *rt, int n) {
  if (rt->size() != 1) return false;
  for (int i = 0; i < n; ++i) ctx->set_output(i, ctx->input(i));
  return true;
}

// Allocates output 0 shaped like input 0 (reusing the input's buffer when TF
// allows, else a cached one) and describes both to the runtime.
bool same_shape_output(OpKernelContext *ctx, const CollectiveStart &st, OutputCache *cache, kungfu::Buffer *buf) {
  const Tensor &in = ctx->input(0);
  Tensor *out = nullptr;
  absl::Status s = cache->output(ctx, 0, 0, in.shape(), &out);
  if (!s.ok()) {
    ctx->SetStatus(s);
    return false;
  }
  *buf = kungfu::Buffer{in.tensor_data().data(), const_cast<char *>(out->tensor_data().data()), describe(in, st.dtype),
                        hold({in, *out})};
  return true;
}

REGISTER_OP("KungfuAllReduce")
    .Input("input: T")
    .Input("key: string")
    .Output("output: T")
    .Attr(KUNGFU_COLLECTIVE_TYPES)
    .Attr("op: {'sum', 'min', 'max', 'prod', 'mean'} = 'sum'")
    .Attr("topology: string = ''")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(
        "Element-wise reduction of `input` over all workers; every worker gets the result. "
        "'mean' divides the sum by the cluster size read at run time (floating types). "
        "`topology`: '' for the runtime's current one, else STAR, RING, BINARY_TREE, "
        "BINARY_TREE_STAR, CLIQUE or AUTO for this op only.");

class AllReduceOp : public AsyncOpKernel {
 public:
  explicit AllReduceOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_reduce_spec(ctx, &spec_));
    OP_REQUIRES_OK(ctx, parse_topology_choice(ctx, &topology_));
  }
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    CollectiveStart st;
    kungfu::Buffer buf;
    if (!begin(ctx, 1, ctx->input(0).dtype(), Described::kAsInput0, &st)) return done();
    if (alone(ctx, st.rt, 1)) return done();
    if (!same_shape_output(ctx, st, &cache_, &buf)) return done();
    const size_t bytes = buf.desc.count * kungfu::dtype_size(buf.desc.dtype);
    run_polled(
        st.rt, bytes,
        [&](kungfu::DoneCallback finished) { topology_.all_reduce(st.rt, st.key, buf, spec_.op, std::move(finished)); },
        finish_reduce(ctx, done, spec_, st.rt, buf));
  }

 private:
  ReduceSpec spec_;
  TopologyChoice topology_;
  OutputCache cache_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuAllReduce").Device(tensorflow::DEVICE_CPU), AllReduceOp);

REGISTER_OP("KungfuGroupAllReduce")
    .Input("inputs: N * T")
    .Input("key: string")
    .Output("outputs: N * T")
    .Attr("N: int >= 1")
    .Attr(KUNGFU_COLLECTIVE_TYPES)
    .Attr("op: {'sum', 'min', 'max', 'prod', 'mean'} = 'sum'")
    .Attr("topology: string = ''")
    .SetShapeFn([](InferenceContext *c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc("All-reduces N tensors as one collective over one fused buffer; `topology` as in KungfuAllReduce.");

class GroupAllReduceOp : public AsyncOpKernel {
 public:
  explicit GroupAllReduceOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_reduce_spec(ctx, &spec_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, parse_topology_choice(ctx, &topology_));
  }
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    CollectiveStart st;
    if (!begin(ctx, n_, ctx->input(0).dtype(), Described::kFused, &st)) return done();
    if (alone(ctx, st.rt, n_)) return done();
    int64_t total = 0;
    for (int i = 0; i < n_; ++i) total += ctx->input(i).NumElements();
    Tensor fused;
    OP_REQUIRES_OK_ASYNC(ctx, fused_cache_.get(ctx, ctx->input(0).dtype(), TensorShape({total}), &fused), done);
    std::vector<Tensor> outputs;
    char *base = const_cast<char *>(fused.tensor_data().data());
    size_t offset = 0;
    for (int i = 0; i < n_; ++i) {
      const Tensor &in = ctx->input(i);
      Tensor *out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, in.shape(), &out), done);
      size_t bytes = in.tensor_data().size();
      if (bytes > 0) std::memcpy(base + offset, in.tensor_data().data(), bytes);
      offset += bytes;
      outputs.push_back(*out);
    }
    kungfu::Buffer buf{base, base, describe(fused, st.dtype), hold({fused})};
    // The fused shape alone would hide which member differs; the key names the group.
    kungfu::Runtime *rt = st.rt;
    bool mean = spec_.mean;
    topology_.all_reduce(rt, st.key, buf, spec_.op,
                         [ctx, done, fused, outputs, rt, buf, mean](const kungfu::Status &s) {
                           if (!s.ok()) {
                             ctx->SetStatus(to_tf_status(s));
                             return done();
                           }
                           if (mean && rt->size() > 1)
                             kungfu::scale_inplace(buf.recv, buf.desc.count, buf.desc.dtype, 1.0 / rt->size());
                           const char *src = fused.tensor_data().data();
                           for (const Tensor &out : outputs) {
                             size_t bytes = out.tensor_data().size();
                             if (bytes > 0) std::memcpy(const_cast<char *>(out.tensor_data().data()), src, bytes);
                             src += bytes;
                           }
                           done();
                         });
  }

 private:
  ReduceSpec spec_;
  int n_;
  TopologyChoice topology_;
  OutputCache fused_cache_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuGroupAllReduce").Device(tensorflow::DEVICE_CPU), GroupAllReduceOp);

REGISTER_OP("KungfuBroadcast")
    .Input("input: T")
    .Input("key: string")
    .Output("output: T")
    .Attr(KUNGFU_COLLECTIVE_TYPES)
    .Attr("root: int = 0")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Every worker gets the root's `input`.");

class BroadcastOp : public AsyncOpKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root", &root_));
  }
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    CollectiveStart st;
    kungfu::Buffer buf;
    if (!begin(ctx, 1, ctx->input(0).dtype(), Described::kAsInput0, &st) || !same_shape_output(ctx, st, &cache_, &buf))
      return done();
    st.rt->broadcast(st.key, buf, root_, finish(ctx, done));
  }

 private:
  int root_;
  OutputCache cache_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);

REGISTER_OP("KungfuReduce")
    .Input("input: T")
    .Input("key: string")
    .Output("output: T")
    .Attr(KUNGFU_COLLECTIVE_TYPES)
    .Attr("op: {'sum', 'min', 'max', 'prod', 'mean'} = 'sum'")
    .Attr("root: int = 0")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(
        "Element-wise reduction of `input` over all workers, delivered to `root` only: the root's output is "
        "the result ('mean' divides by the cluster size at run time), every other worker's output is its own "
        "`input`, unchanged. Uses the runtime's current topology shaped as a tree towards the root.");

class ReduceToRootOp : public AsyncOpKernel {
 public:
  explicit ReduceToRootOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_reduce_spec(ctx, &spec_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root", &root_));
  }
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    CollectiveStart st;
    if (!begin(ctx, 1, ctx->input(0).dtype(), Described::kAsInput0, &st)) return done();
    kungfu::Buffer buf;
    if (st.rt->rank() == root_) {
      if (!same_shape_output(ctx, st, &cache_, &buf)) return done();
      return st.rt->reduce(st.key, buf, spec_.op, root_, finish_reduce(ctx, done, spec_, st.rt, buf));
    }
    // Not the root: the output is the input itself (no copy, and never a
    // partial sum). Inner nodes of a tree or chain still need somewhere to
    // combine what passes through them, hence the scratch buffer.
    const Tensor &in = ctx->input(0);
    ctx->set_output(0, in);
    Tensor scratch;
    OP_REQUIRES_OK_ASYNC(ctx, scratch_.get(ctx, in.dtype(), in.shape(), &scratch), done);
    buf = kungfu::Buffer{in.tensor_data().data(), const_cast<char *>(scratch.tensor_data().data()),
                         describe(in, st.dtype), hold({in, scratch})};
    st.rt->reduce(st.key, buf, spec_.op, root_, finish(ctx, done));
  }

 private:
  ReduceSpec spec_;
  int root_;
  OutputCache cache_;
  OutputCache scratch_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuReduce").Device(tensorflow::DEVICE_CPU), ReduceToRootOp);

REGISTER_OP("KungfuAllGather")
    .Input("input: T")
    .Input("key: string")
    .Output("output: T")
    .Attr(KUNGFU_COLLECTIVE_TYPES)
    .SetShapeFn([](InferenceContext *c) {
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), c->input(0), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc("Stacks every worker's `input` along a new leading axis of size np, in rank order.");

class AllGatherOp : public AsyncOpKernel {
 public:
  explicit AllGatherOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    CollectiveStart st;
    if (!begin(ctx, 1, ctx->input(0).dtype(), Described::kAsInput0, &st)) return done();
    const Tensor &in = ctx->input(0);
    TensorShape shape = in.shape();
    shape.InsertDim(0, st.rt->size());
    Tensor *out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, cache_.output(ctx, 0, -1, shape, &out), done);
    kungfu::Buffer buf{in.tensor_data().data(), const_cast<char *>(out->tensor_data().data()), describe(in, st.dtype),
                       hold({in, *out})};
    st.rt->all_gather(st.key, buf, finish(ctx, done));
  }

 private:
  OutputCache cache_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuAllGather").Device(tensorflow::DEVICE_CPU), AllGatherOp);

REGISTER_OP("KungfuBarrier")
    .Input("key: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Returns once every worker has reached the barrier of the same key.");

class BarrierOp : public AsyncOpKernel {
 public:
  explicit BarrierOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    std::string key;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 0, "key", &key), done);
    rt->barrier(key, finish(ctx, done));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuBarrier").Device(tensorflow::DEVICE_CPU), BarrierOp);

REGISTER_OP("KungfuConsensus")
    .Input("input: T")
    .Input("key: string")
    .Output("agreed: bool")
    .Attr("T: {bool, int8, uint8, int16, int32, int64, half, bfloat16, float, double}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("True iff every worker passed byte-identical tensors (KungFu Alg. 1).");

// What consensus compares: dtype, rank, dimensions, then the data. The
// fixed-size fields come first, so the encoding of one tensor is never a
// prefix of, or equal to, the encoding of a tensor of another dtype or shape
// (float32 zeros and int32 zeros of one shape have the same data bytes).
std::vector<char> consensus_bytes(const Tensor &in) {
  std::vector<char> bytes;
  auto append = [&bytes](auto value) {
    const char *p = reinterpret_cast<const char *>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  append(static_cast<int32_t>(in.dtype()));
  append(static_cast<int32_t>(in.dims()));
  for (int i = 0; i < in.dims(); ++i) append(static_cast<int64_t>(in.dim_size(i)));
  auto data = in.tensor_data();
  bytes.insert(bytes.end(), data.data(), data.data() + data.size());
  return bytes;
}

class ConsensusOp : public AsyncOpKernel {
 public:
  explicit ConsensusOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    std::string key;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, 1, "key", &key), done);
    std::vector<char> bytes = consensus_bytes(ctx->input(0));
    Tensor *out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    Tensor result = *out;
    rt->consensus(key, std::move(bytes), [ctx, done, result](const kungfu::Status &s, bool agreed) mutable {
      if (!s.ok()) ctx->SetStatus(to_tf_status(s));
      result.scalar<bool>()() = agreed;
      done();
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuConsensus").Device(tensorflow::DEVICE_CPU), ConsensusOp);

}  // namespace kungfu_tf
