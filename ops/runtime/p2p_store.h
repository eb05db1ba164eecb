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

// The bytes of a blob: its own, or a view of memory that someone else owns
// and `owner` keeps alive (a variable's buffer that elastic state sync sends
// without copying it first).
class BlobBytes {
 public:
  explicit BlobBytes(std::vector<char> bytes) : own_(std::move(bytes)), data_(own_.data()), size_(own_.size()) {}
  BlobBytes(const char *data, size_t size, std::shared_ptr<const void> owner)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  BlobBytes(const BlobBytes &) = delete;
  BlobBytes &operator=(const BlobBytes &) = delete;

  const char *data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const char *begin() const { return data_; }
  const char *end() const { return data_ + size_; }
  char operator[](size_t i) const { return data_[i]; }

 private:
  std::vector<char> own_;
  std::shared_ptr<const void> owner_;
  const char *data_;
  size_t size_;
};

using Blob = std::shared_ptr<const BlobBytes>;

// A blob that owns `bytes`.
inline Blob make_blob(std::vector<char> bytes) { return std::make_shared<const BlobBytes>(std::move(bytes)); }
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
  // How many names hold blobs (for tests and leak checks).
  size_t size() const;

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
