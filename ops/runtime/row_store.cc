#include "row_store.h"

#include <algorithm>
#include <cstring>

#include "prefix_erase.h"

namespace kungfu {

Status RowStore::update(const std::string &name, uint64_t version, const char *data, size_t num_rows, size_t row_bytes,
                        const int64_t *rows, size_t n) {
  std::vector<std::pair<Waiter, RowsReply>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      Table &t = tables_[name];
      t.num_rows = num_rows;
      t.row_bytes = row_bytes;
      t.data.assign(data, data + num_rows * row_bytes);
      t.version = version;
      it = tables_.find(name);
    } else {
      Table &t = it->second;
      if (t.num_rows != num_rows || t.row_bytes != row_bytes) {
        return InvalidArgument("update of table '" + name + "': it has " + std::to_string(num_rows) + " rows of " +
                               std::to_string(row_bytes) + " bytes, but the table saved before has " +
                               std::to_string(t.num_rows) + " rows of " + std::to_string(t.row_bytes) + " bytes");
      }
      for (size_t i = 0; i < n; ++i) {
        if (rows[i] < 0 || static_cast<size_t>(rows[i]) >= num_rows) {
          return InvalidArgument("update of table '" + name + "': row " + std::to_string(rows[i]) + " is outside its " +
                                 std::to_string(num_rows) + " rows");
        }
      }
      for (size_t i = 0; i < n; ++i) {
        auto r = static_cast<size_t>(rows[i]);
        std::memcpy(t.data.data() + r * row_bytes, data + r * row_bytes, row_bytes);
        for (auto &kv : t.peers) {
          PeerView &p = kv.second;
          if (!p.changed[r]) {
            p.changed[r] = 1;
            p.changed_rows.push_back(rows[i]);
          }
        }
      }
      t.version = version;
    }
    for (Waiter &w : waiters_.take_if(name, [version](const Waiter &w) { return w.min_version <= version; })) {
      RowsReply reply = reply_for(it->second, w.peer, w.held);
      ready.emplace_back(std::move(w), std::move(reply));
    }
  }
  // Outside the lock: a callback sends to the network.
  for (auto &r : ready) r.first.ready(std::move(r.second));
  return Status::OK();
}

RowsReply RowStore::reply_for(Table &t, int peer, uint64_t held) {
  RowsReply reply;
  reply.version = t.version;
  reply.num_rows = t.num_rows;
  reply.row_bytes = t.row_bytes;
  auto it = t.peers.find(peer);
  if (it == t.peers.end() || held == 0 || held != it->second.sent) {
    // The peer's copy is not one we know: it gets everything.
    PeerView &p = t.peers[peer];
    p.changed.assign(t.num_rows, 0);
    p.changed_rows.clear();
    p.sent = t.version;
    reply.all_rows = true;
    reply.payload = make_blob(t.data);
    return reply;
  }
  PeerView &p = it->second;
  std::sort(p.changed_rows.begin(), p.changed_rows.end());
  size_t n = p.changed_rows.size();
  std::vector<char> payload(n * (sizeof(int64_t) + t.row_bytes));
  if (n > 0) std::memcpy(payload.data(), p.changed_rows.data(), n * sizeof(int64_t));
  char *values = payload.data() + n * sizeof(int64_t);
  for (size_t i = 0; i < n; ++i) {
    auto r = static_cast<size_t>(p.changed_rows[i]);
    std::memcpy(values + i * t.row_bytes, t.data.data() + r * t.row_bytes, t.row_bytes);
    p.changed[r] = 0;
  }
  p.changed_rows.clear();
  p.sent = t.version;
  reply.payload = make_blob(std::move(payload));
  return reply;
}

uint64_t RowStore::when_updated(const std::string &name, int peer, uint64_t held, uint64_t min_version,
                                RowsCallback ready) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = tables_.find(name);
  if (it != tables_.end() && it->second.version >= min_version) {
    RowsReply reply = reply_for(it->second, peer, held);
    lock.unlock();
    ready(std::move(reply));
    return 0;
  }
  return waiters_.add(name, Waiter{0, peer, held, min_version, std::move(ready)});
}

bool RowStore::cancel(const std::string &name, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.cancel(name, token);
}

void RowStore::erase_prefix(const std::string &prefix) {
  std::vector<Table> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  dropped = take_by_prefix(tables_, prefix);
}

size_t RowStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tables_.size();
}

size_t RowStore::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

}  // namespace kungfu
