#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstring>
#include <cstdio>

#include "handshake.h"
#include "socket_order.h"

namespace kungfu {

namespace {

// Frames up to this size are written inline by the caller when the link is idle:
// they fit in the socket buffer, so the write cannot block for long, and we save
// a thread hand-off on the latency-critical path.
constexpr size_t kInlineSendLimit = 64 * 1024;

// Linux abstract Unix socket names are scoped by network namespace and vanish
// with the process, so there are no stale files to clean up.
socklen_t unix_address(uint16_t port, struct sockaddr_un *addr) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  std::string name = "kungfu-tf-" + std::to_string(port);
  memcpy(addr->sun_path + 1, name.data(), name.size());  // sun_path[0] = '\0': abstract
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

void tune_socket(int fd, bool is_unix) {
  int one = 1;
  if (!is_unix) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

std::string errno_text(const char *what) { return std::string(what) + ": " + strerror(errno); }

// connect() that gives up at `deadline`: a blocking connect to a host that
// does not answer can take minutes, far past KUNGFU_TIMEOUT.
bool connect_until(int fd, const struct sockaddr *addr, socklen_t len, std::chrono::steady_clock::time_point deadline,
                   std::string *err, int *error_number) {
  *error_number = 0;
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, addr, len);
  if (rc != 0 && errno == EINPROGRESS) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    struct pollfd p = {fd, POLLOUT, 0};
    int n;
    do {
      n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
      *err = "connect timed out";
      return false;
    }
    int soerr = 0;
    socklen_t soerr_len = sizeof(soerr);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &soerr_len);
    if (n < 0 || soerr != 0) {
      *error_number = n < 0 ? errno : soerr;
      *err = strerror(*error_number);
      return false;
    }
  } else if (rc != 0) {
    *error_number = errno;
    *err = strerror(errno);
    return false;
  }
  ::fcntl(fd, F_SETFL, flags);  // blocking again: the handshake and sends set their own timeouts
  return true;
}

// Reads the payload of one authenticated frame segment by segment
// (frame_auth.h) and hands out only verified bytes. Segment 0, which also
// covers the header and key, is verified before the frame is handed to
// anyone; a later read that covers whole segments lands straight in the
// caller's buffer and returns once their tags matched, and a segment read in
// parts is verified in `segment_` first. So a large frame streams (its first
// segments are used while the rest is still arriving) and nothing acts on
// bytes before their tag matched; a frame whose later segment fails has
// been partly used (only genuine bytes) and breaks the connection.
class VerifiedPayload {
 public:
  // `forged` runs when a tag does not match, before the read fails: a
  // reader fails its op with a generic "connection lost", and the op should
  // rather fail with the reason (`why`).
  VerifiedPayload(int fd, FrameAuthenticator &auth, std::string &why, std::function<void()> forged)
      : fd_(fd), auth_(auth), why_(why), forged_(std::move(forged)) {
    segment_.resize(FrameAuthenticator::kSegmentLen);
  }

  // Starts the frame: reads and verifies its first segment.
  bool begin(const FrameHeader &h, const std::string &key) {
    header_ = &h;
    key_ = &key;
    next_ = 0;
    held_ = held_len_ = 0;
    const size_t n = next_segment_len();
    if (!load(segment_.data(), n, true)) return false;
    held_len_ = n;
    return true;
  }

  bool read(void *dst, size_t len) {
    char *out = static_cast<char *>(dst);
    while (len > 0) {
      if (held_ < held_len_) {
        const size_t n = std::min(len, held_len_ - held_);
        std::memcpy(out, segment_.data() + held_, n);
        held_ += n;
        out += n;
        len -= n;
        continue;
      }
      const size_t n = next_segment_len();
      if (n == 0) {
        why_ = "handler read past the end of a frame";
        return false;
      }
      if (len >= n) {  // a whole segment: straight into the caller's buffer
        if (!load(out, n, false)) return false;
        out += n;
        len -= n;
      } else {
        if (!load(segment_.data(), n, false)) return false;
        held_ = 0;
        held_len_ = n;
      }
    }
    return true;
  }

  // Reads (and verifies) whatever of the frame nobody wanted.
  bool finish() {
    held_ = held_len_ = 0;
    for (size_t n; (n = next_segment_len()) > 0;) {
      if (!load(segment_.data(), n, false)) return false;
    }
    return true;
  }

 private:
  size_t next_segment_len() const {
    return static_cast<size_t>(std::min<uint64_t>(FrameAuthenticator::kSegmentLen, header_->payload_len - next_));
  }

  // The next segment (n bytes) into dst, then its tag; `first`: segment 0,
  // whose tag covers the header and key too.
  bool load(char *dst, size_t n, bool first) {
    FrameAuthenticator::Tag tag;
    if (!recv_all(fd_, dst, n, &why_) || !recv_all(fd_, tag.data(), tag.size(), &why_)) return false;
    if (first) {
      auth_.begin_frame(header_, sizeof(*header_), key_->data(), key_->size());
    } else {
      auth_.begin_segment();
    }
    auth_.add_payload(dst, n);
    next_ += n;
    if (!auth_.verify_frame(tag.data())) {
      why_ = "frame authentication failed (the frame was tampered with, replayed, reordered or injected)";
      forged_();
      return false;
    }
    return true;
  }

  const int fd_;
  FrameAuthenticator &auth_;
  std::string &why_;
  const std::function<void()> forged_;
  std::vector<char> segment_;
  const FrameHeader *header_ = nullptr;
  const std::string *key_ = nullptr;
  uint64_t next_ = 0;              // payload offset of the next segment on the wire
  size_t held_ = 0, held_len_ = 0;  // unread part of segment_
};

}  // namespace

Transport::Transport(TransportOptions options, FrameHandler *handler)
    : opt_(std::move(options)), handler_(handler), counters_(opt_.cluster.size()) {
  const std::string self = opt_.cluster.peer(opt_.self_rank).str();
  for (int i = 0; i < opt_.cluster.size(); ++i) {
    links_.push_back(std::make_unique<Link>());
    links_.back()->order = socket_order_key(self, opt_.cluster.peer(i).str());
  }
}

Status Transport::bind_listeners() {
  const PeerID &self = opt_.cluster.peer(opt_.self_rank);
  int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (tcp < 0) return Internal(errno_text("socket"));
  tcp_listener_.reset(tcp);
  int one = 1;
  ::setsockopt(tcp, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(self.port);
  // Listen only on the address the cluster names us by (peers reach us
  // there; other interfaces have no business here). A host name may resolve
  // differently here and on the peers (Debian maps its own name to
  // 127.0.1.1), so only a literal address narrows the listener.
  bool literal = ::inet_pton(AF_INET, self.host.c_str(), &addr.sin_addr) == 1;
  if (!literal) addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(tcp, reinterpret_cast<struct sockaddr *>(&addr), sizeof(addr)) != 0) {
    return Unavailable("cannot listen on " + (literal ? self.str() : "port " + std::to_string(self.port)) + " for " +
                       opt_.cluster.describe(opt_.self_rank) + ": " + strerror(errno));
  }
  if (::listen(tcp, kListenBacklog) != 0) return Internal(errno_text("listen"));

  if (opt_.same_host_unix_sockets) {
    int ux = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ux < 0) return Internal(errno_text("socket(AF_UNIX)"));
    unix_listener_.reset(ux);
    struct sockaddr_un uaddr;
    socklen_t len = unix_address(self.port, &uaddr);
    if (::bind(ux, reinterpret_cast<struct sockaddr *>(&uaddr), len) != 0) {
      return Unavailable("cannot bind same-host socket for port " + std::to_string(self.port) + ": " +
                         strerror(errno));
    }
    if (::listen(ux, kListenBacklog) != 0) return Internal(errno_text("listen(AF_UNIX)"));
  }
  return Status::OK();
}

Status Transport::start(Listeners inherited) {
  if (inherited.valid()) {
    tcp_listener_ = std::move(inherited.tcp);
    unix_listener_ = std::move(inherited.unix_socket);
  } else {
    Status s = bind_listeners();
    if (!s.ok()) return s;
  }
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Internal(errno_text("pipe"));
  wake_read_.reset(pipefd[0]);
  wake_write_.reset(pipefd[1]);
  acceptor_ = std::thread([this] { accept_loop(); });
  for (int r = 0; r < opt_.cluster.size(); ++r) {
    if (r != opt_.self_rank) links_[r]->sender = std::thread([this, r] { sender_loop(r); });
  }
  return Status::OK();
}

Transport::~Transport() { stop(Unavailable("runtime shutting down")); }

void Transport::stop_accepting() {
  if (wake_write_.valid()) {
    char c = 0;
    (void)!::write(wake_write_.get(), &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
}

Listeners Transport::release_listeners() {
  std::lock_guard<std::mutex> guard(stop_mu_);
  Listeners out;
  if (stopped_) return out;
  stop_accepting();
  out.tcp = std::move(tcp_listener_);
  out.unix_socket = std::move(unix_listener_);
  return out;
}

void Transport::stop(const Status &why) {
  std::lock_guard<std::mutex> guard(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  stop_accepting();
  for (auto &link : links_) {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      if (link->broken.ok()) link->broken = why;
      link->fd.shutdown_both();
      if (link->connecting >= 0) ::shutdown(link->connecting, SHUT_RDWR);
    }
    link->cv.notify_all();
    if (link->sender.joinable()) link->sender.join();
    // Whatever was queued after the sender's last look fails too.
    std::deque<SendItem> left;
    {
      std::lock_guard<std::mutex> lock(link->mu);
      left.swap(link->queue);
    }
    for (SendItem &item : left) item.on_sent(why);
    std::lock_guard<std::mutex> lock(link->mu);
    link->fd.reset();  // a retired generation's transport lives on: release its sockets now
    link->auth.reset();
  }
  tcp_listener_.reset();
  unix_listener_.reset();
  wake_read_.reset();
  wake_write_.reset();
  std::list<std::unique_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    for (auto &c : connections_) {
      if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    }
    connections.swap(connections_);
  }
  for (auto &c : connections) c->thread.join();
}

// ---------------------------------------------------------------- receiving

void Transport::accept_loop() {
  struct pollfd fds[3];
  int nfds = 0;
  fds[nfds++] = {wake_read_.get(), POLLIN, 0};
  fds[nfds++] = {tcp_listener_.get(), POLLIN, 0};
  if (unix_listener_.valid()) fds[nfds++] = {unix_listener_.get(), POLLIN, 0};
  // Non-blocking listeners (inherited ones too): accept_pending drains the
  // queue until EAGAIN instead of one accept per poll.
  for (int i = 1; i < nfds; ++i) ::fcntl(fds[i].fd, F_SETFL, ::fcntl(fds[i].fd, F_GETFL) | O_NONBLOCK);
  while (!stopping_) {
    // Wakes at least once a second to reap finished connection threads.
    int n = ::poll(fds, nfds, 1000);
    if (n < 0 && errno != EINTR) break;
    reap_connections();
    if (n <= 0) continue;
    if (fds[0].revents) break;
    for (int i = 1; i < nfds; ++i) {
      if (fds[i].revents & POLLIN) accept_pending(fds[i].fd, i == 2);
    }
  }
}

void Transport::accept_pending(int listener, bool is_unix) {
  for (int i = 0; i < kAcceptBurst && !stopping_; ++i) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: back off instead of spinning on a listener that stays readable.
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;  // EAGAIN: the queue is empty
    }
    admit(Fd(fd), is_unix);
  }
}

void Transport::admit(Fd owned, bool is_unix) {
  std::lock_guard<std::mutex> lock(conn_mu_);
  if (stopping_) return;
  if (handshaking_ >= kMaxHandshakes && !evict_stalled_handshake()) {
    ++rejected_;
    rejections_log_.print("dropped a connection: " + std::to_string(handshaking_) +
                          " connections are already in their handshake");
    return;
  }
  const int fd = owned.get();
  tune_socket(fd, is_unix);
  auto conn = std::make_unique<Connection>();
  conn->fd = fd;
  conn->accepted = std::chrono::steady_clock::now();
  Connection *c = conn.get();
  try {
    conn->thread = std::thread([this, fd, c] { serve_connection(Fd(fd), c); });
  } catch (const std::system_error &e) {
    // No thread to be had (resource limits): drop this connection, keep the worker.
    ++rejected_;
    rejections_log_.print(std::string("dropped a connection: cannot start a thread: ") + e.what());
    return;
  }
  owned.release();  // the thread owns it now
  ++handshaking_;
  connections_.push_back(std::move(conn));
}

bool Transport::evict_stalled_handshake() {
  Connection *oldest = nullptr;
  for (auto &c : connections_) {  // in accept order: the first one proving is the oldest
    if (c->proving && !c->evicted && c->fd >= 0) {
      oldest = c.get();
      break;
    }
  }
  if (oldest == nullptr) return false;
  const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest->accepted).count();
  if (age < kEvictAfterSeconds) return false;
  // Its thread sees the socket fail, gives up the handshake and frees the
  // slot (handshaking_ drops when it does); the newcomer takes it now.
  oldest->evicted = true;
  ::shutdown(oldest->fd, SHUT_RDWR);
  ++evicted_;
  return true;
}

size_t Transport::handshakes_in_progress() {
  std::lock_guard<std::mutex> lock(conn_mu_);
  return handshaking_;
}

void Transport::reap_connections() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if ((*it)->done) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (auto &c : finished) c->thread.join();
}

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
  bool proven =
      server_handshake(fd.get(), opt_.secret, self, &client_id, &session_key, &err, kHandshakeTimeoutSeconds, &skew);
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
  while (true) {
    FrameHeader h;
    if (!recv_all(fd.get(), &h, sizeof(h), &why)) break;
    socket_order_after_header(order);
    Status header_ok = check_frame_header(h);
    if (!header_ok.ok()) {
      why = header_ok.message();
      break;
    }
    std::string key(h.key_len, '\0');
    if (!recv_all(fd.get(), key.data(), key.size(), &why)) break;
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
      read_ok = verified ? verified->read(dst, len) : recv_all(fd.get(), dst, len, &why);
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
      read_ok = recv_all(fd.get(), scratch.data(), n, &why);
      consumed += n;
    }
    if (!read_ok) break;
  }
  // After a goodbye the end of the stream is expected; while we leave, so is
  // a peer closing on us. Anything else is a crash.
  if (!stopping_ && !leaving_ && !said_goodbye) handler_->on_peer_lost(src, lost());
}

// ---------------------------------------------------------------- sending

HandshakeIdentity Transport::identity(bool across_hosts) const {
  HandshakeIdentity self;
  self.job_id = opt_.job_id;
  self.cluster_version = opt_.cluster.version();
  self.authenticate_frames = authenticates_frames(opt_.frame_auth, across_hosts);
  self.frame_auth_policy = opt_.frame_auth;
  self.across_hosts = across_hosts;
  return self;
}

void Transport::note_authenticated_connection() {
  if (authenticated_.fetch_add(1) == 0 && opt_.frame_auth == FrameAuthPolicy::kAcrossHosts) {
    fprintf(stderr, "kungfu: %s authenticates the frames of its connections to other hosts (AES-GMAC; "
            "KUNGFU_AUTHENTICATE_FRAMES=0 turns it off)\n", opt_.cluster.describe(opt_.self_rank).c_str());
  }
}

Status Transport::connect_to(int dst, Fd *out, std::unique_ptr<FrameAuthenticator> *auth, bool *moved_on) {
  *moved_on = false;
  const PeerID &peer = opt_.cluster.peer(dst);
  const PeerID &self = opt_.cluster.peer(opt_.self_rank);
  bool use_unix = opt_.same_host_unix_sockets && peer.host == self.host;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(opt_.timeout_seconds));
  // Registers the socket being dialed so that stop() can cut a connect or a
  // handshake short; released before the socket closes.
  struct Dialing {
    Link &link;
    Dialing(Link &l, int fd, const std::atomic<bool> &stopping) : link(l) {
      std::lock_guard<std::mutex> lock(link.mu);
      link.connecting = fd;
      if (stopping) ::shutdown(fd, SHUT_RDWR);
    }
    ~Dialing() {
      std::lock_guard<std::mutex> lock(link.mu);
      link.connecting = -1;
    }
    Dialing(const Dialing &) = delete;
    Dialing &operator=(const Dialing &) = delete;
  };
  std::string last_error;
  int backoff_ms = 5;
  while (!stopping_) {
    // A peer that is not listening yet (it starts up) is retried more
    // patiently than one at an older cluster version, which switches within
    // milliseconds.
    int max_backoff_ms = 50;
    Fd fd(::socket(use_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    Dialing dialing(*links_[dst], fd.get(), stopping_);
    bool connected;
    int refused = 0;  // the connect's errno
    if (use_unix) {
      struct sockaddr_un addr;
      socklen_t len = unix_address(peer.port, &addr);
      connected =
          connect_until(fd.get(), reinterpret_cast<struct sockaddr *>(&addr), len, deadline, &last_error, &refused);
    } else {
      struct addrinfo hints = {}, *res = nullptr;
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      int gai = ::getaddrinfo(peer.host.c_str(), std::to_string(peer.port).c_str(), &hints, &res);
      if (gai != 0) return Unavailable("cannot resolve " + peer.str() + ": " + gai_strerror(gai));
      connected = connect_until(fd.get(), res->ai_addr, res->ai_addrlen, deadline, &last_error, &refused);
      freeaddrinfo(res);
    }
    if (!connected && refused == ECONNREFUSED && dst < static_cast<int>(opt_.listening.size()) &&
        opt_.listening[dst]) {
      // Its port has been bound since an earlier version and never closes
      // across changes: nobody listening there means the process is gone.
      return Unavailable("cannot connect to " + opt_.cluster.describe(dst) + ": " + last_error +
                         " (it was listening at the previous cluster version: the process is gone)");
    }
    if (connected) {
      tune_socket(fd.get(), use_unix);
      // A peer that stops reading fails our sends after the timeout instead
      // of blocking a sender thread forever.
      set_io_timeout(fd.get(), opt_.timeout_seconds);
      std::string err;
      SessionKey key;
      VersionSkew skew = VersionSkew::kNone;
      bool cut_before_hello = false;
      const HandshakeIdentity us = identity(connects_two_hosts(fd.get()));
      if (client_handshake(fd.get(), opt_.secret, us, self.str(), &key, &err, kHandshakeTimeoutSeconds, &skew,
                           &cut_before_hello)) {
        if (us.authenticate_frames) {
          *auth = std::make_unique<FrameAuthenticator>(key, FrameDirection::kClientToServer);
          note_authenticated_connection();
        }
        *out = std::move(fd);
        return Status::OK();
      }
      if (skew == VersionSkew::kPeerAhead) {
        *moved_on = true;
        return Unavailable(opt_.cluster.describe(dst) + " has left cluster version " +
                           std::to_string(opt_.cluster.version()) + " (" + err + ")");
      }
      // A peer that has not switched to our version yet answers at its old
      // one; one in the middle of its switch may instead hang up before its
      // hello (its old transport, stopping, closes what it accepted last).
      // Both are retried. A process that is gone then refuses the next
      // connect (reported above), and strangers are judged by the server.
      if (skew != VersionSkew::kPeerBehind && !cut_before_hello) {
        return Unavailable("handshake with " + opt_.cluster.describe(dst) + " failed: " + err);
      }
      last_error = err;
      max_backoff_ms = 20;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, max_backoff_ms);
  }
  return Unavailable("cannot connect to " + opt_.cluster.describe(dst) + " within " +
                     std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s: " + last_error);
}

Status Transport::write_frame(int dst, int fd, FrameAuthenticator *auth, SendItem &item, bool wait) {
  if (auth) item.authenticated = true;
  const size_t total = frame_bytes(item);
  const size_t prefix = sizeof(item.header) + item.key.size();
  const uint64_t segments = FrameAuthenticator::segments(item.len);
  constexpr size_t kSeg = FrameAuthenticator::kSegmentLen, kTag = FrameAuthenticator::kTagLen;
  if (item.written == 0) {
    // The whole frame's bytes, once, before its first byte goes out (TSAN only).
    struct iovec whole[3] = {{&item.header, sizeof(item.header)},
                             {const_cast<char *>(item.key.data()), item.key.size()},
                             {const_cast<void *>(item.data), item.len}};
    socket_order_before_send(links_[dst]->order, whole, 3);
  }
  while (item.written < total) {
    // The bytes of the wire still to write: everything, or (authenticated)
    // what is left of the current segment and its tag.
    struct iovec iov[4];
    int n_iov = 0;
    size_t start = 0;  // wire offset of iov[0]
    if (!item.authenticated) {
      iov[n_iov++] = {&item.header, sizeof(item.header)};
      iov[n_iov++] = {const_cast<char *>(item.key.data()), item.key.size()};
      iov[n_iov++] = {const_cast<void *>(item.data), item.len};
    } else {
      const uint64_t seg = item.written < prefix ? 0 : std::min<uint64_t>((item.written - prefix) / (kSeg + kTag), segments - 1);
      const size_t seg_off = seg * kSeg;
      const size_t seg_len = std::min(kSeg, item.len - seg_off);
      if (item.signed_segments == seg) {
        // Signed exactly once, in wire order: only the link's one busy writer gets here.
        if (seg == 0) {
          auth->begin_frame(&item.header, sizeof(item.header), item.key.data(), item.key.size());
        } else {
          auth->begin_segment();
        }
        auth->add_payload(static_cast<const char *>(item.data) + seg_off, seg_len);
        item.tag = auth->end_frame();
        ++item.signed_segments;
      }
      if (seg == 0) {
        iov[n_iov++] = {&item.header, sizeof(item.header)};
        iov[n_iov++] = {const_cast<char *>(item.key.data()), item.key.size()};
      } else {
        start = prefix + seg * (kSeg + kTag);
      }
      iov[n_iov++] = {const_cast<char *>(static_cast<const char *>(item.data)) + seg_off, seg_len};
      iov[n_iov++] = {item.tag.data(), kTag};
    }
    // Skip what an earlier, partial write already sent.
    int first = 0;
    size_t skip = item.written - start;
    while (skip >= iov[first].iov_len) skip -= iov[first++].iov_len;
    iov[first].iov_base = static_cast<char *>(iov[first].iov_base) + skip;
    iov[first].iov_len -= skip;
    struct msghdr msg = {};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = n_iov - first;
    ssize_t n;
    {
      SocketCopyUnseen unseen;  // counted as read by socket_order_before_send
      n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait) return Status::OK();  // the rest goes from the sender thread
        // The send timeout (KUNGFU_TIMEOUT) passed with no progress at all.
        return DeadlineExceeded(opt_.cluster.describe(dst) + " read nothing we sent for " +
                                std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s (KUNGFU_TIMEOUT)");
      }
      // No key here: the link keeps this status for every later send, and
      // each op that fails on it adds its own name.
      return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: send failed: " + strerror(errno));
    }
    item.written += static_cast<size_t>(n);
  }
  counters_.add_sent(dst, total);
  return Status::OK();
}

void Transport::write_exclusively(int dst, Link &link, std::unique_lock<std::mutex> &lock, SendItem &item,
                                  bool wait) {
  // `busy` keeps frames in order: nobody else writes until we are done, and the
  // lock is not held during the (possibly long) write.
  link.busy = true;
  int fd = link.fd.get();
  FrameAuthenticator *auth = link.auth.get();
  lock.unlock();
  Status s = write_frame(dst, fd, auth, item, wait);
  lock.lock();
  link.busy = false;
  if (s.ok() && item.written < frame_bytes(item)) {
    // The socket is full and the caller may not wait (a TF kernel thread):
    // the sender thread writes the rest, before anything queued after it.
    link.queue.push_front(std::move(item));
    lock.unlock();
    link.cv.notify_all();
    return;
  }
  if (s.ok() && item.header.type == static_cast<uint8_t>(FrameType::kGoodbye)) {
    // Nothing follows a goodbye: end our stream so the peer reads EOF.
    link.goodbye_written = true;
    ::shutdown(fd, SHUT_WR);
  }
  lock.unlock();
  link.cv.notify_all();
  if (!s.ok()) break_link(dst, s);
  item.on_sent(s);
}

void Transport::send(int dst, FrameHeader header, std::string key, const void *data, size_t len,
                     std::shared_ptr<const void> keepalive, SendCallback on_sent) {
  Link &link = *links_[dst];
  header.key_len = static_cast<uint32_t>(key.size());
  header.payload_len = len;
  header.cluster_version = opt_.cluster.version();
  SendItem item{header, std::move(key), data, len, std::move(keepalive), std::move(on_sent)};
  std::unique_lock<std::mutex> lock(link.mu);
  if (!link.broken.ok() || link.closing) {
    Status s = link.broken.ok() ? Unavailable(opt_.cluster.describe(opt_.self_rank) + " is leaving the cluster")
                                : link.broken;
    lock.unlock();
    item.on_sent(s);
    return;
  }
  if (len <= kInlineSendLimit && link.queue.empty() && !link.busy && link.fd.valid()) {
    // Written by the caller without ever blocking it: what does not fit in
    // the socket now is left to the sender thread.
    write_exclusively(dst, link, lock, item, false);
    return;
  }
  link.queue.push_back(std::move(item));
  lock.unlock();
  link.cv.notify_all();
}

void Transport::sender_loop(int dst) {
  Link &link = *links_[dst];
  while (true) {
    std::unique_lock<std::mutex> lock(link.mu);
    link.cv.wait(lock, [&] { return stopping_ || (!link.queue.empty() && !link.busy); });
    if (stopping_) break;
    if (!link.fd.valid() && link.broken.ok()) {
      lock.unlock();
      Fd fd;
      std::unique_ptr<FrameAuthenticator> auth;
      bool moved_on = false;
      Status s = connect_to(dst, &fd, &auth, &moved_on);
      lock.lock();
      if (s.ok()) {
        link.fd = std::move(fd);
        link.auth = std::move(auth);
      } else {
        lock.unlock();
        if (moved_on) {
          // Not a crash: the peer switched to a newer cluster version and
          // will never send us anything at ours again.
          peer_departed(dst, s);
          if (!stopping_ && !leaving_) handler_->on_peer_left(dst, s);
        } else {
          break_link(dst, s);
        }
        continue;
      }
    }
    if (link.queue.empty()) continue;
    SendItem item = std::move(link.queue.front());
    link.queue.pop_front();
    if (!link.broken.ok()) {
      Status s = link.broken;
      lock.unlock();
      item.on_sent(s);
      continue;
    }
    write_exclusively(dst, link, lock, item, true);
  }
  // Shutting down: whatever is still queued fails.
  std::deque<SendItem> left;
  Status why = Unavailable("runtime shutting down");
  {
    std::lock_guard<std::mutex> lock(link.mu);
    left.swap(link.queue);
    if (!link.broken.ok()) why = link.broken;
  }
  for (SendItem &item : left) item.on_sent(why);
}

void Transport::break_link(int dst, const Status &why) {
  std::deque<SendItem> failed;
  {
    std::lock_guard<std::mutex> lock(links_[dst]->mu);
    if (links_[dst]->broken.ok()) links_[dst]->broken = why;
    failed.swap(links_[dst]->queue);
  }
  for (SendItem &item : failed) item.on_sent(why);
  links_[dst]->cv.notify_all();
  if (!stopping_ && !leaving_) handler_->on_peer_lost(dst, why);
}

void Transport::peer_departed(int dst, const Status &why) {
  Link &link = *links_[dst];
  std::deque<SendItem> failed;
  {
    std::lock_guard<std::mutex> lock(link.mu);
    if (link.broken.ok()) link.broken = why;
    failed.swap(link.queue);
    // A write in progress finishes on its own; nothing is written after it.
    if (!link.busy && link.fd.valid()) ::shutdown(link.fd.get(), SHUT_WR);
  }
  link.cv.notify_all();
  for (SendItem &item : failed) item.on_sent(why);
}

void Transport::leave(std::chrono::steady_clock::time_point deadline, uint32_t next_version) {
  leaving_ = true;
  for (int r = 0; r < opt_.cluster.size(); ++r) {
    if (r == opt_.self_rank) continue;
    Link &link = *links_[r];
    std::unique_lock<std::mutex> lock(link.mu);
    // Peers we never opened a stream to are waiting for nothing from us.
    bool connected = link.fd.valid() || !link.queue.empty();
    if (link.closing || !link.broken.ok() || !connected) continue;
    link.closing = true;
    FrameHeader h;
    h.type = static_cast<uint8_t>(FrameType::kGoodbye);
    h.cluster_version = opt_.cluster.version();
    h.seq = next_version;
    link.queue.push_back(SendItem{h, std::string(), nullptr, 0, nullptr, [](const Status &) {}});
    lock.unlock();
    link.cv.notify_all();
  }
  for (int r = 0; r < opt_.cluster.size(); ++r) {
    if (r == opt_.self_rank) continue;
    Link &link = *links_[r];
    std::unique_lock<std::mutex> lock(link.mu);
    link.cv.wait_until(lock, deadline, [&] { return !link.closing || link.goodbye_written || !link.broken.ok(); });
  }
}

}  // namespace kungfu
