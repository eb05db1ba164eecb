// Elastic state sync: variables travel between workers' runtimes and are
// hashed in C++, straight from and into the variables' buffers (no copy
// through Python). The layout (pieces, digest) is ops/runtime/state_pieces.h.
//
// A source saves its share of the pieces in its p2p store; a receiver fetches
// every piece from its source at once, hashing each as it lands, and only
// when all arrived installs the received buffers as the variables' values, so
// a failed fetch leaves every variable as it was.
#include <atomic>
#include <mutex>
#include <tuple>

#include "runtime_access.h"
#include "state_pieces.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace kungfu_tf {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;

namespace {

template <typename T>
using RefPtr = tensorflow::core::RefCountPtr<T>;

constexpr int64_t kDigestBytes = std::tuple_size<kungfu::StateDigest>::value;

absl::Status write_digest(OpKernelContext *ctx, const kungfu::StateDigest &d) {
  Tensor *out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({kDigestBytes}), &out));
  std::copy(d.begin(), d.end(), out->flat<uint8_t>().data());
  return absl::OkStatus();
}

absl::Status shape_fn_digest(tensorflow::shape_inference::InferenceContext *c) {
  c->set_output(0, c->Vector(kDigestBytes));
  return absl::OkStatus();
}

// Looks up input `first + i` as a variable whose bytes can travel as they are.
absl::Status lookup_variable(OpKernelContext *ctx, int first, int i, RefPtr<Var> *out) {
  absl::Status s = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, first + i), out);
  if (!s.ok()) {
    return absl::Status(s.code(), ctx->op_kernel().type_string() + ": variables[" + std::to_string(i) +
                                      "]: " + std::string(s.message()));
  }
  tensorflow::tf_shared_lock lock(*(*out)->mu());
  if (!(*out)->is_initialized) {
    return absl::FailedPreconditionError(ctx->op_kernel().type_string() + ": variables[" + std::to_string(i) +
                                         "] is not initialized");
  }
  tensorflow::DataType dt = (*out)->tensor()->dtype();
  if (!tensorflow::DataTypeCanUseMemcpy(dt)) {
    return absl::InvalidArgumentError(ctx->op_kernel().type_string() + ": variables[" + std::to_string(i) +
                                      "] has dtype " + tensorflow::DataTypeString(dt) +
                                      ", which cannot travel as bytes (numbers and bools only)");
  }
  return absl::OkStatus();
}

// The variables' current values (sharing their buffers: the members do not
// train while they sync, so nothing writes them meanwhile).
absl::Status read_variables(OpKernelContext *ctx, int first, int n, std::vector<Tensor> *values) {
  for (int i = 0; i < n; ++i) {
    RefPtr<Var> var;
    TF_RETURN_IF_ERROR(lookup_variable(ctx, first, i, &var));
    tensorflow::tf_shared_lock lock(*var->mu());
    values->push_back(*var->tensor());
  }
  return absl::OkStatus();
}

std::vector<size_t> byte_sizes(const std::vector<Tensor> &values) {
  std::vector<size_t> sizes;
  for (const Tensor &t : values) sizes.push_back(t.tensor_data().size());
  return sizes;
}

std::vector<const char *> read_pointers(const std::vector<Tensor> &values) {
  std::vector<const char *> out;
  for (const Tensor &t : values) out.push_back(t.tensor_data().data());
  return out;
}

tensorflow::thread::ThreadPool *worker_pool(OpKernelContext *ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers;
}

// Hashes every piece (in parallel on TF's CPU threads) and writes the state's digest to output 0.
absl::Status write_state_digest(OpKernelContext *ctx, const std::vector<Tensor> &values,
                                const std::vector<kungfu::StatePiece> &pieces) {
  std::vector<const char *> buffers = read_pointers(values);
  std::vector<kungfu::StateDigest> digests(pieces.size());
  auto one_piece_each = tensorflow::thread::ThreadPool::SchedulingParams::Fixed(1);
  worker_pool(ctx)->ParallelFor(static_cast<int64_t>(pieces.size()), one_piece_each, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) digests[p] = kungfu::piece_digest(pieces[p], buffers);
  });
  uint64_t total = 0;
  for (size_t s : byte_sizes(values)) total += s;
  return write_digest(ctx, kungfu::state_digest(total, digests));
}

}  // namespace

REGISTER_OP("KungfuStateDigest")
    .Input("variables: N * resource")
    .Output("digest: uint8")
    .Attr("N: int >= 0")
    .SetIsStateful()
    .SetShapeFn(shape_fn_digest)
    .Doc("XXH3-128 digest of the variables' bytes as elastic state sync lays them out (state_pieces.h).");

class StateDigestOp : public OpKernel {
 public:
  explicit StateDigestOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    std::vector<Tensor> values;
    OP_REQUIRES_OK(ctx, read_variables(ctx, 0, ctx->num_inputs(), &values));
    OP_REQUIRES_OK(ctx, write_state_digest(ctx, values, kungfu::state_pieces(byte_sizes(values))));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStateDigest").Device(tensorflow::DEVICE_CPU), StateDigestOp);

REGISTER_OP("KungfuBytesDigest")
    .Input("data: uint8")
    .Output("digest: uint8")
    .SetIsStateful()
    .SetShapeFn(shape_fn_digest)
    .Doc(
        "The digest KungfuStateDigest gives variables whose bytes, concatenated, are `data` (a vector): for "
        "state that reaches Python as bytes (tf.compat.v1 session variables).");

class BytesDigestOp : public OpKernel {
 public:
  explicit BytesDigestOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    const Tensor &data = ctx->input(0);
    OP_REQUIRES(ctx, data.dims() == 1,
                absl::InvalidArgumentError("KungfuBytesDigest: data must be a vector of bytes, got shape " +
                                           data.shape().DebugString()));
    const char *bytes = data.tensor_data().data();
    std::vector<kungfu::StatePiece> pieces = kungfu::state_pieces({data.tensor_data().size()});
    std::vector<kungfu::StateDigest> digests;
    for (const kungfu::StatePiece &p : pieces) digests.push_back(kungfu::piece_digest(p, {bytes}));
    OP_REQUIRES_OK(ctx, write_digest(ctx, kungfu::state_digest(data.tensor_data().size(), digests)));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuBytesDigest").Device(tensorflow::DEVICE_CPU), BytesDigestOp);

REGISTER_OP("KungfuStateSave")
    .Input("variables: N * resource")
    .Input("blob_prefix: string")
    .Input("version: int64")
    .Input("source: int32")
    .Input("sources: int32")
    .Output("digest: uint8")
    .Attr("N: int >= 0")
    .SetIsStateful()
    .SetShapeFn(shape_fn_digest)
    .Doc(
        "Saves this worker's share (source `source` of `sources`) of the variables' pieces in its p2p store "
        "under `blob_prefix`/<piece> and `version`, for KungfuStateFetch on the receivers, then returns the "
        "state's digest like KungfuStateDigest.");

class StateSaveOp : public OpKernel {
 public:
  explicit StateSaveOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    const int n = ctx->num_inputs() - 4;
    std::string prefix;
    OP_REQUIRES_OK(ctx, read_key(ctx, n, "blob_prefix", &prefix));
    int64_t version;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, n + 1, "version", &version));
    OP_REQUIRES(ctx, version >= 0,
                absl::InvalidArgumentError("KungfuStateSave: version must be >= 0, got " + std::to_string(version)));
    int32_t source, sources;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, n + 2, "source", &source));
    OP_REQUIRES_OK(ctx, scalar_input(ctx, n + 3, "sources", &sources));
    OP_REQUIRES(ctx, sources >= 1 && source >= 0 && source < sources,
                absl::InvalidArgumentError("KungfuStateSave: source must be in [0, sources) with sources >= 1, got " +
                                           std::to_string(source) + " of " + std::to_string(sources)));
    std::vector<Tensor> values;
    OP_REQUIRES_OK(ctx, read_variables(ctx, 0, n, &values));
    std::vector<kungfu::StatePiece> pieces = kungfu::state_pieces(byte_sizes(values));
    std::vector<const char *> buffers = read_pointers(values);
    // Saved before hashing, so that receivers fetch while we hash. A piece
    // inside one variable is a view of its buffer (no copy; the blob holds a
    // reference, so an update before KungfuStateForget copies the variable
    // instead of changing what peers receive); one that crosses variables
    // is gathered into a buffer of its own.
    for (size_t p = 0; p < pieces.size(); ++p) {
      if (kungfu::piece_source(p, sources) != static_cast<size_t>(source)) continue;
      const kungfu::StatePiece &piece = pieces[p];
      kungfu::Blob blob;
      if (piece.segments.size() == 1) {
        const kungfu::StateSegment &seg = piece.segments[0];
        blob = std::make_shared<const kungfu::BlobBytes>(buffers[seg.variable] + seg.offset, seg.len,
                                                         hold({values[seg.variable]}));
      } else {
        std::vector<char> bytes;
        bytes.reserve(piece.len);
        for (const kungfu::StateSegment &seg : piece.segments) {
          const char *from = buffers[seg.variable] + seg.offset;
          bytes.insert(bytes.end(), from, from + seg.len);
        }
        blob = kungfu::make_blob(std::move(bytes));
      }
      rt->save(kungfu::piece_name(prefix, p), static_cast<uint64_t>(version), std::move(blob));
    }
    OP_REQUIRES_OK(ctx, write_state_digest(ctx, values, pieces));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStateSave").Device(tensorflow::DEVICE_CPU), StateSaveOp);

REGISTER_OP("KungfuStateFetch")
    .Input("variables: N * resource")
    .Input("ranks: int32")
    .Input("blob_prefix: string")
    .Input("min_version: int64")
    .Output("digest: uint8")
    .Attr("N: int >= 0")
    .SetIsStateful()
    .SetShapeFn(shape_fn_digest)
    .Doc(
        "Fetches the variables' pieces that the workers `ranks` (source j = ranks[j]) saved with KungfuStateSave "
        "under `blob_prefix` with a version >= `min_version` (waiting on them until saved, at most the runtime "
        "timeout), all at once, hashing each as it lands. Only when every piece arrived do the variables take "
        "the received values; after an error they keep their own. Returns the state's digest.");

// One fetch in flight: shared by the requests' callbacks, kept alive by the
// runtime until the last of them ran (it owns the buffers they write into).
struct StateFetch {
  OpKernelContext *ctx;
  AsyncOpKernel::DoneCallback done;
  tensorflow::thread::ThreadPool *pool;
  std::vector<RefPtr<Var>> variables;
  std::vector<Tensor> received;  // fresh buffers, one per variable
  std::vector<char *> buffers;   // received[i]'s bytes
  std::vector<kungfu::StatePiece> pieces;
  std::vector<kungfu::StateDigest> digests;
  uint64_t total = 0;
  Tensor *digest = nullptr;
  std::atomic<size_t> pending{0};
  std::mutex mu;
  kungfu::Status error;  // the first one (mu)

  void fail(const kungfu::Status &s) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.ok()) error = s;
  }

  void piece_done() {
    if (pending.fetch_sub(1) == 1) finish();
  }

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!error.ok()) {
        ctx->SetStatus(to_tf_status(error));
        return done();
      }
    }
    for (size_t i = 0; i < variables.size(); ++i) {
      tensorflow::mutex_lock lock(*variables[i]->mu());
      *variables[i]->tensor() = received[i];
    }
    // Our references go, so the variables own their buffers alone and the
    // optimizer keeps updating them in place.
    received.clear();
    buffers.clear();
    kungfu::StateDigest d = kungfu::state_digest(total, digests);
    std::copy(d.begin(), d.end(), digest->flat<uint8_t>().data());
    done();
  }
};

class StateFetchOp : public AsyncOpKernel {
 public:
  explicit StateFetchOp(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {}
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return done();
    const int n = ctx->num_inputs() - 3;
    const Tensor &ranks = ctx->input(n);
    OP_REQUIRES_ASYNC(ctx, ranks.dims() == 1 && ranks.NumElements() >= 1,
                      absl::InvalidArgumentError("KungfuStateFetch: ranks must be a non-empty vector, got shape " +
                                                 ranks.shape().DebugString()),
                      done);
    std::string prefix;
    OP_REQUIRES_OK_ASYNC(ctx, read_key(ctx, n + 1, "blob_prefix", &prefix), done);
    int64_t min_version;
    OP_REQUIRES_OK_ASYNC(ctx, scalar_input(ctx, n + 2, "min_version", &min_version), done);
    OP_REQUIRES_ASYNC(ctx, min_version >= 0,
                      absl::InvalidArgumentError("KungfuStateFetch: min_version must be >= 0, got " +
                                                 std::to_string(min_version)),
                      done);
    auto f = std::make_shared<StateFetch>();
    f->ctx = ctx;
    f->done = done;
    f->pool = worker_pool(ctx);
    std::vector<size_t> sizes;
    for (int i = 0; i < n; ++i) {
      RefPtr<Var> var;
      OP_REQUIRES_OK_ASYNC(ctx, lookup_variable(ctx, 0, i, &var), done);
      tensorflow::DataType dt;
      TensorShape shape;
      {
        tensorflow::tf_shared_lock lock(*var->mu());
        dt = var->tensor()->dtype();
        shape = var->tensor()->shape();
      }
      Tensor fresh;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(dt, shape, &fresh), done);
      f->buffers.push_back(const_cast<char *>(fresh.tensor_data().data()));
      sizes.push_back(fresh.tensor_data().size());
      f->total += sizes.back();
      f->received.push_back(std::move(fresh));
      f->variables.push_back(std::move(var));
    }
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({kDigestBytes}), &f->digest), done);
    f->pieces = kungfu::state_pieces(sizes);
    f->digests.resize(f->pieces.size());
    if (f->pieces.empty()) return f->finish();
    f->pending = f->pieces.size();
    auto source_ranks = ranks.flat<int32_t>();
    const size_t sources = static_cast<size_t>(ranks.NumElements());
    for (size_t p = 0; p < f->pieces.size(); ++p) {
      const kungfu::StatePiece &piece = f->pieces[p];
      // A piece inside one variable lands in place; one that crosses
      // variables lands in a staging buffer and is scattered from there.
      std::shared_ptr<std::vector<char>> staging;
      char *dst;
      if (piece.segments.size() == 1) {
        dst = f->buffers[piece.segments[0].variable] + piece.segments[0].offset;
      } else {
        staging = std::make_shared<std::vector<char>>(piece.len);
        dst = staging->data();
      }
      std::shared_ptr<const void> keepalive = staging ? std::shared_ptr<const void>(staging) : nullptr;
      int peer = source_ranks(kungfu::piece_source(p, sources));
      rt->request_at_least(peer, kungfu::piece_name(prefix, p), static_cast<uint64_t>(min_version), dst, piece.len,
                           std::make_shared<std::pair<std::shared_ptr<StateFetch>, std::shared_ptr<const void>>>(
                               f, std::move(keepalive)),
                           [f, p, staging](const kungfu::Status &s, uint64_t) {
                             if (!s.ok()) {
                               f->fail(s);
                               return f->piece_done();
                             }
                             // Hashed off the transport's thread, which goes on receiving.
                             f->pool->Schedule([f, p, staging] {
                               const kungfu::StatePiece &piece = f->pieces[p];
                               if (staging) kungfu::scatter_piece(piece, staging->data(), f->buffers);
                               std::vector<const char *> buffers(f->buffers.begin(), f->buffers.end());
                               f->digests[p] = kungfu::piece_digest(piece, buffers);
                               f->piece_done();
                             });
                           });
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStateFetch").Device(tensorflow::DEVICE_CPU), StateFetchOp);

REGISTER_OP("KungfuStateForget")
    .Input("blob_prefix: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Drops the pieces this worker saved under `blob_prefix` (every receiver has them).");

class StateForgetOp : public OpKernel {
 public:
  explicit StateForgetOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    std::string prefix;
    OP_REQUIRES_OK(ctx, read_key(ctx, 0, "blob_prefix", &prefix));
    rt->forget(prefix + "/");
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuStateForget").Device(tensorflow::DEVICE_CPU), StateForgetOp);

}  // namespace kungfu_tf
