// Per-peer byte counters, updated by the transport threads without locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace kungfu {

class TrafficCounters {
 public:
  explicit TrafficCounters(int peers) : sent_(peers), received_(peers) {}
  void add_sent(int peer, uint64_t bytes) { sent_[peer].fetch_add(bytes, std::memory_order_relaxed); }
  void add_received(int peer, uint64_t bytes) { received_[peer].fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t sent(int peer) const { return sent_[peer].load(std::memory_order_relaxed); }
  uint64_t received(int peer) const { return received_[peer].load(std::memory_order_relaxed); }
  int peers() const { return static_cast<int>(sent_.size()); }

 private:
  std::vector<std::atomic<uint64_t>> sent_;
  std::vector<std::atomic<uint64_t>> received_;
};

}  // namespace kungfu
