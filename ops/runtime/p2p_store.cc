#include "p2p_store.h"

namespace kungfu {

void P2PStore::save(const std::string &name, uint64_t version, Blob blob) {
  std::lock_guard<std::mutex> lock(mu_);
  auto &versions = blobs_[name];
  versions[version] = std::move(blob);
  while (versions.size() > kVersionsKept) versions.erase(versions.begin());
}

Blob P2PStore::get(const std::string &name, uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(name);
  if (it == blobs_.end() || it->second.empty()) return nullptr;
  if (version == kLatest) return it->second.rbegin()->second;
  auto v = it->second.find(version);
  return v == it->second.end() ? nullptr : v->second;
}

}  // namespace kungfu
