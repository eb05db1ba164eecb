// The point-to-point model store: saving named versioned blobs, fetching
// them from a peer, and serving (or parking) peers' requests.
#include "runtime.h"

#include <algorithm>
#include <cstring>

#include "peer_op.h"

namespace kungfu {

void Runtime::save(const std::string &name, uint64_t version, const void *data, size_t len) {
  store_.save(name, version,
              make_blob(std::vector<char>(static_cast<const char *>(data), static_cast<const char *>(data) + len)));
}

void Runtime::save(const std::string &name, uint64_t version, Blob blob) {
  store_.save(name, version, std::move(blob));
}

void Runtime::forget(const std::string &prefix) {
  store_.erase_prefix(prefix);
  accumulators_.erase_prefix(prefix);
  rows_.erase_prefix(prefix);
}

size_t Runtime::stored_names() const { return store_.size() + accumulators_.size() + rows_.size(); }

void Runtime::request(int peer, const std::string &name, uint64_t version, void *dst, size_t len,
                      std::shared_ptr<const void> keepalive, DoneCallback done) {
  fetch(peer, name, version, false, dst, len, std::move(keepalive), [done](const Status &s, uint64_t) { done(s); });
}

void Runtime::request_at_least(int peer, const std::string &name, uint64_t min_version, void *dst, size_t len,
                               std::shared_ptr<const void> keepalive, VersionCallback done) {
  fetch(peer, name, min_version, true, dst, len, std::move(keepalive), std::move(done));
}

void Runtime::fetch(int peer, const std::string &name, uint64_t version, bool at_least, void *dst, size_t len,
                    std::shared_ptr<const void> keepalive, VersionCallback done) {
  GenPtr g = gen();
  std::string what = "request '" + name + "'" + (at_least ? " version >= " + std::to_string(version) : "") + " from " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) return done(InvalidArgument(what + ": no such rank"), 0);
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()), 0);
  auto check_size = [what, len](size_t got) {
    return got == len ? Status::OK()
                      : InvalidArgument(what + ": the saved blob has " + std::to_string(got) +
                                        " bytes but the request expects " + std::to_string(len));
  };
  // Both paths deliver the version through this cell: PeerOp only carries a Status.
  auto found = std::make_shared<uint64_t>(0);
  auto finish = [done, found](const Status &s) { done(s, *found); };
  if (peer == g->self_rank && !at_least) {
    Blob blob = store_.get(name, version, found.get());
    if (!blob) return finish(NotFound(what + ": nothing saved under that name and version"));
    Status s = check_size(blob->size());
    if (s.ok() && len > 0) std::memcpy(dst, blob->data(), len);
    return finish(s);
  }
  std::string id = "p2p#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), finish);
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  auto registry = &g->registry;
  if (peer == g->self_rank) {
    // Waiting for our own save: the registry's deadline bounds the wait.
    // `keepalive` owns dst until the callback is gone (run or cancelled).
    uint64_t token = store_.when_saved(name, version,
                                       [op, registry, id, found, check_size, dst, len, keepalive](uint64_t v,
                                                                                                  Blob blob) {
                                         registry->remove(id);
                                         op->complete_with([&] {
                                           *found = v;
                                           Status ok = check_size(blob->size());
                                           if (ok.ok() && len > 0) std::memcpy(dst, blob->data(), len);
                                           return ok;
                                         });
                                       });
    if (token != 0) op->on_failure([this, name, token] { store_.cancel(name, token); });
    return;
  }
  // A response may land in dst even after a timeout: `keepalive` owns it until then.
  g->mailbox.expect(peer, id, dst, len,
                    [op, id, registry, check_size, what, dst, found, version, keepalive](const Status &st,
                                                                                         Message &msg) {
                      registry->remove(id);
                      if (!st.ok()) return op->complete(Status(st.code(), what + ": " + st.message()));
                      if (msg.header.flags & kFlagNotFound) {
                        return op->complete(NotFound(what + ": nothing saved under that name and version"));
                      }
                      if (msg.header.flags & kFlagTimedOut) {
                        return op->complete(DeadlineExceeded(what + ": no version >= " + std::to_string(version) +
                                                             " was saved there within the timeout (KUNGFU_TIMEOUT)"));
                      }
                      Status size_ok = check_size(msg.size());
                      // A response that did not land in place (it beat our expect()) is copied.
                      if (size_ok.ok() && msg.direct == nullptr && msg.size() > 0)
                        std::memcpy(dst, msg.data(), msg.size());
                      *found = msg.header.seq;
                      op->complete(size_ok);
                    });
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PRequest);
  h.flags = at_least ? kFlagAtLeast : 0;
  h.seq = version;
  send_request(*g->transport, registry, peer, h, name, id, op);
}

void Runtime::respond(Generation &g, int src, const std::string &id, uint8_t flags, uint64_t version, Blob blob,
                      const std::vector<int64_t> &dims) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PResponse);
  h.flags = flags;
  h.seq = version;
  h.ndims = static_cast<uint32_t>(std::min<size_t>(dims.size(), kMaxDims));
  for (uint32_t i = 0; i < h.ndims; ++i) h.dims[i] = dims[i];
  const void *data = blob ? blob->data() : nullptr;
  size_t len = blob ? blob->size() : 0;
  g.transport->send(src, h, id, data, len, std::move(blob), [](const Status &) {});
}

void Runtime::serve_request(Generation &g, int src, const FrameHeader &header, const std::string &name,
                            const PartialReader &read) {
  if (header.payload_len > kMaxKeyLen) return;  // not a request id we could have sent
  std::string id(header.payload_len, '\0');
  if (!read(id.data(), id.size())) return;
  if (header.flags & kFlagRows) return serve_rows(g, src, header, name, id);
  if (!(header.flags & kFlagAtLeast)) {
    uint64_t version = 0;
    Blob blob = store_.get(name, header.seq, &version);
    if (!blob) return respond(g, src, id, kFlagNotFound, 0, nullptr);
    return respond(g, src, id, 0, version, std::move(blob));
  }
  // At least a version: answer now if we hold one, else park the request
  // until a save() brings one. The answer goes out in the version the
  // request came in (generations live as long as the runtime).
  std::string what = "request '" + name + "' version >= " + std::to_string(header.seq) + " parked for " +
                     g.cluster.describe(src);
  uint64_t min_version = header.seq;
  Generation *in = &g;
  park(
      g, src, id, what,
      [this, in, src, id, name, min_version](std::function<void(Respond)> ready) {
        return store_.when_saved(name, min_version, [this, in, src, id, ready](uint64_t version, Blob blob) {
          ready([this, in, src, id, version, blob] { respond(*in, src, id, 0, version, blob); });
        });
      },
      [this, name](uint64_t token) { store_.cancel(name, token); });
}

void Runtime::park(Generation &g, int src, const std::string &id, const std::string &what,
                   const std::function<uint64_t(std::function<void(Respond)>)> &wait,
                   std::function<void(uint64_t)> cancel) {
  // Registered like any op, so that our timeout answers it with
  // kFlagTimedOut (the requester's expectation is always consumed) and a
  // requester that dies is forgotten.
  std::string parked = "parked#" + std::to_string(src) + "#" + id;
  Generation *in = &g;
  auto timed_out = [this, in, src, id] { respond(*in, src, id, kFlagTimedOut, 0, nullptr); };
  auto op = std::make_shared<PeerOp>(src, what, g.cluster.describe(src), [timed_out](const Status &s) {
    if (s.code() == Code::kDeadlineExceeded) timed_out();
  });
  Status s = g.registry.add(parked, op);
  if (!s.ok()) return timed_out();  // closed (interrupted, retired): the requester hears at once
  auto registry = &g.registry;
  uint64_t token = wait([op, registry, parked](Respond send) {
    registry->remove(parked);
    op->complete_with([&] {
      send();
      return Status::OK();
    });
  });
  if (token != 0) op->on_failure([cancel, token] { cancel(token); });
}

}  // namespace kungfu
