// A log line that may be triggered by strangers (rejected connections) is
// printed at most once per interval, with a count of what was held back, so
// a connection flood cannot fill the worker's log.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace kungfu {

class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::steady_clock::duration interval) : interval_(interval) {}

  // Prints "kungfu: <line>" unless a line was printed less than an interval ago.
  void print(const std::string &line) {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (printed_ && now - last_ < interval_) {
      ++held_back_;
      return;
    }
    if (held_back_ > 0) {
      std::fprintf(stderr, "kungfu: %s (and %llu more like it since the last report)\n", line.c_str(),
                   static_cast<unsigned long long>(held_back_));
    } else {
      std::fprintf(stderr, "kungfu: %s\n", line.c_str());
    }
    printed_ = true;
    last_ = now;
    held_back_ = 0;
  }

 private:
  const std::chrono::steady_clock::duration interval_;
  std::mutex mu_;
  bool printed_ = false;
  std::chrono::steady_clock::time_point last_;
  uint64_t held_back_ = 0;
};

}  // namespace kungfu
