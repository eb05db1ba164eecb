// A waiting caller drives same-host progress itself (Runtime::poll_until),
// with a spin budget that adapts to the host: spinning pays only while the
// answer comes within it, and on a host with more busy threads than cores a
// spin takes the core from the very peer that has to answer.
#include "runtime.h"

namespace kungfu {

namespace {

// Per waiting thread: its current budget, and how many waits since it fell
// to nothing (after kRetryAfter of them it tries the whole budget again:
// the load that made spinning useless may be gone).
thread_local std::chrono::nanoseconds poll_budget = Runtime::kPollFor;
thread_local int waits_without_polling = 0;
constexpr int kRetryAfter = 64;

}  // namespace

bool Runtime::poll_until(const std::function<bool()> &done) {
  if (poll_budget.count() == 0) {
    if (++waits_without_polling < kRetryAfter) return done();
    waits_without_polling = 0;
    poll_budget = kPollFor;
  }
  if (poll_until(done, poll_budget)) {
    poll_budget = kPollFor;
    return true;
  }
  poll_budget /= 2;
  if (poll_budget < std::chrono::microseconds(2)) poll_budget = std::chrono::nanoseconds(0);
  return false;
}

bool Runtime::poll_until(const std::function<bool()> &done, std::chrono::nanoseconds budget) {
  GenPtr g = gen();
  return g->transport ? g->transport->poll_rings(done, budget) : done();
}

uint64_t Runtime::polled_frames() const {
  GenPtr g = gen();
  return g->transport ? g->transport->polled_frames() : 0;
}

}  // namespace kungfu
