// See gradient_stats.h.
#include "gradient_stats.h"

#include <cmath>
#include <limits>

#include "unsupported/Eigen/CXX11/Tensor"

namespace kungfu_tf {

namespace {
// |x|^2, |y|^2 and x.y through Eigen's vectorised reductions (float, double).
template <typename T>
void add_pair_sums_eigen(const tensorflow::Tensor &a, const tensorflow::Tensor &b, double *cur, double *prev,
                         double *dot) {
  auto x = a.flat<T>().template cast<double>();
  auto y = b.flat<T>().template cast<double>();
  Eigen::Tensor<double, 0, Eigen::RowMajor> sum = x.square().sum();
  *cur += sum();
  sum = y.square().sum();
  *prev += sum();
  sum = (x * y).sum();
  *dot += sum();
}
}  // namespace

// float and double go through Eigen's vectorised reduction (a pass over a
// large model's gradients is then memory-bound, not bound by one scalar
// add chain); half and bfloat16 are rare for gradients and take the loop.
double sum_of_squares(const tensorflow::Tensor &t, absl::Status *status) {
  *status = absl::OkStatus();
  if (t.dtype() == tensorflow::DT_FLOAT) {
    Eigen::Tensor<double, 0, Eigen::RowMajor> sum = t.flat<float>().template cast<double>().square().sum();
    return sum();
  }
  if (t.dtype() == tensorflow::DT_DOUBLE) {
    Eigen::Tensor<double, 0, Eigen::RowMajor> sum = t.flat<double>().square().sum();
    return sum();
  }
  double sum = 0.0;
  *status = visit_floats(t, [&sum](const auto *p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      double x = static_cast<double>(p[i]);
      sum += x * x;
    }
  });
  return sum;
}

absl::Status add_pair_sums(const tensorflow::Tensor &a, const tensorflow::Tensor &b, double *cur, double *prev,
                           double *dot) {
  if (a.dtype() == tensorflow::DT_FLOAT) {
    add_pair_sums_eigen<float>(a, b, cur, prev, dot);
    return absl::OkStatus();
  }
  if (a.dtype() == tensorflow::DT_DOUBLE) {
    add_pair_sums_eigen<double>(a, b, cur, prev, dot);
    return absl::OkStatus();
  }
  return visit_float_pair(a, b, [&](const auto *x, const auto *y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
      const double u = static_cast<double>(x[j]), v = static_cast<double>(y[j]);
      *cur += u * u;
      *prev += v * v;
      *dot += u * v;
    }
  });
}

GnsReport gns_step(double small_sq_norm, double big_sq_norm, double small_batch, double big_batch, bool valid,
                   double smoothing, GnsState *state) {
  const double small = small_sq_norm, big = big_sq_norm, bs = small_batch, bb = big_batch;
  const double s = smoothing;
  const double grad_sq = (bb * big - bs * small) / (bb - bs);
  const double trace = (small - big) / (1.0 / bs - 1.0 / bb);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // A non-finite estimate would poison the averages for good.
  const bool use = valid && std::isfinite(grad_sq) && std::isfinite(trace);
  if (use) {
    state->ema_noise_trace = s * state->ema_noise_trace + (1.0 - s) * trace;
    state->ema_grad_sq_norm = s * state->ema_grad_sq_norm + (1.0 - s) * grad_sq;
    ++state->count;
  }
  // Adam's bias correction; 0 / 0 = NaN before the first estimate.
  const double correction = 1.0 - std::pow(s, static_cast<double>(state->count));
  GnsReport report;
  report.noise_trace = state->count > 0 ? state->ema_noise_trace / correction : nan;
  report.grad_sq_norm = state->count > 0 ? state->ema_grad_sq_norm / correction : nan;
  report.gns = report.noise_trace / report.grad_sq_norm;
  report.gns_raw = use ? trace / grad_sq : nan;
  return report;
}

}  // namespace kungfu_tf
