// Gradient statistics for monitoring (KungFu §4.2): squared norms and the
// across-worker variance, computed over whole lists of gradient tensors in one
// kernel each, so that monitoring adds a handful of ops per step however many
// variables the model has (no per-variable Python or TF math).
//
// The arithmetic lives in gradient_stats.h, shared with the fused per-step
// monitor kernels (monitor_step_kernels.cc).
#include <cstdint>
#include <limits>
#include <string>

#include "gradient_stats.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kungfu_tf {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;

#define KUNGFU_FLOAT_LIST "T: list({half, bfloat16, float, double}) >= 0"

namespace {

// Two input lists must pair up tensor by tensor: same count (by the op
// definition), same shapes. `what` names the op and the lists for the error.
absl::Status check_paired(const OpInputList &a, const OpInputList &b, const std::string &what) {
  for (int i = 0; i < a.size(); ++i) {
    if (a[i].shape() != b[i].shape()) {
      return absl::InvalidArgumentError(what + ": tensor " + std::to_string(i) + " has shape " +
                                        a[i].shape().DebugString() + " in the first list and " +
                                        b[i].shape().DebugString() + " in the second");
    }
  }
  return absl::OkStatus();
}

absl::Status scalar_output(OpKernelContext *ctx, double value) {
  Tensor *out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({}), &out));
  out->scalar<double>()() = value;
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("KungfuSquaredNorm")
    .Input("tensors: T")
    .Output("squared_norm: double")
    .Attr(KUNGFU_FLOAT_LIST)
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Sum of the squares of every element of every input (the squared L2 norm of their concatenation), "
        "accumulated in double.");

class SquaredNormOp : public OpKernel {
 public:
  explicit SquaredNormOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    OpInputList tensors;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &tensors));
    double total = 0.0;
    for (const Tensor &t : tensors) {
      absl::Status s;
      total += sum_of_squares(t, &s);
      OP_REQUIRES_OK(ctx, s);
    }
    OP_REQUIRES_OK(ctx, scalar_output(ctx, total));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSquaredNorm").Device(tensorflow::DEVICE_CPU), SquaredNormOp);

REGISTER_OP("KungfuPairSquaredNorms")
    .Input("current: T")
    .Input("previous: T")
    .Output("squared_norms: double")
    .Attr(KUNGFU_FLOAT_LIST)
    .SetShapeFn([](InferenceContext *c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    })
    .Doc(
        "[|current|^2, |previous|^2, |(current + previous) / 2|^2] over the concatenation of each list, in "
        "one pass, accumulated in double: the one-worker gradient noise scale pairs two successive "
        "gradients as two small batches and their mean as one twice as large.");

class PairSquaredNormsOp : public OpKernel {
 public:
  explicit PairSquaredNormsOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext *ctx) override {
    OpInputList current, previous;
    OP_REQUIRES_OK(ctx, ctx->input_list("current", &current));
    OP_REQUIRES_OK(ctx, ctx->input_list("previous", &previous));
    OP_REQUIRES_OK(ctx, check_paired(current, previous, "KungfuPairSquaredNorms: 'current' and 'previous'"));
    // |(x + y) / 2|^2 = (|x|^2 + |y|^2 + 2 x.y) / 4: three sums, each a
    // vectorised Eigen reduction for float and double.
    double cur = 0.0, prev = 0.0, dot = 0.0;
    for (int i = 0; i < current.size(); ++i) {
      OP_REQUIRES_OK(ctx, add_pair_sums(current[i], previous[i], &cur, &prev, &dot));
    }
    const double mean = squared_norm_of_mean(cur, prev, dot);
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({3}), &out));
    auto v = out->vec<double>();
    v(0) = cur;
    v(1) = prev;
    v(2) = mean;
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuPairSquaredNorms").Device(tensorflow::DEVICE_CPU), PairSquaredNormsOp);

REGISTER_OP("KungfuMeanVariance")
    .Input("square_means: T")
    .Input("means: T")
    .Output("mean_variance: double")
    .Attr(KUNGFU_FLOAT_LIST)
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Mean over all elements of max(square_means - means^2, 0): given the across-worker mean of each "
        "gradient element's square and of the element itself, the population variance across workers "
        "(numpy's var, ddof=0), averaged over the elements of every tensor. NaN if there are no elements.");

class MeanVarianceOp : public OpKernel {
 public:
  explicit MeanVarianceOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    OpInputList squares, means;
    OP_REQUIRES_OK(ctx, ctx->input_list("square_means", &squares));
    OP_REQUIRES_OK(ctx, ctx->input_list("means", &means));
    OP_REQUIRES_OK(ctx, check_paired(squares, means, "KungfuMeanVariance: 'square_means' and 'means'"));
    double total = 0.0;
    int64_t count = 0;
    for (int i = 0; i < squares.size(); ++i) {
      OP_REQUIRES_OK(ctx, visit_float_pair(squares[i], means[i], [&](const auto *sq, const auto *mu, int64_t n) {
                       for (int64_t j = 0; j < n; ++j) {
                         const double m = static_cast<double>(mu[j]);
                         const double v = static_cast<double>(sq[j]) - m * m;
                         // E[g^2] - E[g]^2 can come out slightly negative by rounding; a variance cannot.
                         total += v > 0.0 ? v : 0.0;
                       }
                     }));
      count += squares[i].NumElements();
    }
    OP_REQUIRES_OK(ctx, scalar_output(ctx, count > 0 ? total / static_cast<double>(count)
                                                     : std::numeric_limits<double>::quiet_NaN()));
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuMeanVariance").Device(tensorflow::DEVICE_CPU), MeanVarianceOp);

REGISTER_OP("KungfuSquares")
    .Input("tensors: T")
    .Output("squares: T")
    .Attr(KUNGFU_FLOAT_LIST)
    .SetShapeFn([](InferenceContext *c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(
        "Element-wise square of every input, each in its own dtype: the gradient variance all-reduces these "
        "next to the gradients.");

class SquaresOp : public OpKernel {
 public:
  explicit SquaresOp(OpKernelConstruction *ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext *ctx) override {
    OpInputList tensors;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &tensors));
    tensorflow::OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("squares", &outputs));
    for (int i = 0; i < tensors.size(); ++i) {
      Tensor *out = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(i, tensors[i].shape(), &out));
      OP_REQUIRES_OK(ctx, square_into(tensors[i], out));
    }
  }

 private:
  template <typename T>
  static void square(const Tensor &in, Tensor *out) {
    auto src = in.flat<T>();
    auto dst = out->flat<T>();
    for (int64_t j = 0; j < src.size(); ++j)
      dst(j) = static_cast<T>(static_cast<float>(src(j)) * static_cast<float>(src(j)));
  }
  static absl::Status square_into(const Tensor &in, Tensor *out) {
    switch (in.dtype()) {
      case tensorflow::DT_HALF: square<Eigen::half>(in, out); return absl::OkStatus();
      case tensorflow::DT_BFLOAT16: square<tensorflow::bfloat16>(in, out); return absl::OkStatus();
      case tensorflow::DT_FLOAT: square<float>(in, out); return absl::OkStatus();
      case tensorflow::DT_DOUBLE: {
        auto src = in.flat<double>();
        auto dst = out->flat<double>();
        for (int64_t j = 0; j < src.size(); ++j) dst(j) = src(j) * src(j);
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError("KungfuSquares: unsupported dtype " + tensorflow::DataTypeString(in.dtype()));
    }
  }
};
REGISTER_KERNEL_BUILDER(Name("KungfuSquares").Device(tensorflow::DEVICE_CPU), SquaresOp);

REGISTER_OP("KungfuGnsUpdate")
    .Input("small_sq_norm: double")
    .Input("big_sq_norm: double")
    .Input("small_batch: double")
    .Input("big_batch: double")
    .Input("valid: bool")
    .Input("ema_noise_trace: double")
    .Input("ema_grad_sq_norm: double")
    .Input("ema_count: int64")
    .Output("new_ema_noise_trace: double")
    .Output("new_ema_grad_sq_norm: double")
    .Output("new_ema_count: int64")
    .Output("noise_trace: double")
    .Output("grad_sq_norm: double")
    .Output("gns: double")
    .Output("gns_raw: double")
    .Attr("smoothing: float")
    .SetShapeFn([](InferenceContext *c) {
      tensorflow::shape_inference::ShapeHandle unused;
      for (int i = 0; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "One step of the gradient noise scale (McCandlish et al. 2018): the unbiased |G|^2 and tr(Sigma) from "
        "two batch sizes, folded into exponential moving averages (decay `smoothing`) unless `valid` is false "
        "or an estimate is not finite; returns the new EMA state, the bias-corrected averages, their ratio "
        "(gns) and this step's ratio (gns_raw, NaN when skipped). All scalars; one kernel instead of some "
        "forty scalar TF ops per step.");

class GnsUpdateOp : public OpKernel {
  static constexpr const char *kInputNames[] = {"small_sq_norm", "big_sq_norm",     "small_batch",      "big_batch",
                                                "valid",         "ema_noise_trace", "ema_grad_sq_norm", "ema_count"};

 public:
  explicit GnsUpdateOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("smoothing", &smoothing_));
    OP_REQUIRES(ctx, smoothing_ >= 0.0f && smoothing_ < 1.0f,
                absl::InvalidArgumentError("KungfuGnsUpdate: attr 'smoothing' must be in [0, 1), got " +
                                           std::to_string(smoothing_)));
  }
  void Compute(OpKernelContext *ctx) override {
    // Every input is a scalar; reading a larger tensor with scalar<>() would
    // abort the process (a CHECK), so refuse it with the input's name.
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const TensorShape &shape = ctx->input(i).shape();
      OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(shape),
                  absl::InvalidArgumentError("KungfuGnsUpdate: input '" + std::string(kInputNames[i]) +
                                             "' must be a scalar, got shape " + shape.DebugString()));
    }
    double in[4];
    for (int i = 0; i < 4; ++i) in[i] = ctx->input(i).scalar<double>()();
    GnsState state;
    state.ema_noise_trace = ctx->input(5).scalar<double>()();
    state.ema_grad_sq_norm = ctx->input(6).scalar<double>()();
    state.count = ctx->input(7).scalar<int64_t>()();
    const GnsReport r = gns_step(in[0], in[1], in[2], in[3], ctx->input(4).scalar<bool>()(), smoothing_, &state);
    const double outputs[] = {
        state.ema_noise_trace, state.ema_grad_sq_norm, 0.0, r.noise_trace, r.grad_sq_norm, r.gns, r.gns_raw};
    const int64_t count = state.count;
    for (int i = 0; i < 7; ++i) {
      Tensor *out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      if (i == 2) {
        out->scalar<int64_t>()() = count;
      } else {
        out->scalar<double>()() = outputs[i];
      }
    }
  }

 private:
  float smoothing_;
};
REGISTER_KERNEL_BUILDER(Name("KungfuGnsUpdate").Device(tensorflow::DEVICE_CPU), GnsUpdateOp);

}  // namespace kungfu_tf
