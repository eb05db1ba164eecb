// A log line that may be triggered by strangers (rejected connections) is
// rate-limited by a token bucket: a burst of up to `burst` lines prints at
// once (a handful of distinct problems are all worth reading), after that one
// line per interval, with a count of what was held back, so a connection
// flood cannot fill the worker's log.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace kungfu {

class RateLimitedLog {
 public:
  RateLimitedLog(std::chrono::steady_clock::duration interval, int burst)
      : interval_(interval), burst_(burst), tokens_(burst) {}

  // Prints "kungfu: <line>" if a token is left.
  void print(const std::string &line) {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    if (tokens_ < burst_) {
      auto earned = (now - refilled_) / interval_;
      if (earned > 0) {
        tokens_ = static_cast<int>(std::min<int64_t>(burst_, tokens_ + earned));
        refilled_ = now;
      }
    } else {
      refilled_ = now;
    }
    if (tokens_ == 0) {
      ++held_back_;
      return;
    }
    --tokens_;
    if (held_back_ > 0) {
      std::fprintf(stderr, "kungfu: %s (and %llu more like it held back)\n", line.c_str(),
                   static_cast<unsigned long long>(held_back_));
    } else {
      std::fprintf(stderr, "kungfu: %s\n", line.c_str());
    }
    held_back_ = 0;
  }

 private:
  const std::chrono::steady_clock::duration interval_;
  const int burst_;
  std::mutex mu_;
  int tokens_;
  std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
  uint64_t held_back_ = 0;
};

}  // namespace kungfu
