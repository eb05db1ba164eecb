// Named, versioned blobs a worker keeps for its peers to fetch (model store for
// pair averaging, state transfer to joining workers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace kungfu {

using Blob = std::shared_ptr<const std::vector<char>>;

class P2PStore {
 public:
  static constexpr uint64_t kLatest = UINT64_MAX;
  static constexpr size_t kVersionsKept = 4;  // older versions are dropped

  void save(const std::string &name, uint64_t version, Blob blob);
  // nullptr if nothing is saved under that name (and version).
  Blob get(const std::string &name, uint64_t version) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::map<uint64_t, Blob>> blobs_;
};

}  // namespace kungfu
