#include "op_registry.h"

#include <vector>

namespace kungfu {

OpRegistry::OpRegistry(double timeout_seconds) : timeout_seconds_(timeout_seconds) {
  watchdog_ = std::thread([this] { watch(); });
}

OpRegistry::~OpRegistry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

Status OpRegistry::add(const std::string &name, std::weak_ptr<PendingOp> op) {
  std::lock_guard<std::mutex> lock(mu_);
  auto aborted = early_aborts_.find(name);
  if (aborted != early_aborts_.end()) {
    Status why = aborted->second;
    early_aborts_.erase(aborted);
    return why;
  }
  auto it = ops_.find(name);
  if (it != ops_.end() && !it->second.op.expired()) {
    return InvalidArgument("two collective operations named '" + name +
                           "' are in flight at once on this worker; give them distinct names");
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_seconds_));
  ops_[name] = Entry{std::move(op), deadline};
  return Status::OK();
}

void OpRegistry::remove(const std::string &name) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.erase(name);
}

void OpRegistry::remove_failed(const std::string &name) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.erase(name);
  recently_failed_[name] = std::chrono::steady_clock::now();
}

void OpRegistry::abort(const std::string &name, const Status &why) {
  std::shared_ptr<PendingOp> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ops_.find(name);
    if (it != ops_.end()) op = it->second.op.lock();
    if (!op && recently_failed_.count(name) == 0) early_aborts_[name] = why;
  }
  if (op) op->fail(why, false);
}

void OpRegistry::peer_lost(int rank, const Status &why) {
  std::vector<std::shared_ptr<PendingOp>> doomed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &kv : ops_) {
      auto op = kv.second.op.lock();
      if (op && op->needs(rank)) doomed.push_back(std::move(op));
    }
  }
  for (auto &op : doomed) op->fail(Status(why.code(), op->describe() + ": " + why.message()), true);
}

void OpRegistry::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    auto now = std::chrono::steady_clock::now();
    for (auto it = recently_failed_.begin(); it != recently_failed_.end();) {
      if (now - it->second > std::chrono::duration<double>(timeout_seconds_)) {
        it = recently_failed_.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<std::pair<std::string, std::shared_ptr<PendingOp>>> expired;
    for (auto it = ops_.begin(); it != ops_.end();) {
      auto op = it->second.op.lock();
      if (!op) {
        it = ops_.erase(it);
        continue;
      }
      if (now > it->second.deadline) expired.emplace_back(it->first, std::move(op));
      ++it;
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto &e : expired) {
      e.second->fail(DeadlineExceeded(e.second->describe() + " timed out after " +
                                      std::to_string(static_cast<int>(timeout_seconds_)) + "s (KUNGFU_TIMEOUT) " +
                                      e.second->waiting_for()),
                     true);
    }
    lock.lock();
  }
}

}  // namespace kungfu
