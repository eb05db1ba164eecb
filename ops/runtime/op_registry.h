// Operations in flight on this worker, by name: lets a timeout, a dead peer or
// an abort from another worker fail exactly the operations it concerns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
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
  // Whether the op concerns `rank` alone (a point-to-point exchange), so it
  // ends when that peer leaves in order. Collectives learn of a leaver through
  // the mailbox instead, and only if they still wait for data from it.
  virtual bool only_with(int) const { return false; }
};

class OpRegistry {
 public:
  explicit OpRegistry(double timeout_seconds);
  ~OpRegistry();

  // Registers an op under a name unique among ops in flight (point-to-point
  // ops use fresh names). Fails if the name is taken.
  Status add(const std::string &name, std::weak_ptr<PendingOp> op);
  // Registers a collective. Every worker numbers the collectives of one name
  // in call order (1, 2, ...) and their pieces and aborts carry that
  // *instance*, so a piece or abort of one instance never touches another.
  // The number is counted even when the op fails at once: here because a
  // peer already aborted this instance (its reason is returned).
  Status add_collective(const std::string &name, std::weak_ptr<PendingOp> op, uint64_t *instance);
  // Forgets `name` (for a collective: only if `instance` is the one registered).
  void remove(const std::string &name, uint64_t instance = 0);
  // An abort arrived from a peer for instance `instance` of `name`: fails it
  // if in flight here, remembers it if not started yet, ignores it if over
  // (an echo of a failure we already know).
  void abort(const std::string &name, uint64_t instance, const Status &why);
  // Fails every op that still needs `rank`.
  void peer_lost(int rank, const Status &why);
  // Fails every op that concerns `rank` alone (it left in order).
  void peer_left(int rank, const Status &why);
  // Fails every op in flight with `why` and refuses new ones with it: the
  // runtime is shutting down, the cluster changed, or the user interrupted.
  // `tell_peers`: collectives send aborts, so peers waiting on them fail too.
  void close(const Status &why, bool tell_peers = false);
  // The reason close() gave, or OK.
  Status closed() const;
  // Stops the timeout watchdog for good (after close(): nothing can be in
  // flight any more). Never call it from a callback of an op.
  void stop_watchdog();
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  struct Entry {
    std::weak_ptr<PendingOp> op;
    std::chrono::steady_clock::time_point deadline;
    uint64_t instance = 0;  // collectives only
  };
  void watch();
  Status check_addable(const std::string &name) const;  // mu_ held
  // Fails (outside the lock) every op in flight for which `doomed_if` holds.
  void fail_where(const std::function<bool(const PendingOp &)> &doomed_if, const Status &why, bool tell_peers);
  std::chrono::steady_clock::time_point deadline() const;

  const double timeout_seconds_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, Entry> ops_;
  // Per collective name: the last instance started here (one counter per
  // distinct name, kept for the life of the runtime) and aborts of instances
  // not started yet.
  std::unordered_map<std::string, uint64_t> instances_;
  std::unordered_map<std::string, std::map<uint64_t, Status>> early_aborts_;
  bool stopping_ = false;
  Status closed_;  // set by close()
  std::thread watchdog_;
};

}  // namespace kungfu
