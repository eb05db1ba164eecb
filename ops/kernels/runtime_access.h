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

// Reads a scalar string input (the message key).
absl::Status scalar_string(tensorflow::OpKernelContext *ctx, int index, std::string *out);

// Completes an async kernel from a runtime callback.
kungfu::DoneCallback finish(tensorflow::OpKernelContext *ctx, tensorflow::AsyncOpKernel::DoneCallback done);

}  // namespace kungfu_tf
