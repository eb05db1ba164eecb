#include "op_registry.h"

#include <vector>

namespace kungfu {

OpRegistry::OpRegistry(double timeout_seconds) : timeout_seconds_(timeout_seconds) {
  watchdog_ = std::thread([this] { watch(); });
}

OpRegistry::~OpRegistry() { stop_watchdog(); }

void OpRegistry::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

Status OpRegistry::check_addable(const std::string &name) const {
  if (!closed_.ok()) return closed_;
  auto it = ops_.find(name);
  if (it != ops_.end() && !it->second.op.expired()) {
    return InvalidArgument("two collective operations named '" + name +
                           "' are in flight at once on this worker; give them distinct names");
  }
  return Status::OK();
}

std::chrono::steady_clock::time_point OpRegistry::deadline() const {
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(timeout_seconds_));
}

Status OpRegistry::add(const std::string &name, std::weak_ptr<PendingOp> op) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = check_addable(name);
  if (!s.ok()) return s;
  ops_[name] = Entry{std::move(op), deadline(), 0};
  return Status::OK();
}

Status OpRegistry::add_collective(const std::string &name, std::weak_ptr<PendingOp> op, uint64_t *instance) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = check_addable(name);
  if (!s.ok()) return s;
  uint64_t inst = ++instances_[name];
  *instance = inst;
  auto aborted = early_aborts_.find(name);
  if (aborted != early_aborts_.end()) {
    std::map<uint64_t, Status> &pending = aborted->second;
    pending.erase(pending.begin(), pending.lower_bound(inst));  // instances that ended without us
    auto mine = pending.find(inst);
    Status why = mine != pending.end() ? mine->second : Status::OK();
    if (mine != pending.end()) pending.erase(mine);
    if (pending.empty()) early_aborts_.erase(aborted);
    if (!why.ok()) return why;
  }
  ops_[name] = Entry{std::move(op), deadline(), inst};
  return Status::OK();
}

void OpRegistry::remove(const std::string &name, uint64_t instance) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(name);
  if (it != ops_.end() && it->second.instance == instance) ops_.erase(it);
}

void OpRegistry::abort(const std::string &name, uint64_t instance, const Status &why) {
  std::shared_ptr<PendingOp> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ops_.find(name);
    if (it != ops_.end() && it->second.instance == instance) op = it->second.op.lock();
    if (!op) {
      auto started = instances_.find(name);
      uint64_t last = started == instances_.end() ? 0 : started->second;
      if (instance > last) early_aborts_[name][instance] = why;
    }
  }
  if (op) op->fail(why, false);
}

void OpRegistry::fail_where(const std::function<bool(const PendingOp &)> &doomed_if, const Status &why,
                            bool tell_peers) {
  std::vector<std::shared_ptr<PendingOp>> doomed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &kv : ops_) {
      auto op = kv.second.op.lock();
      if (op && doomed_if(*op)) doomed.push_back(std::move(op));
    }
  }
  for (auto &op : doomed) op->fail(Status(why.code(), op->describe() + ": " + why.message()), tell_peers);
}

void OpRegistry::peer_lost(int rank, const Status &why) {
  fail_where([rank](const PendingOp &op) { return op.needs(rank); }, why, true);
}

void OpRegistry::peer_left(int rank, const Status &why) {
  fail_where([rank](const PendingOp &op) { return op.only_with(rank); }, why, false);
}

void OpRegistry::close(const Status &why, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = why;
  }
  fail_where([](const PendingOp &) { return true; }, why, tell_peers);
}

Status OpRegistry::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void OpRegistry::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    auto now = std::chrono::steady_clock::now();
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
