#include "runtime_access.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kungfu_tf {

using tensorflow::DataType;

namespace {

kungfu::Runtime *instance = nullptr;

// At process exit the worker leaves in order (queued frames flushed, peers
// told goodbye), so a peer still finishing its last step does not take our
// exit for a crash. The object itself is never destroyed: TF may run kernels
// from its own threads during exit; after shutdown() they fail cleanly.
void leave_at_exit() {
  if (instance) instance->shutdown();
}

}  // namespace

kungfu::Runtime *runtime(absl::Status *error) {
  static absl::Status init_error;
  static std::once_flag once;
  std::call_once(once, [] {
    kungfu::RuntimeOptions opt;
    kungfu::Status s = kungfu::RuntimeOptions::from_env(&opt);
    std::unique_ptr<kungfu::Runtime> rt;
    if (s.ok()) s = kungfu::Runtime::create(opt, &rt);
    if (!s.ok()) {
      init_error = to_tf_status(kungfu::Status(s.code(), "kungfu runtime could not start: " + s.message()));
      return;
    }
    instance = rt.release();
    std::atexit(leave_at_exit);
  });
  if (!instance) *error = init_error;
  return instance;
}

absl::Status to_tf_status(const kungfu::Status &s) {
  using kungfu::Code;
  switch (s.code()) {
    case Code::kOk: return absl::OkStatus();
    case Code::kInvalidArgument: return absl::InvalidArgumentError(s.message());
    case Code::kNotFound: return absl::NotFoundError(s.message());
    case Code::kDeadlineExceeded: return absl::DeadlineExceededError(s.message());
    case Code::kUnavailable: return absl::UnavailableError(s.message());
    case Code::kFailedPrecondition: return absl::FailedPreconditionError(s.message());
    case Code::kPermissionDenied: return absl::PermissionDeniedError(s.message());
    case Code::kInternal: return absl::InternalError(s.message());
  }
  return absl::InternalError(s.message());
}

bool check_runtime(tensorflow::OpKernelContext *ctx, kungfu::Runtime **out) {
  absl::Status error;
  *out = runtime(&error);
  if (*out == nullptr) {
    ctx->SetStatus(error);
    return false;
  }
  return true;
}

absl::Status to_kungfu_dtype(DataType dt, kungfu::DType *out) {
  switch (dt) {
    case tensorflow::DT_UINT8: *out = kungfu::DType::kUInt8; break;
    case tensorflow::DT_INT32: *out = kungfu::DType::kInt32; break;
    case tensorflow::DT_INT64: *out = kungfu::DType::kInt64; break;
    case tensorflow::DT_HALF: *out = kungfu::DType::kFloat16; break;
    case tensorflow::DT_BFLOAT16: *out = kungfu::DType::kBFloat16; break;
    case tensorflow::DT_FLOAT: *out = kungfu::DType::kFloat32; break;
    case tensorflow::DT_DOUBLE: *out = kungfu::DType::kFloat64; break;
    default:
      return absl::InvalidArgumentError(std::string("kungfu collectives do not support dtype ") +
                                        tensorflow::DataTypeString(dt));
  }
  return absl::OkStatus();
}

kungfu::TensorDesc describe(const tensorflow::Tensor &t, kungfu::DType dt) {
  kungfu::TensorDesc d;
  d.dtype = dt;
  for (int i = 0; i < t.dims(); ++i) d.shape.push_back(t.dim_size(i));
  d.count = static_cast<size_t>(t.NumElements());
  return d;
}

std::shared_ptr<const void> hold(std::vector<tensorflow::Tensor> tensors) {
  auto h = std::make_shared<TensorHolder>();
  h->tensors = std::move(tensors);
  return h;
}

absl::Status scalar_string(tensorflow::OpKernelContext *ctx, int index, std::string *out) {
  const tensorflow::Tensor &t = ctx->input(index);
  if (t.dtype() != tensorflow::DT_STRING || t.NumElements() != 1) {
    return absl::InvalidArgumentError("expected a scalar string input at position " + std::to_string(index));
  }
  *out = std::string(t.flat<tensorflow::tstring>()(0));
  return absl::OkStatus();
}

kungfu::DoneCallback finish(tensorflow::OpKernelContext *ctx, tensorflow::AsyncOpKernel::DoneCallback done) {
  return [ctx, done](const kungfu::Status &s) {
    if (!s.ok()) ctx->SetStatus(to_tf_status(s));
    done();
  };
}

}  // namespace kungfu_tf
