// The arithmetic of the gradient statistics, shared by the per-statistic ops
// (gradient_stats_kernels.cc) and the fused per-step monitor kernels
// (monitor_step_kernels.cc): one implementation, so that both give the same
// bits for the same gradients (the monitor's tests replay it in numpy).
//
// Every sum is accumulated in double, whatever the gradients' dtype: a
// float32 sum over millions of squares loses the digits that the gradient
// noise scale takes a difference of.
#pragma once

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/tensor.h"

namespace kungfu_tf {

// Calls fn(const T *data, int64 n) with the tensor's elements as their own type.
template <typename Fn>
absl::Status visit_floats(const tensorflow::Tensor &t, Fn fn) {
  switch (t.dtype()) {
    case tensorflow::DT_HALF: fn(t.flat<Eigen::half>().data(), t.NumElements()); return absl::OkStatus();
    case tensorflow::DT_BFLOAT16: fn(t.flat<tensorflow::bfloat16>().data(), t.NumElements()); return absl::OkStatus();
    case tensorflow::DT_FLOAT: fn(t.flat<float>().data(), t.NumElements()); return absl::OkStatus();
    case tensorflow::DT_DOUBLE: fn(t.flat<double>().data(), t.NumElements()); return absl::OkStatus();
    default: return absl::InvalidArgumentError("unsupported dtype " + tensorflow::DataTypeString(t.dtype()));
  }
}

// Calls fn(const T *a, const T *b, int64 n) with two tensors of the same
// dtype and size as their own element type: one dtype dispatch per tensor
// pair, then a plain loop the compiler vectorises (reading element by element
// through Tensor::flat<T>() re-checks the dtype on every element and made
// the one-worker gradient noise scale cost more than the step it monitors).
template <typename Fn>
absl::Status visit_float_pair(const tensorflow::Tensor &a, const tensorflow::Tensor &b, Fn fn) {
  switch (a.dtype()) {
    case tensorflow::DT_HALF:
      fn(a.flat<Eigen::half>().data(), b.flat<Eigen::half>().data(), a.NumElements());
      return absl::OkStatus();
    case tensorflow::DT_BFLOAT16:
      fn(a.flat<tensorflow::bfloat16>().data(), b.flat<tensorflow::bfloat16>().data(), a.NumElements());
      return absl::OkStatus();
    case tensorflow::DT_FLOAT:
      fn(a.flat<float>().data(), b.flat<float>().data(), a.NumElements());
      return absl::OkStatus();
    case tensorflow::DT_DOUBLE:
      fn(a.flat<double>().data(), b.flat<double>().data(), a.NumElements());
      return absl::OkStatus();
    default: return absl::InvalidArgumentError("unsupported dtype " + tensorflow::DataTypeString(a.dtype()));
  }
}

// The sum of the squares of t's elements (its squared L2 norm).
double sum_of_squares(const tensorflow::Tensor &t, absl::Status *status);

// The sums that pair two successive gradients: |a|^2, |b|^2 and a.b, added
// to *cur, *prev and *dot. `a` and `b` have the same dtype and shape.
absl::Status add_pair_sums(const tensorflow::Tensor &a, const tensorflow::Tensor &b, double *cur, double *prev,
                           double *dot);

// |(a + b) / 2|^2 from the sums of add_pair_sums.
inline double squared_norm_of_mean(double cur, double prev, double dot) { return 0.25 * (cur + prev + 2.0 * dot); }

// The smoothed state of the gradient noise scale: uncorrected exponential
// moving averages of tr(Sigma) and |G|^2, and how many estimates they hold.
struct GnsState {
  double ema_noise_trace = 0.0;
  double ema_grad_sq_norm = 0.0;
  int64_t count = 0;
};

// What one step of the gradient noise scale reports (NaN until estimated).
struct GnsReport {
  double noise_trace;   // bias-corrected EMA of tr(Sigma)
  double grad_sq_norm;  // bias-corrected EMA of |G|^2
  double gns;           // their ratio
  double gns_raw;       // this step's ratio; NaN when the step was skipped
};

// Two squared norms measured at batch sizes small_batch < big_batch
// (McCandlish et al. 2018, App. A.1) give unbiased |G|^2 and tr(Sigma); they
// are folded into `state` with decay `smoothing` unless `valid` is false or
// an estimate is not finite (a loss-scale overflow, or equal batch sizes),
// then bias-corrected as Adam does.
GnsReport gns_step(double small_sq_norm, double big_sq_norm, double small_batch, double big_batch, bool valid,
                   double smoothing, GnsState *state);

}  // namespace kungfu_tf
