// Callbacks parked per name until something arrives under that name (a saved
// blob, a table version), each with a token to cancel it. Shared by the p2p
// store and the row store; not thread-safe: the owner holds its own lock.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kungfu {

// `Waiter` has a `uint64_t token` member, set by add().
template <typename Waiter>
class WaiterLists {
 public:
  // Parks `w` under `name`; returns its token (never 0).
  uint64_t add(const std::string &name, Waiter w) {
    w.token = next_token_++;
    uint64_t token = w.token;
    lists_[name].push_back(std::move(w));
    return token;
  }

  // Removes and returns the waiters of `name` that `ready` accepts, in the order they were added.
  template <typename Ready>
  std::vector<Waiter> take_if(const std::string &name, Ready ready) {
    std::vector<Waiter> out;
    auto it = lists_.find(name);
    if (it == lists_.end()) return out;
    std::vector<Waiter> &list = it->second;
    for (auto w = list.begin(); w != list.end();) {
      if (ready(*w)) {
        out.push_back(std::move(*w));
        w = list.erase(w);
      } else {
        ++w;
      }
    }
    if (list.empty()) lists_.erase(it);
    return out;
  }

  // Forgets a waiter. False if it is not parked (it ran already, or is running).
  bool cancel(const std::string &name, uint64_t token) {
    auto it = lists_.find(name);
    if (it == lists_.end()) return false;
    std::vector<Waiter> &list = it->second;
    for (auto w = list.begin(); w != list.end(); ++w) {
      if (w->token == token) {
        list.erase(w);
        if (list.empty()) lists_.erase(it);
        return true;
      }
    }
    return false;
  }

  size_t size() const {
    size_t n = 0;
    for (const auto &kv : lists_) n += kv.second.size();
    return n;
  }

 private:
  std::unordered_map<std::string, std::vector<Waiter>> lists_;
  uint64_t next_token_ = 1;
};

}  // namespace kungfu
