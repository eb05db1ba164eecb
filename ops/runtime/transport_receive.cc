// Serving one accepted connection: the server side of the handshake, then
// every frame the peer sends, to the handler, until it leaves or breaks.
#include "transport.h"

#include <cstdio>

#include "shm_handover.h"
#include "socket_order.h"
#include "verified_payload.h"

namespace kungfu {

void Transport::serve_connection(Fd fd, Connection *conn) {
  // Runs last, whatever the way out: closes the socket (under the lock, so
  // the destructor never shuts down a number the kernel already reused) and
  // lets the acceptor join this thread.
  struct CloseWhenDone {
    Transport *t;
    Fd &fd;
    Connection *c;
    ~CloseWhenDone() {
      std::lock_guard<std::mutex> lock(t->conn_mu_);
      fd.reset();
      c->fd = -1;
      c->done = true;
    }
  } close_when_done{this, fd, conn};
  std::string client_id, err;
  SessionKey session_key;
  const HandshakeIdentity self = identity(connects_two_hosts(fd.get()));
  VersionSkew skew = VersionSkew::kNone;
  bool proven = server_handshake(fd.get(), opt_.secret, self, &client_id, &session_key, &err, kHandshakeTimeoutSeconds,
                                 &skew);
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    --handshaking_;
    conn->proving = false;
  }
  // A peer of this job at another cluster version is switching a few
  // milliseconds apart from us (it retries, or learns it moved on): not a
  // stranger, so neither counted nor logged.
  if (!proven && skew != VersionSkew::kNone) return;
  if (!proven) {
    ++rejected_;
    // A connection that hangs up before sending a byte (a port scan, a
    // health check, the commonest flood) is counted, not logged.
    bool said_nothing = err.find("closed by peer while reading client magic") != std::string::npos;
    if (!stopping_ && !said_nothing) rejections_log_.print("rejected a connection: " + err);
    return;
  }
  int src = opt_.cluster.rank_of(client_id);
  if (src < 0 || src == opt_.self_rank) {
    ++rejected_;
    rejections_log_.print("rejected a connection from '" + client_id + "': not a peer of this cluster");
    return;
  }

  std::unique_ptr<FrameAuthenticator> auth;
  if (self.authenticate_frames) {
    auth = std::make_unique<FrameAuthenticator>(session_key, FrameDirection::kClientToServer);
    note_authenticated_connection();
  }
  std::unique_ptr<VerifiedPayload> verified;
  void *order = socket_order_key(client_id, opt_.cluster.peer(opt_.self_rank).str());
  std::vector<char> scratch;
  std::string why;
  bool said_goodbye = false;
  auto lost = [&] { return Unavailable("lost connection from " + opt_.cluster.describe(src) + ": " + why); };
  if (auth) {
    verified = std::make_unique<VerifiedPayload>(fd.get(), *auth, why, [&] {
      if (!stopping_ && !leaving_) handler_->on_peer_lost(src, lost());
    });
  }
  // Set by the connection's first frame when the dialer moves its frames
  // into shared memory; the socket then only tells us when the peer ends.
  // Shared with threads that poll the ring (transport_poll.cc): we read a
  // frame only while we hold its turn.
  std::shared_ptr<RingReader> ring;
  std::unique_lock<std::mutex> turn;
  struct ForgetRingWhenDone {
    Transport *t;
    std::shared_ptr<RingReader> &ring;
    std::unique_lock<std::mutex> &turn;
    ~ForgetRingWhenDone() {
      if (!ring) return;
      if (!turn.owns_lock()) turn = std::unique_lock<std::mutex>(ring->mu);
      ring->closed = true;  // before the socket closes: no poller uses it after this
      turn.unlock();
      t->remove_ring_reader(ring.get());
    }
  } forget_ring_when_done{this, ring, turn};
  auto recv_bytes = [&](void *dst, size_t len) {
    return ring ? ring->ring->read_exact(dst, len, fd.get(), stopping_, &why) : recv_all(fd.get(), dst, len, &why);
  };
  bool first_frame = true;
  while (true) {
    FrameHeader h;
    if (ring) {
      // Between frames the turn is free, so a poller may take the next one.
      if (turn.owns_lock()) turn.unlock();
      bool readable = ring->ring->wait_readable(fd.get(), stopping_, &why);
      turn = std::unique_lock<std::mutex>(ring->mu);
      if (!ring->broken.empty()) {
        why = ring->broken;
        break;
      }
      if (!readable) break;
      Status corrupt;
      if (ring->ring->readable(&corrupt) == 0 && corrupt.ok()) continue;  // a poller took it
    }
    if (first_frame && !auth) {
      // Only a same-host dialer's first frame may bring descriptors.
      ShmRing::Descriptors fds;
      if (!recv_first_header(fd.get(), &h, &fds, &why)) break;
      if (h.type == static_cast<uint8_t>(FrameType::kShmRing)) {
        std::unique_ptr<ShmRing> accepted;
        Status s = accept_shm_ring(h, std::move(fds), &accepted);
        if (!s.ok()) {
          why = s.message();
          break;
        }
        ring = std::make_shared<RingReader>(src, fd.get(), order, std::move(accepted));
        add_ring_reader(ring);
        ++shm_;
        first_frame = false;
        continue;
      }
      if (fds.memory.valid()) {
        why = "descriptors came with a frame of type " + std::to_string(h.type);
        break;
      }
    } else if (!recv_bytes(&h, sizeof(h))) {
      break;
    }
    first_frame = false;
    socket_order_after_header(order);
    Status header_ok = check_frame_header(h);
    if (!header_ok.ok()) {
      why = header_ok.message();
      break;
    }
    if (h.type == static_cast<uint8_t>(FrameType::kShmRing)) {
      why = "a shared-memory ring frame that is not the connection's first";
      break;
    }
    std::string key(h.key_len, '\0');
    if (!recv_bytes(key.data(), key.size())) break;
    const uint64_t tags = auth ? FrameAuthenticator::segments(h.payload_len) : 0;
    counters_.add_received(src, sizeof(h) + h.key_len + h.payload_len + tags * FrameAuthenticator::kTagLen);
    // Nothing may act on a header, key or payload byte before its tag matched.
    if (verified && !verified->begin(h, key)) break;

    uint64_t consumed = 0;
    bool read_ok = true;
    PartialReader read = [&](void *dst, size_t len) {
      if (consumed + len > h.payload_len) {
        why = "handler read past the end of a frame";
        read_ok = false;
        return false;
      }
      read_ok = verified ? verified->read(dst, len) : recv_bytes(dst, len);
      consumed += len;
      return read_ok;
    };
    if (h.type == static_cast<uint8_t>(FrameType::kGoodbye)) {
      // Everything the peer sent is in; what follows is the end of its stream.
      said_goodbye = true;
      Status left = h.seq == 0 ? Unavailable(opt_.cluster.describe(src) + " left the cluster")
                               : Unavailable(opt_.cluster.describe(src) + " left cluster version " +
                                             std::to_string(opt_.cluster.version()) + ": cluster changed to version " +
                                             std::to_string(h.seq));
      peer_departed(src, left);
      handler_->on_peer_left(src, left);
    } else if (h.cluster_version != opt_.cluster.version()) {
      fprintf(stderr, "kungfu: dropped '%s' from %s: cluster version %u, ours is %u\n", key.c_str(),
              opt_.cluster.describe(src).c_str(), h.cluster_version, opt_.cluster.version());
    } else if (!handler_->on_frame(src, h, std::move(key), read)) {
      break;
    }
    // Skip whatever of the payload nobody wanted.
    if (verified) {
      read_ok = read_ok && verified->finish();
      consumed = h.payload_len;
    }
    while (read_ok && consumed < h.payload_len) {
      scratch.resize(std::min<uint64_t>(h.payload_len - consumed, 1 << 20));
      size_t n = scratch.size();
      read_ok = recv_bytes(scratch.data(), n);
      consumed += n;
    }
    if (!read_ok) break;
  }
  if (ring) {
    // No poller hands on a frame of a connection that ended here.
    if (!turn.owns_lock()) turn = std::unique_lock<std::mutex>(ring->mu);
    ring->closed = true;
    turn.unlock();
  }
  // After a goodbye the end of the stream is expected; while we leave, so is
  // a peer closing on us. Anything else is a crash.
  if (!stopping_ && !leaving_ && !said_goodbye) handler_->on_peer_lost(src, lost());
}

}  // namespace kungfu
