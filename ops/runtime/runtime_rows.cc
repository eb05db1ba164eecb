// The row store: publishing versions of a table and bringing a peer's copy
// up to date with the rows changed since the version it holds.
#include "runtime.h"

#include "peer_op.h"

namespace kungfu {

Status Runtime::save_rows(const std::string &name, uint64_t version, const void *table, const RowsDesc &desc,
                          const int64_t *rows, size_t n) {
  return rows_.update(name, version, static_cast<const char *>(table), desc.num_rows, desc.row_bytes(), rows, n);
}

void Runtime::request_rows(int peer, const std::string &name, uint64_t min_version, RowsDoneCallback done) {
  GenPtr g = gen();
  std::string what = "request for rows of '" + name + "' version >= " + std::to_string(min_version) + " from " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) return done(InvalidArgument(what + ": no such rank"), RowsReply{});
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()), RowsReply{});
  auto key = std::make_pair(peer, name);
  uint64_t held;
  {
    std::lock_guard<std::mutex> lock(g->rows_held_mu);
    held = g->rows_held[key];
  }
  // Both paths deliver the reply through this cell: PeerOp only carries a Status.
  auto got = std::make_shared<RowsReply>();
  Generation *held_in = g.get();  // retired generations live on with the runtime
  auto finish = [held_in, key, got, done](const Status &s) {
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(held_in->rows_held_mu);
      held_in->rows_held[key] = got->version;
    }
    done(s, *got);
  };
  std::string id = "rows#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), finish);
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  auto registry = &g->registry;
  if (peer == g->self_rank) {
    uint64_t token = rows_.when_updated(name, peer, held, min_version, [op, registry, id, got](RowsReply r) {
      registry->remove(id);
      op->complete_with([&] {
        *got = std::move(r);
        return Status::OK();
      });
    });
    if (token != 0) op->on_failure([this, name, token] { rows_.cancel(name, token); });
    return;
  }
  g->mailbox.expect(peer, id, nullptr, 0, [op, id, registry, what, got, min_version](const Status &st, Message &msg) {
    registry->remove(id);
    if (!st.ok()) return op->complete(Status(st.code(), what + ": " + st.message()));
    if (msg.header.flags & kFlagTimedOut) {
      return op->complete(DeadlineExceeded(what + ": no version >= " + std::to_string(min_version) +
                                           " was saved there within the timeout (KUNGFU_TIMEOUT)"));
    }
    if (!(msg.header.flags & kFlagRows)) return op->complete(Internal(what + ": the answer is not a rows reply"));
    op->complete_with([&] {
      got->version = msg.header.seq;
      got->all_rows = (msg.header.flags & kFlagAllRows) != 0;
      got->num_rows = static_cast<size_t>(msg.header.dims[0]);
      got->row_bytes = static_cast<size_t>(msg.header.dims[1]);
      got->payload = make_blob(std::vector<char>(msg.data(), msg.data() + msg.size()));
      return Status::OK();
    });
  });
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PRequest);
  h.flags = kFlagAtLeast | kFlagRows;
  h.seq = min_version;
  h.dims[0] = static_cast<int64_t>(held);
  send_request(*g->transport, registry, peer, h, name, id, op);
}

void Runtime::serve_rows(Generation &g, int src, const FrameHeader &header, const std::string &name,
                         const std::string &id) {
  std::string what = "request for rows of '" + name + "' version >= " + std::to_string(header.seq) + " parked for " +
                     g.cluster.describe(src);
  uint64_t min_version = header.seq;
  auto held = static_cast<uint64_t>(header.dims[0]);
  Generation *in = &g;
  park(
      g, src, id, what,
      [this, in, src, id, name, min_version, held](std::function<void(Respond)> ready) {
        return rows_.when_updated(name, src, held, min_version, [this, in, src, id, ready](RowsReply r) {
          ready([this, in, src, id, r] {
            respond(*in, src, id, static_cast<uint8_t>(kFlagRows | (r.all_rows ? kFlagAllRows : 0)), r.version,
                    r.payload, {static_cast<int64_t>(r.num_rows), static_cast<int64_t>(r.row_bytes)});
          });
        });
      },
      [this, name](uint64_t token) { rows_.cancel(name, token); });
}

}  // namespace kungfu
