// Named, versioned blobs a worker keeps for its peers to fetch (model store for
// pair averaging, state transfer to joining workers, stale-synchronous clocks).
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "waiter_lists.h"

namespace kungfu {

using Blob = std::shared_ptr<const std::vector<char>>;
// Receives a blob and the version it was saved under.
using BlobCallback = std::function<void(uint64_t version, Blob blob)>;

class P2PStore {
 public:
  static constexpr uint64_t kLatest = UINT64_MAX;
  static constexpr size_t kVersionsKept = 4;  // older versions are dropped

  void save(const std::string &name, uint64_t version, Blob blob);
  // Drops every version of the blobs whose name starts with `prefix`.
  void erase_prefix(const std::string &prefix);
  // nullptr if nothing is saved under that name (and version). *found gets
  // the version returned (useful with kLatest).
  Blob get(const std::string &name, uint64_t version, uint64_t *found = nullptr) const;

  // Calls `ready` with the newest version of `name` that is >= min_version:
  // at once (on this thread) if one is saved, else from the save() that
  // saves one. Returns 0 when it was called at once, else a token for
  // cancel(). Waiting callbacks run at most once.
  uint64_t when_saved(const std::string &name, uint64_t min_version, BlobCallback ready);
  // Forgets a waiting callback. False if it ran already (or is running).
  bool cancel(const std::string &name, uint64_t token);
  // Callbacks still waiting (for tests and leak checks).
  size_t waiting() const;

 private:
  struct Waiter {
    uint64_t token = 0;
    uint64_t min_version;
    BlobCallback ready;
  };

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::map<uint64_t, Blob>> blobs_;
  WaiterLists<Waiter> waiters_;
};

}  // namespace kungfu
