// Reuses one kernel's large output buffers across runs.
//
// On CPU, TensorFlow's default allocator maps fresh pages for every large
// tensor, so a new 64 MiB all-reduce output costs page faults and kernel
// zeroing that take longer than the all-reduce itself. A buffer that nobody
// holds any more (refcount one: only this cache) can simply be written again.
// The price is memory: up to kSlots buffers per kernel stay allocated.
#pragma once

#include <mutex>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace kungfu_tf {

class OutputCache {
 public:
  static constexpr int64_t kMinBytes = 1 << 20;  // small tensors come from malloc's free lists anyway
  static constexpr size_t kSlots = 2;            // the result a caller still holds, and the next one

  // A tensor of (dtype, shape) to write into: a free cached buffer, or a new one
  // (cached if large).
  absl::Status get(tensorflow::OpKernelContext *ctx, tensorflow::DataType dtype, const tensorflow::TensorShape &shape,
                   tensorflow::Tensor *out);
  // Output `index` of (dtype, shape): forwarded from `forward_from` (an input
  // index, -1 for none) when TF allows, else from get().
  absl::Status output(tensorflow::OpKernelContext *ctx, int index, int forward_from,
                      const tensorflow::TensorShape &shape, tensorflow::Tensor **out);

 private:
  std::mutex mu_;
  std::vector<tensorflow::Tensor> slots_;
  size_t next_victim_ = 0;
};

}  // namespace kungfu_tf
