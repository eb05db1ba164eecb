// The owner's side of a parameter server whose table its peers fetch row by
// row (stale-synchronous and asynchronous PS with sparse gradients). It keeps
// the newest table and, for each peer, the rows changed since the version
// that peer last received, so a fetch sends only those rows, however many
// versions behind the peer is. A peer whose held version is not the one we
// last sent it (its first fetch, a restarted worker, a lost answer) gets the
// whole table instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "p2p_store.h"
#include "status.h"
#include "waiter_lists.h"

namespace kungfu {

// What a fetch receives: the table's version and size, and either every row
// (the whole table, all_rows) or `n` int64 row indices followed by those rows.
struct RowsReply {
  uint64_t version = 0;
  size_t num_rows = 0;
  size_t row_bytes = 0;
  bool all_rows = false;
  Blob payload;
};
using RowsCallback = std::function<void(RowsReply reply)>;

class RowStore {
 public:
  // Table `name` (num_rows rows of row_bytes bytes) is now `table` at
  // `version`, which changed from the previous version in `rows` only. The
  // first update of a name copies the whole table; later ones copy `rows`.
  // InvalidArgument if the table's size changed or a row is out of range.
  Status update(const std::string &name, uint64_t version, const char *table, size_t num_rows, size_t row_bytes,
                const int64_t *rows, size_t n);

  // Calls `ready` once table `name` has a version >= min_version (at once, on
  // this thread, if it has; returns 0 then), with what `peer`, which holds
  // version `held` (0: nothing), needs to reach the newest version. Else
  // returns a token for cancel(); the update() that brings the version calls it.
  uint64_t when_updated(const std::string &name, int peer, uint64_t held, uint64_t min_version, RowsCallback ready);
  // Forgets a waiting callback. False if it ran already (or is running).
  bool cancel(const std::string &name, uint64_t token);
  // Callbacks still waiting (for tests and leak checks).
  size_t waiting() const;
  // Drops every table whose name starts with `prefix` (a replaced strategy
  // plan's). Callbacks waiting for them stay waiting, as a request for a
  // name never updated does.
  void erase_prefix(const std::string &prefix);
  // How many tables exist (for tests and leak checks).
  size_t size() const;

 private:
  struct PeerView {
    uint64_t sent = 0;             // the version we last sent this peer
    std::vector<uint8_t> changed;  // per row: changed since `sent`
    std::vector<int64_t> changed_rows;
  };
  struct Table {
    uint64_t version = 0;
    size_t num_rows = 0;
    size_t row_bytes = 0;
    std::vector<char> data;
    std::unordered_map<int, PeerView> peers;
  };
  struct Waiter {
    uint64_t token = 0;
    int peer;
    uint64_t held;
    uint64_t min_version;
    RowsCallback ready;
  };
  // What `peer` (holding `held`) needs from `table`; records it as sent. Caller holds mu_.
  static RowsReply reply_for(Table &table, int peer, uint64_t held);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Table> tables_;
  WaiterLists<Waiter> waiters_;
};

}  // namespace kungfu
