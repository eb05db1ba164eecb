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
thread_local std::chrono::nanoseconds thread_budget = Runtime::kPollFor;
thread_local int waits_without_polling = 0;
constexpr int kRetryAfter = 64;
// The runtime's poll_epoch_ this thread saw last.
thread_local uint64_t seen_poll_epoch = 0;

}  // namespace

std::chrono::nanoseconds Runtime::poll_budget() { return thread_budget; }

bool Runtime::poll_until(const std::function<bool()> &done) {
  // An AUTO probe holds its class's calls while its samples run, longer than
  // any budget, so the callers' budgets fell to nothing during it. A peer
  // that does not poll answers only through its receiving thread, slower
  // than the budget, so neither side's later retry was covered and both
  // stayed off the fast path: 4 B took 2-67 us per call on AUTO's choice,
  // 1.8 us on the same topology fixed (make bench, np=2). Every worker
  // settles at the same call, so all start again from the full budget there.
  const uint64_t epoch = poll_epoch_.load(std::memory_order_relaxed);
  if (epoch != seen_poll_epoch) {
    seen_poll_epoch = epoch;
    thread_budget = kPollFor;
    waits_without_polling = 0;
  }
  if (thread_budget.count() == 0) {
    if (++waits_without_polling < kRetryAfter) return done();
    waits_without_polling = 0;
    thread_budget = kPollFor;
  }
  if (poll_until(done, thread_budget)) {
    thread_budget = kPollFor;
    return true;
  }
  thread_budget /= 2;
  if (thread_budget < std::chrono::microseconds(2)) thread_budget = std::chrono::nanoseconds(0);
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
