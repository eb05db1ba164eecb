// Element-wise reductions: the inner loop of every all-reduce, so it must run
// at memory speed. g++ -O2's "very cheap" vectoriser skips loops that need an
// epilogue, which is all of these, so this file asks for full vectorisation.
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#include <cmath>
#include <cstring>
#include <type_traits>

#include "dtype.h"

namespace kungfu {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kUInt8: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kFloat64: return 8;
  }
  return 0;
}

const char *dtype_name(DType dt) {
  switch (dt) {
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

bool dtype_valid(uint8_t raw) { return raw >= 1 && raw <= 7; }

const char *reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "unknown";
}

bool parse_reduce_op(const std::string &name, ReduceOp *op) {
  if (name == "sum") *op = ReduceOp::kSum;
  else if (name == "min") *op = ReduceOp::kMin;
  else if (name == "max") *op = ReduceOp::kMax;
  else if (name == "prod") *op = ReduceOp::kProd;
  else return false;
  return true;
}

namespace {

// Integer sums and products wrap around, as in TensorFlow. Signed overflow is
// undefined behaviour in C++, so signed integers are added and multiplied in
// the unsigned type of the same width: the same machine instructions, defined
// results. (uint8 is promoted to int, where its products cannot overflow.)
template <typename T, bool = (std::is_integral_v<T> && std::is_signed_v<T>)>
struct ArithType {
  using type = T;
};
template <typename T>
struct ArithType<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using Arith = typename ArithType<T>::type;

template <typename T>
T add(T a, T b) {
  return static_cast<T>(static_cast<Arith<T>>(a) + static_cast<Arith<T>>(b));
}

template <typename T>
T mul(T a, T b) {
  return static_cast<T>(static_cast<Arith<T>>(a) * static_cast<Arith<T>>(b));
}

template <typename T>
void reduce_typed(T *__restrict acc, const T *__restrict in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) acc[i] = add(acc[i], in[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) acc[i] = mul(acc[i], in[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] < acc[i] ? in[i] : acc[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] > acc[i] ? in[i] : acc[i];
      break;
  }
}

// `out` may alias `a` (not __restrict): element i is read before it is written.
template <typename T>
void reduce3_typed(T *out, const T *a, const T *__restrict b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) out[i] = add(a[i], b[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) out[i] = mul(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = b[i] > a[i] ? b[i] : a[i];
      break;
  }
}

// IEEE binary16 <-> float conversions (no F16C dependency, so the library runs
// on any x86-64 and on ARM).
float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                               // result is subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    // A half subnormal counts units of 2^-24; m * 2^(e-150) / 2^-24 = m >> (126 - e).
    uint32_t shift = 126 - e;
    uint32_t half_m = m >> shift;
    // round to nearest even on the bits shifted out
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);  // a carry to 0x400 is the smallest normal
  }
  uint32_t e = (absx >> 23) - 127 + 15;
  uint32_t m = absx & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

float apply(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return b > a ? b : a;
  }
  return a;
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) out[i] = FromFloat(apply(ToFloat(a[i]), ToFloat(b[i]), op));
}

}  // namespace

void reduce_inplace(void *acc, const void *in, size_t count, DType dt, ReduceOp op) {
  switch (dt) {
    case DType::kUInt8: reduce_typed(static_cast<uint8_t *>(acc), static_cast<const uint8_t *>(in), count, op); break;
    case DType::kInt32: reduce_typed(static_cast<int32_t *>(acc), static_cast<const int32_t *>(in), count, op); break;
    case DType::kInt64: reduce_typed(static_cast<int64_t *>(acc), static_cast<const int64_t *>(in), count, op); break;
    case DType::kFloat32: reduce_typed(static_cast<float *>(acc), static_cast<const float *>(in), count, op); break;
    case DType::kFloat64: reduce_typed(static_cast<double *>(acc), static_cast<const double *>(in), count, op); break;
    case DType::kFloat16:
    case DType::kBFloat16: reduce_to(acc, acc, in, count, dt, op); break;
  }
}

void scale_inplace(void *acc, size_t count, DType dt, double factor) {
  switch (dt) {
    case DType::kFloat32: {
      float *p = static_cast<float *>(acc);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] *= f;
      break;
    }
    case DType::kFloat64: {
      double *p = static_cast<double *>(acc);
      for (size_t i = 0; i < count; ++i) p[i] *= factor;
      break;
    }
    case DType::kFloat16: {
      uint16_t *p = static_cast<uint16_t *>(acc);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_half(half_to_float(p[i]) * static_cast<float>(factor));
      break;
    }
    case DType::kBFloat16: {
      uint16_t *p = static_cast<uint16_t *>(acc);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) * static_cast<float>(factor));
      break;
    }
    default: break;  // integer means are not defined here; the Python wrapper rejects them
  }
}

void reduce_to(void *out, const void *a, const void *b, size_t count, DType dt, ReduceOp op) {
  switch (dt) {
    case DType::kUInt8:
      reduce3_typed(static_cast<uint8_t *>(out), static_cast<const uint8_t *>(a), static_cast<const uint8_t *>(b),
                    count, op);
      break;
    case DType::kInt32:
      reduce3_typed(static_cast<int32_t *>(out), static_cast<const int32_t *>(a), static_cast<const int32_t *>(b),
                    count, op);
      break;
    case DType::kInt64:
      reduce3_typed(static_cast<int64_t *>(out), static_cast<const int64_t *>(a), static_cast<const int64_t *>(b),
                    count, op);
      break;
    case DType::kFloat32:
      reduce3_typed(static_cast<float *>(out), static_cast<const float *>(a), static_cast<const float *>(b), count, op);
      break;
    case DType::kFloat64:
      reduce3_typed(static_cast<double *>(out), static_cast<const double *>(a), static_cast<const double *>(b), count,
                    op);
      break;
    case DType::kFloat16:
      reduce_half<half_to_float, float_to_half>(static_cast<uint16_t *>(out), static_cast<const uint16_t *>(a),
                                                static_cast<const uint16_t *>(b), count, op);
      break;
    case DType::kBFloat16:
      reduce_half<bf16_to_float, float_to_bf16>(static_cast<uint16_t *>(out), static_cast<const uint16_t *>(a),
                                                static_cast<const uint16_t *>(b), count, op);
      break;
  }
}

}  // namespace kungfu
