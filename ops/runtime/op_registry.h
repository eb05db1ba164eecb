// Operations in flight on this worker, by name: lets a timeout, a dead peer or
// an abort from another worker fail exactly the operations it concerns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "status.h"

namespace kungfu {

class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Fails the op (no-op if it already finished). `tell_peers`: also send an abort
  // so the other workers stop waiting for this op instead of timing out.
  virtual void fail(const Status &why, bool tell_peers) = 0;
  // "waiting for rank 1 (127.0.0.1:10001)" for timeout messages.
  virtual std::string waiting_for() const = 0;
  // What the op is, for error messages: "all_reduce 'grad/3'".
  virtual std::string describe() const = 0;
  // Whether the op still needs messages from `rank`.
  virtual bool needs(int rank) const = 0;
};

class OpRegistry {
 public:
  explicit OpRegistry(double timeout_seconds);
  ~OpRegistry();

  // Registers an op under a name unique among ops in flight. Fails if the name
  // is taken, or if a peer already aborted an op of that name.
  Status add(const std::string &name, std::weak_ptr<PendingOp> op);
  void remove(const std::string &name);
  // Like remove(), and aborts for `name` arriving soon after are ignored: they
  // are other workers' echoes of the same failure, not news about a later op.
  void remove_failed(const std::string &name);
  // An abort arrived from a peer for `name`.
  void abort(const std::string &name, const Status &why);
  // Fails every op that still needs `rank`.
  void peer_lost(int rank, const Status &why);
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  struct Entry {
    std::weak_ptr<PendingOp> op;
    std::chrono::steady_clock::time_point deadline;
  };
  void watch();

  const double timeout_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, Entry> ops_;
  std::unordered_map<std::string, Status> early_aborts_;  // aborts that beat their op here
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> recently_failed_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace kungfu
