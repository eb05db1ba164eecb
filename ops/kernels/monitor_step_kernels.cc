// The gradient monitor's bookkeeping as two kernels per step (issue 23 §4).
//
// Built from single-purpose TF ops, monitoring a step took ~95 small ops
// (variable reads and assigns, slices, casts, a one-hot, a cond): ~0.09 ms of
// executor overhead per step whatever the model, +13 % on a 0.7 ms step.
// Here the work before the gradient all-reduce (the clock, this worker's
// squared norm, the rider) is one kernel, and everything after it (the
// averaged gradient's norm, the one-worker pairing, the EMA update and every
// monitored value) is another that reads and writes the monitor's resource
// variables itself. The arithmetic is gradient_stats.h's, shared with the
// per-statistic ops, so the values are the same bits as before.
//
// Variables are written as AssignVariableOp writes them: a new buffer
// replaces the variable's tensor under its lock, so a reader that still holds
// the previous value (a ReadVariableOp output) never sees it change.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gradient_stats.h"
#include "runtime_access.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace kungfu_tf {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::shape_inference::InferenceContext;

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

REGISTER_OP("KungfuMonitorLocal")
    .Input("start_ns: int64")
    .Input("gradients: T")
    .Output("rider: R")
    .Output("compute_time: double")
    .Output("size: int32")
    .Attr("T: list({half, bfloat16, float, double}) >= 0")
    .Attr("R: {float, double}")
    .Attr("with_norm: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext *c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "What a worker measures before the gradient all-reduce, in one kernel: its compute time (seconds from "
        "`start_ns`, a KungfuStepClockStart, until every gradient was available), its squared gradient norm "
        "(0 unless `with_norm`), and the rider that carries both through the all-reduce: [1 + size] of R (the "
        "dtype it travels in, so that it needs no cast), the norm, then the compute time at this worker's rank (zeros "
        "elsewhere), so that the mean over "
        "workers gives the mean norm and, times size, every worker's compute time. `size` is the cluster size "
        "the rider was laid out for.");

class MonitorLocalOp : public OpKernel {
 public:
  explicit MonitorLocalOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_norm", &with_norm_));
  }
  // Inexpensive, like KungfuStepClockLap: run inline the moment the last
  // gradient is ready, so the clock stops then.
  bool IsExpensive() override { return false; }
  void Compute(OpKernelContext *ctx) override {
    const int64_t now = steady_now_ns();
    int64_t start = 0;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, 0, "start_ns", &start));
    kungfu::Runtime *rt;
    if (!check_runtime(ctx, &rt)) return;
    const int size = rt->size();
    const int rank = rt->rank();
    double local_sq = 0.0;
    for (int i = 1; with_norm_ && i < ctx->num_inputs(); ++i) {  // input 0 is start_ns
      absl::Status s;
      local_sq += sum_of_squares(ctx->input(i), &s);
      OP_REQUIRES_OK(ctx, s);
    }
    const double compute_time = static_cast<double>(now - start) * 1e-9;
    Tensor *rider = nullptr, *time = nullptr, *size_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({1 + size}), &rider));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &time));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &size_out));
    // A resize between the two reads can leave rank >= size: then, as a
    // one-hot would, this worker's time is left out rather than misplaced.
    const int at = rank >= 0 && rank < size ? 1 + rank : -1;
    if (rider->dtype() == tensorflow::DT_FLOAT) {
      lay_out_rider<float>(rider, local_sq, at, compute_time);
    } else {
      lay_out_rider<double>(rider, local_sq, at, compute_time);
    }
    time->scalar<double>()() = compute_time;
    size_out->scalar<int32_t>()() = size;
  }

 private:
  // Rounded as a Cast op rounds (static_cast): the same bits as the
  // float64 rider cast to the all-reduce's float32 used to be.
  template <typename R>
  static void lay_out_rider(Tensor *rider, double local_sq, int at, double compute_time) {
    auto r = rider->vec<R>();
    r.setZero();
    r(0) = static_cast<R>(local_sq);
    if (at > 0) r(at) = static_cast<R>(compute_time);
  }

  bool with_norm_ = false;
};
REGISTER_KERNEL_BUILDER(Name("KungfuMonitorLocal").Device(tensorflow::DEVICE_CPU), MonitorLocalOp);

// The monitor's variables, in the order of the `state` input of
// KungfuMonitorUpdate; the first three are there in every monitor, the rest
// only with the gradient noise scale.
enum StateVariable {
  kComputeTime,
  kWorkerComputeTimes,
  kMonitorStep,
  kLocalBatchSize,
  kEmaNoiseTrace,
  kEmaGradSqNorm,
  kEmaCount,
  kNoiseTrace,
  kGradSqNorm,
  kGns,
  kGnsRaw,
  kStateVariables,
};
constexpr int kStateWithoutGns = kLocalBatchSize;
constexpr const char *kStateNames[kStateVariables] = {"compute_time",    "worker_compute_times",
                                                      "monitor_step",    "local_batch_size",
                                                      "ema_noise_trace", "ema_grad_sq_norm",
                                                      "ema_count",       "noise_trace",
                                                      "grad_sq_norm",    "gns",
                                                      "gns_raw"};

REGISTER_OP("KungfuMonitorUpdate")
    .Input("reduced_rider: R")
    .Input("compute_time: double")
    .Input("size: int32")
    .Input("averaged: TA")
    .Input("current: TC")
    .Input("state: resource")
    .Input("previous: num_previous * resource")
    .Attr("R: {float, double}")
    .Attr("TA: list({half, bfloat16, float, double}) >= 0")
    .Attr("TC: list({half, bfloat16, float, double}) >= 0")
    .Attr("num_state: int >= 3")
    .Attr("num_previous: int >= 0")
    .Attr("gns: bool")
    .Attr("smoothing: float")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Everything a gradient monitor updates after the gradient all-reduce, written straight into its "
        "variables (`state`: a vector of num_state variable handles, in the order compute_time, "
        "worker_compute_times, monitor_step and, with `gns`, local_batch_size, ema_noise_trace, "
        "ema_grad_sq_norm, ema_count, noise_trace, grad_sq_norm, gns, gns_raw; one tensor packed once, so "
        "that a traced step captures one input for them instead of one per variable). `reduced_rider` is "
        "KungfuMonitorLocal's rider averaged over the workers; `averaged` are the "
        "averaged gradients (their squared norm is |G_big|^2). With a cluster of one, `current` (this step's "
        "gradients) pairs with `previous` (their copies from the last step, then the batch size they had) as "
        "two batches of equal size, and replaces them; with no `previous` a one-worker step estimates nothing. "
        "The estimate is that of KungfuGnsUpdate. monitor_step is incremented last.");

// One of the monitor's variables, looked up once per step. Reads share the
// variable's buffer; writes follow TensorFlow's copy-on-write rule for
// resource variables: in place while nothing else holds the buffer,
// otherwise into a new buffer that replaces it (a ReadVariableOp output that
// still holds the old value never sees it change).
class MonitorVariable {
 public:
  absl::Status open(OpKernelContext *ctx, int input, const char *name) {
    return open(ctx, tensorflow::HandleFromInput(ctx, input), name);
  }

  absl::Status open(OpKernelContext *ctx, const tensorflow::ResourceHandle &handle, const char *name) {
    name_ = name;
    const absl::Status s = tensorflow::LookupResource(ctx, handle, &var_);
    if (!s.ok()) return absl::Status(s.code(), label() + std::string(s.message()));
    return absl::OkStatus();
  }

  absl::Status read(Tensor *out) const {
    tensorflow::tf_shared_lock lock(*var_->mu());
    if (!var_->is_initialized) return absl::FailedPreconditionError(label() + "not initialized");
    *out = *var_->tensor();
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status read_scalar(T *out) const {
    tensorflow::tf_shared_lock lock(*var_->mu());
    if (!var_->is_initialized) return absl::FailedPreconditionError(label() + "not initialized");
    TF_RETURN_IF_ERROR(check_scalar<T>(*var_->tensor()));
    *out = var_->tensor()->scalar<T>()();
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status write_scalar(OpKernelContext *ctx, T value) {
    tensorflow::mutex_lock lock(*var_->mu());
    Tensor *held = var_->tensor();
    if (var_->is_initialized && held->RefCountIsOne() && check_scalar<T>(*held).ok()) {
      held->scalar<T>()() = value;
      return absl::OkStatus();
    }
    Tensor fresh;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DataTypeToEnum<T>::value, TensorShape({}), &fresh));
    fresh.scalar<T>()() = value;
    return replace_locked(fresh);
  }

  // Replaces the variable's tensor (same dtype) by `value`.
  absl::Status write(const Tensor &value) {
    tensorflow::mutex_lock lock(*var_->mu());
    return replace_locked(value);
  }

 private:
  std::string label() const { return "KungfuMonitorUpdate: variable '" + std::string(name_) + "': "; }

  template <typename T>
  absl::Status check_scalar(const Tensor &t) const {
    const tensorflow::DataType want = tensorflow::DataTypeToEnum<T>::value;
    if (t.dtype() == want && tensorflow::TensorShapeUtils::IsScalar(t.shape())) return absl::OkStatus();
    return absl::InvalidArgumentError(label() + "must be a " + tensorflow::DataTypeString(want) + " scalar, got " +
                                      tensorflow::DataTypeString(t.dtype()) + t.shape().DebugString());
  }

  absl::Status replace_locked(const Tensor &value) {
    if (var_->tensor()->dtype() != value.dtype()) {
      return absl::InvalidArgumentError(label() + "is " + tensorflow::DataTypeString(var_->tensor()->dtype()) +
                                        ", cannot hold " + tensorflow::DataTypeString(value.dtype()));
    }
    *var_->tensor() = value;
    var_->is_initialized = true;
    return absl::OkStatus();
  }

  tensorflow::core::RefCountPtr<Var> var_;
  const char *name_ = "";
};

class MonitorUpdateOp : public OpKernel {
 public:
  explicit MonitorUpdateOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("gns", &gns_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("smoothing", &smoothing_));
    OP_REQUIRES(ctx, smoothing_ >= 0.0f && smoothing_ < 1.0f,
                absl::InvalidArgumentError("KungfuMonitorUpdate: attr 'smoothing' must be in [0, 1), got " +
                                           std::to_string(smoothing_)));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_state", &num_state_));
    const int want = gns_ ? kStateVariables : kStateWithoutGns;
    OP_REQUIRES(ctx, num_state_ == want,
                absl::InvalidArgumentError("KungfuMonitorUpdate: 'state' must hold " + std::to_string(want) +
                                           " variables " + (gns_ ? "with" : "without") + " gns, got " +
                                           std::to_string(num_state_)));
    int stop = 0;
    OP_REQUIRES_OK(ctx, InputRange("state", &state_input_, &stop));
    OP_REQUIRES_OK(ctx, InputRange("previous", &previous_start_, &previous_stop_));
    OP_REQUIRES_OK(ctx, InputRange("averaged", &averaged_start_, &averaged_stop_));
    OP_REQUIRES_OK(ctx, InputRange("current", &current_start_, &current_stop_));
  }

  void Compute(OpKernelContext *ctx) override {
    const Tensor &rider = ctx->input(0);
    double compute_time = 0.0;
    int32_t size = 0;
    OP_REQUIRES_OK(ctx, scalar_input(ctx, 1, "compute_time", &compute_time));
    OP_REQUIRES_OK(ctx, scalar_input(ctx, 2, "size", &size));
    OP_REQUIRES(ctx, size >= 1,
                absl::InvalidArgumentError("KungfuMonitorUpdate: input 'size' must be >= 1, got " +
                                           std::to_string(size)));
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(rider.shape()) && rider.NumElements() == int64_t{1} + size,
                absl::InvalidArgumentError(
                    "KungfuMonitorUpdate: input 'reduced_rider' must be a vector of 1 + size = " +
                    std::to_string(1 + size) + " elements, got shape " + rider.shape().DebugString()));
    const Tensor &handles = ctx->input(state_input_);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(handles.shape()) && handles.NumElements() == num_state_,
                absl::InvalidArgumentError("KungfuMonitorUpdate: input 'state' must be a vector of " +
                                           std::to_string(num_state_) + " variable handles, got shape " +
                                           handles.shape().DebugString()));
    MonitorVariable state[kStateVariables];
    const auto handle = handles.flat<tensorflow::ResourceHandle>();
    for (int i = 0; i < num_state_; ++i) OP_REQUIRES_OK(ctx, state[i].open(ctx, handle(i), kStateNames[i]));
    const double size_f = static_cast<double>(size);
    // The rider as float64 (a float32 one widened exactly, as a Cast would).
    std::vector<double> reduced(1 + size);
    if (rider.dtype() == tensorflow::DT_FLOAT) {
      const auto r = rider.vec<float>();
      for (int i = 0; i <= size; ++i) reduced[i] = static_cast<double>(r(i));
    } else {
      const auto r = rider.vec<double>();
      for (int i = 0; i <= size; ++i) reduced[i] = r(i);
    }

    OP_REQUIRES_OK(ctx, state[kComputeTime].write_scalar(ctx, compute_time));
    Tensor times;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_DOUBLE, TensorShape({size}), &times));
    auto t = times.vec<double>();
    for (int r = 0; r < size; ++r) t(r) = reduced[1 + r] * size_f;
    OP_REQUIRES_OK(ctx, state[kWorkerComputeTimes].write(times));
    if (gns_) OP_REQUIRES_OK(ctx, update_gns(ctx, state, reduced[0], size_f));

    int64_t step = 0;
    OP_REQUIRES_OK(ctx, state[kMonitorStep].read_scalar(&step));
    OP_REQUIRES_OK(ctx, state[kMonitorStep].write_scalar(ctx, step + 1));
  }

 private:
  absl::Status update_gns(OpKernelContext *ctx, MonitorVariable *state, double mean_local_sq, double size_f) {
    int64_t batch_size = 0;
    TF_RETURN_IF_ERROR(state[kLocalBatchSize].read_scalar(&batch_size));
    const double b = static_cast<double>(batch_size);
    const bool pairs = previous_stop_ > previous_start_;
    MonitorVariable previous_batch_size;
    if (pairs) TF_RETURN_IF_ERROR(previous_batch_size.open(ctx, previous_stop_ - 1, "previous_batch_size"));
    double small_sq = 0.0, big_sq = 0.0, small_batch = b, big_batch = 0.0;
    bool valid = true;
    if (pairs && !(size_f > 1.0)) {
      TF_RETURN_IF_ERROR(pair_with_previous(ctx, batch_size, &previous_batch_size, &small_sq, &big_sq, &valid));
      big_batch = 2.0 * b;
    } else {
      small_sq = mean_local_sq;
      big_sq = 0.0;
      for (int i = averaged_start_; i < averaged_stop_; ++i) {
        absl::Status s;
        big_sq += sum_of_squares(ctx->input(i), &s);
        TF_RETURN_IF_ERROR(s);
      }
      big_batch = b * size_f;
      // A cluster of one has a single batch size: no estimate without a
      // previous gradient to pair with.
      valid = pairs || size_f > 1.0;
      // A step at several workers leaves no copy to pair with: after a
      // shrink to one worker the first step has no pair.
      if (pairs) TF_RETURN_IF_ERROR(previous_batch_size.write_scalar<int64_t>(ctx, 0));
    }
    GnsState gns;
    TF_RETURN_IF_ERROR(state[kEmaNoiseTrace].read_scalar(&gns.ema_noise_trace));
    TF_RETURN_IF_ERROR(state[kEmaGradSqNorm].read_scalar(&gns.ema_grad_sq_norm));
    TF_RETURN_IF_ERROR(state[kEmaCount].read_scalar(&gns.count));
    const GnsReport report = gns_step(small_sq, big_sq, small_batch, big_batch, valid, smoothing_, &gns);
    TF_RETURN_IF_ERROR(state[kEmaNoiseTrace].write_scalar(ctx, gns.ema_noise_trace));
    TF_RETURN_IF_ERROR(state[kEmaGradSqNorm].write_scalar(ctx, gns.ema_grad_sq_norm));
    TF_RETURN_IF_ERROR(state[kEmaCount].write_scalar(ctx, gns.count));
    TF_RETURN_IF_ERROR(state[kNoiseTrace].write_scalar(ctx, report.noise_trace));
    TF_RETURN_IF_ERROR(state[kGradSqNorm].write_scalar(ctx, report.grad_sq_norm));
    TF_RETURN_IF_ERROR(state[kGns].write_scalar(ctx, report.gns));
    return state[kGnsRaw].write_scalar(ctx, report.gns_raw);
  }

  // The one-worker estimate: this step's and the previous step's gradients
  // as two batches of equal size, their mean as one twice as large. The pair
  // is valid only if the copy was taken at this batch size (0: no copy, or it
  // came from a step at several workers). The copy then becomes this step's.
  absl::Status pair_with_previous(OpKernelContext *ctx, int64_t batch_size, MonitorVariable *previous_batch_size,
                                  double *small_sq, double *big_sq, bool *valid) {
    const int copies = previous_stop_ - previous_start_ - 1;  // the last one is the batch size
    const int current = current_stop_ - current_start_;
    if (copies != current) {
      return absl::InvalidArgumentError("KungfuMonitorUpdate: " + std::to_string(current) + " current gradients but " +
                                        std::to_string(copies) +
                                        " previous-gradient variables (+ the batch size); they must pair up");
    }
    std::vector<MonitorVariable> previous(copies);
    double cur = 0.0, prev = 0.0, dot = 0.0;
    for (int i = 0; i < copies; ++i) {
      TF_RETURN_IF_ERROR(previous[i].open(ctx, previous_start_ + i, "previous_gradient"));
      Tensor held;
      TF_RETURN_IF_ERROR(previous[i].read(&held));
      const Tensor &g = ctx->input(current_start_ + i);
      if (held.dtype() != g.dtype() || held.shape() != g.shape()) {
        return absl::InvalidArgumentError("KungfuMonitorUpdate: current gradient " + std::to_string(i) + " is " +
                                          tensorflow::DataTypeString(g.dtype()) + g.shape().DebugString() +
                                          " but its previous-gradient variable " +
                                          tensorflow::DataTypeString(held.dtype()) + held.shape().DebugString());
      }
      TF_RETURN_IF_ERROR(add_pair_sums(g, held, &cur, &prev, &dot));
    }
    int64_t previous_size = 0;
    TF_RETURN_IF_ERROR(previous_batch_size->read_scalar(&previous_size));
    *small_sq = 0.5 * (cur + prev);
    *big_sq = squared_norm_of_mean(cur, prev, dot);
    *valid = previous_size == batch_size;
    for (int i = 0; i < copies; ++i) {
      // A copy, as AssignVariableOp makes of an input it cannot take over:
      // the gradient buffer also feeds the all-reduce and the optimizer.
      const Tensor &g = ctx->input(current_start_ + i);
      Tensor copy;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(g.dtype(), g.shape(), &copy));
      const auto from = g.tensor_data();
      if (!from.empty()) std::memcpy(const_cast<char *>(copy.tensor_data().data()), from.data(), from.size());
      TF_RETURN_IF_ERROR(previous[i].write(copy));
    }
    return previous_batch_size->write_scalar<int64_t>(ctx, batch_size);
  }

  bool gns_ = false;
  float smoothing_ = 0.0f;
  // Positions of the input lists among all inputs.
  int num_state_ = 0, state_input_ = 0, previous_start_ = 0, previous_stop_ = 0;
  int averaged_start_ = 0, averaged_stop_ = 0, current_start_ = 0, current_stop_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("KungfuMonitorUpdate").Device(tensorflow::DEVICE_CPU), MonitorUpdateOp);

}  // namespace kungfu_tf
