// A point-to-point operation in flight, and how its request goes out.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "collective_op.h"  // DoneCallback
#include "frame.h"
#include "op_registry.h"
#include "transport.h"

namespace kungfu {

// A point-to-point operation in flight (request, push, a request parked on
// the serving side), registered so that timeouts and dead peers fail it.
class PeerOp : public PendingOp {
 public:
  PeerOp(int rank, std::string what, std::string describe, DoneCallback done)
      : rank_(rank), what_(std::move(what)), describe_(std::move(describe)), done_(std::move(done)) {}
  void complete(const Status &s) {
    if (!finished_.exchange(true)) done_(s);
  }
  // Like complete(work()), but `work` (which writes the result) runs only if
  // the op has not finished yet: nothing lands in an output after a timeout.
  template <typename Work>
  void complete_with(Work work) {
    if (!finished_.exchange(true)) done_(work());
  }
  // Runs `cleanup` when the op fails (timeout, dead peer), or now if it
  // already has; it releases what a result would have come through.
  void on_failure(std::function<void()> cleanup) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_) {
      cleanup_ = std::move(cleanup);
      return;
    }
    lock.unlock();
    cleanup();
  }
  void fail(const Status &why, bool) override {
    std::function<void()> cleanup;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
      cleanup.swap(cleanup_);
    }
    complete(why);
    if (cleanup) cleanup();
  }
  std::string waiting_for() const override { return "waiting for " + describe_; }
  std::string describe() const override { return what_; }
  bool needs(int rank) const override { return rank == rank_; }
  bool only_with(int rank) const override { return rank == rank_; }

 private:
  const int rank_;
  const std::string what_;
  const std::string describe_;
  DoneCallback done_;
  std::atomic<bool> finished_{false};
  std::mutex mu_;  // guards the two below
  bool failed_ = false;
  std::function<void()> cleanup_;
};

// Sends request frame `h` about `name`, carrying the request id `id`; the
// answer comes through the mailbox, a failed send fails `op` at once.
void send_request(Transport &transport, OpRegistry *registry, int peer, FrameHeader h, const std::string &name,
                  const std::string &id, std::shared_ptr<PeerOp> op);

}  // namespace kungfu
