// The bridge from TensorFlow kernels to the communication runtime: the
// process-wide runtime, status conversion, dtype mapping, and tensor lifetime.
#pragma once

#include <memory>
#include <vector>

#include "runtime.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace kungfu_tf {

// The runtime of this process, created from the KUNGFU_* environment on first
// use. Null (with *error set) if it could not start; every op then fails with
// that error rather than hanging.
kungfu::Runtime *runtime(absl::Status *error);

absl::Status to_tf_status(const kungfu::Status &s);
// Fails the kernel with `s` if not OK.
bool check_runtime(tensorflow::OpKernelContext *ctx, kungfu::Runtime **out);

absl::Status to_kungfu_dtype(tensorflow::DataType dt, kungfu::DType *out);
kungfu::TensorDesc describe(const tensorflow::Tensor &t, kungfu::DType dt);

// Holds tensors (refcounted buffers) until the runtime no longer touches them.
struct TensorHolder {
  std::vector<tensorflow::Tensor> tensors;
};
std::shared_ptr<const void> hold(std::vector<tensorflow::Tensor> tensors);

// Every input is checked before use: TF's own accessors (scalar<T>(), ...)
// abort the whole process on a wrong shape, so a bad argument from Python
// must become an InvalidArgumentError naming the op and the input first.

// Reads input `index` (named `input` in the op's definition) as a scalar
// string, e.g. the topology name of KungfuSetTopology.
absl::Status scalar_string(tensorflow::OpKernelContext *ctx, int index, const char *input, std::string *out);

// The longest message key or blob name a user may give, in bytes. The
// runtime appends piece and phase suffixes to it and a frame allows 4096
// bytes of key, so user names stay well below that.
constexpr size_t kMaxUserKeyBytes = 1024;

// A user's message key or p2p name: non-empty, at most kMaxUserKeyBytes
// bytes, without '\x00' (C strings) and '\x01' (the runtime's separator of
// internal sub-keys, so no user key can collide with one). `what` names the
// source in the error, e.g. "KungfuAllReduce: input 'key'".
absl::Status validate_user_key(const std::string &key, const std::string &what);

// Reads input `index` (named `input`) as a scalar string and validates it as a key.
absl::Status read_key(tensorflow::OpKernelContext *ctx, int index, const char *input, std::string *out);

// Reads input `index` (named `input`, of dtype T) as a scalar.
template <typename T>
absl::Status scalar_input(tensorflow::OpKernelContext *ctx, int index, const char *input, T *out);

// Collectives send a tensor's shape in the frame header, which holds
// kungfu::kMaxDims dimensions, and peers compare shapes: a larger rank would
// be cut and fail as a false mismatch, so it is refused before anything is
// sent (`what` names the op and key).
absl::Status check_rank_fits(const tensorflow::Tensor &t, const std::string &what);

// "KungfuRequest: input 'rank'": the op of the running kernel and one of its inputs.
std::string input_label(tensorflow::OpKernelContext *ctx, const char *input);

// Completes an async kernel from a runtime callback.
kungfu::DoneCallback finish(tensorflow::OpKernelContext *ctx, tensorflow::AsyncOpKernel::DoneCallback done);

template <typename T>
absl::Status scalar_input(tensorflow::OpKernelContext *ctx, int index, const char *input, T *out) {
  const tensorflow::Tensor &t = ctx->input(index);
  if (t.dtype() != tensorflow::DataTypeToEnum<T>::value) {
    return absl::InvalidArgumentError(input_label(ctx, input) + " must be " +
                                      tensorflow::DataTypeString(tensorflow::DataTypeToEnum<T>::value) + ", got " +
                                      tensorflow::DataTypeString(t.dtype()));
  }
  if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(input_label(ctx, input) + " must be a scalar, got shape " +
                                      t.shape().DebugString());
  }
  *out = t.scalar<T>()();
  return absl::OkStatus();
}

}  // namespace kungfu_tf
