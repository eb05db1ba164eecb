#include "runtime_access.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "frame.h"
#include "tensorflow/core/framework/tensor_shape.h"

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

std::string input_label(tensorflow::OpKernelContext *ctx, const char *input) {
  return ctx->op_kernel().type_string() + ": input '" + input + "'";
}

absl::Status scalar_string(tensorflow::OpKernelContext *ctx, int index, const char *input, std::string *out) {
  const tensorflow::Tensor &t = ctx->input(index);
  if (t.dtype() != tensorflow::DT_STRING || !tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(input_label(ctx, input) + " must be a scalar string, got " +
                                      tensorflow::DataTypeString(t.dtype()) + " of shape " + t.shape().DebugString());
  }
  *out = std::string(t.scalar<tensorflow::tstring>()());
  return absl::OkStatus();
}

namespace {

// The key as printable text for an error message: control bytes escaped,
// long keys cut (the length is reported separately).
std::string printable(const std::string &key) {
  constexpr size_t kShown = 64;
  std::string out;
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (key.size() > kShown) out += "...";
  return out;
}

}  // namespace

absl::Status validate_user_key(const std::string &key, const std::string &what) {
  if (key.empty()) return absl::InvalidArgumentError(what + ": a name must not be empty");
  if (key.size() > kMaxUserKeyBytes) {
    return absl::InvalidArgumentError(what + ": name '" + printable(key) + "' is " + std::to_string(key.size()) +
                                      " bytes; names may be at most " + std::to_string(kMaxUserKeyBytes) + " bytes");
  }
  for (char reserved : {'\x00', '\x01'}) {
    size_t at = key.find(reserved);
    if (at != std::string::npos) {
      return absl::InvalidArgumentError(what + ": name '" + printable(key) + "' contains byte " +
                                        (reserved == '\x00' ? "'\\x00'" : "'\\x01' (reserved for internal sub-keys)") +
                                        " at offset " + std::to_string(at));
    }
  }
  return absl::OkStatus();
}

absl::Status read_key(tensorflow::OpKernelContext *ctx, int index, const char *input, std::string *out) {
  TF_RETURN_IF_ERROR(scalar_string(ctx, index, input, out));
  return validate_user_key(*out, input_label(ctx, input));
}

absl::Status check_rank_fits(const tensorflow::Tensor &t, const std::string &what) {
  if (t.dims() > kungfu::kMaxDims) {
    return absl::InvalidArgumentError("kungfu collectives support at most " + std::to_string(kungfu::kMaxDims) +
                                      " dimensions, got " + std::to_string(t.dims()) + " for " + what + " (shape " +
                                      t.shape().DebugString() + "); reshape it first, e.g. to 1-D");
  }
  return absl::OkStatus();
}

kungfu::DoneCallback finish(tensorflow::OpKernelContext *ctx, tensorflow::AsyncOpKernel::DoneCallback done) {
  return [ctx, done](const kungfu::Status &s) {
    if (!s.ok()) ctx->SetStatus(to_tf_status(s));
    done();
  };
}

}  // namespace kungfu_tf
