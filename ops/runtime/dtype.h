// Element types the collectives understand, and the reductions over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kungfu {

// Values are part of the wire format (frame header); never renumber.
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
};

enum class ReduceOp : uint8_t { kSum = 1, kMin = 2, kMax = 3, kProd = 4 };

size_t dtype_size(DType dt);
const char *dtype_name(DType dt);
bool dtype_valid(uint8_t raw);
const char *reduce_op_name(ReduceOp op);
// Parses "sum", "min", "max", "prod"; returns false for anything else.
bool parse_reduce_op(const std::string &name, ReduceOp *op);

// acc[i] = op(acc[i], in[i]) for i < count. Half types are reduced in float
// and rounded back (round to nearest even), like TensorFlow's CPU kernels.
void reduce_inplace(void *acc, const void *in, size_t count, DType dt, ReduceOp op);
// acc[i] *= factor for the floating types (used to turn a sum into a mean
// without another pass through TensorFlow); integers are left unchanged.
void scale_inplace(void *acc, size_t count, DType dt, double factor);
// out[i] = op(a[i], b[i]); `out` may alias `a`. Saves a copy when the first
// contribution arrives: the output never needs to be staged with our input.
void reduce_to(void *out, const void *a, const void *b, size_t count, DType dt, ReduceOp op);

}  // namespace kungfu
