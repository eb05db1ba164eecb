#include "p2p_store.h"

#include "prefix_erase.h"

namespace kungfu {

void P2PStore::save(const std::string &name, uint64_t version, Blob blob) {
  std::vector<Waiter> ready;
  uint64_t newest;
  Blob newest_blob;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto &versions = blobs_[name];
    versions[version] = std::move(blob);
    while (versions.size() > kVersionsKept) versions.erase(versions.begin());
    newest = versions.rbegin()->first;
    newest_blob = versions.rbegin()->second;
    // Every waiter wanted more than the newest version before this save, so
    // the newest one now is the one to hand out.
    ready = waiters_.take_if(name, [newest](const Waiter &w) { return w.min_version <= newest; });
  }
  // Outside the lock: a callback sends to the network, and may save or wait again.
  for (Waiter &r : ready) r.ready(newest, newest_blob);
}

void P2PStore::erase_prefix(const std::string &prefix) {
  std::vector<std::map<uint64_t, Blob>> dropped;  // freed outside the lock (tens of MB for a model's state)
  std::lock_guard<std::mutex> lock(mu_);
  dropped = take_by_prefix(blobs_, prefix);
}

Blob P2PStore::get(const std::string &name, uint64_t version, uint64_t *found) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(name);
  if (it == blobs_.end() || it->second.empty()) return nullptr;
  auto v = version == kLatest ? std::prev(it->second.end()) : it->second.find(version);
  if (v == it->second.end()) return nullptr;
  if (found) *found = v->first;
  return v->second;
}

uint64_t P2PStore::when_saved(const std::string &name, uint64_t min_version, BlobCallback ready) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = blobs_.find(name);
  if (it != blobs_.end() && !it->second.empty() && it->second.rbegin()->first >= min_version) {
    uint64_t version = it->second.rbegin()->first;
    Blob blob = it->second.rbegin()->second;
    lock.unlock();
    ready(version, std::move(blob));
    return 0;
  }
  return waiters_.add(name, Waiter{0, min_version, std::move(ready)});
}

bool P2PStore::cancel(const std::string &name, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.cancel(name, token);
}

size_t P2PStore::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

size_t P2PStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blobs_.size();
}

}  // namespace kungfu
