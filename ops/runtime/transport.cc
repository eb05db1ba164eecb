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
                   std::string *err) {
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
      *err = strerror(n < 0 ? errno : soerr);
      return false;
    }
  } else if (rc != 0) {
    *err = strerror(errno);
    return false;
  }
  ::fcntl(fd, F_SETFL, flags);  // blocking again: the handshake and sends set their own timeouts
  return true;
}

}  // namespace

Transport::Transport(TransportOptions options, FrameHandler *handler)
    : opt_(std::move(options)), handler_(handler), counters_(opt_.cluster.size()) {
  const std::string self = opt_.cluster.peer(opt_.self_rank).str();
  for (int i = 0; i < opt_.cluster.size(); ++i) {
    links_.push_back(std::make_unique<Link>());
    links_.back()->order = socket_order_key(self, opt_.cluster.peer(i).str());
  }
}

Status Transport::start() {
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
  if (::listen(tcp, 128) != 0) return Internal(errno_text("listen"));

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
    if (::listen(ux, 128) != 0) return Internal(errno_text("listen(AF_UNIX)"));
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

Transport::~Transport() {
  stopping_ = true;
  if (wake_write_.valid()) {
    char c = 0;
    (void)!::write(wake_write_.get(), &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (auto &link : links_) {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      link->fd.shutdown_both();
    }
    link->cv.notify_all();
    if (link->sender.joinable()) link->sender.join();
  }
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
  while (!stopping_) {
    // Wakes at least once a second to reap finished connection threads.
    int n = ::poll(fds, nfds, 1000);
    if (n < 0 && errno != EINTR) break;
    reap_connections();
    if (n <= 0) continue;
    if (fds[0].revents) break;
    for (int i = 1; i < nfds; ++i) {
      if (fds[i].revents & POLLIN) accept_one(fds[i].fd, i == 2);
    }
  }
}

void Transport::accept_one(int listener, bool is_unix) {
  int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    // Out of descriptors: back off instead of spinning on a listener that stays readable.
    if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  Fd owned(fd);
  std::lock_guard<std::mutex> lock(conn_mu_);
  if (stopping_) return;
  if (handshaking_ >= kMaxHandshakes) {
    ++rejected_;
    rejections_log_.print("dropped a connection: " + std::to_string(handshaking_) +
                          " connections are already in their handshake");
    return;
  }
  tune_socket(fd, is_unix);
  auto conn = std::make_unique<Connection>();
  conn->fd = fd;
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
  bool proven = server_handshake(fd.get(), opt_.secret, identity(), &client_id, &session_key, &err);
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    --handshaking_;
  }
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
  if (opt_.authenticate_frames) auth = std::make_unique<FrameAuthenticator>(session_key, FrameDirection::kClientToServer);
  void *order = socket_order_key(client_id, opt_.cluster.peer(opt_.self_rank).str());
  std::vector<char> scratch;
  std::string why;
  bool said_goodbye = false;
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
    counters_.add_received(src, sizeof(h) + h.key_len + h.payload_len + tag_len());

    // With authenticated frames the tag follows the payload, and nothing may
    // act on a frame before it is verified: take it whole first.
    PooledBuffer verified;
    if (auth) {
      // Grown as the bytes arrive: the claimed length is not verified yet.
      PartialReader from_socket = [&](void *dst, size_t len) { return recv_all(fd.get(), dst, len, &why); };
      FrameAuthenticator::Tag tag;
      if (!read_payload(from_socket, h.payload_len, &verified) || !recv_all(fd.get(), tag.data(), tag.size(), &why)) {
        break;
      }
      if (!auth->verify(&h, sizeof(h), key.data(), key.size(), verified.data(), h.payload_len, tag.data())) {
        why = "frame authentication failed (the frame was tampered with, replayed, reordered or injected)";
        break;
      }
    }
    uint64_t consumed = 0;
    bool read_ok = true;
    PartialReader read = [&](void *dst, size_t len) {
      if (consumed + len > h.payload_len) {
        why = "handler read past the end of a frame";
        read_ok = false;
        return false;
      }
      if (auth) {
        if (len > 0) std::memcpy(dst, verified.data() + consumed, len);
      } else {
        read_ok = recv_all(fd.get(), dst, len, &why);
      }
      consumed += len;
      return read_ok;
    };
    if (h.type == static_cast<uint8_t>(FrameType::kGoodbye)) {
      // Everything the peer sent is in; what follows is the end of its stream.
      said_goodbye = true;
      Status left = Unavailable(opt_.cluster.describe(src) + " left the cluster");
      peer_departed(src, left);
      handler_->on_peer_left(src, left);
    } else if (h.cluster_version != opt_.cluster.version()) {
      fprintf(stderr, "kungfu: dropped '%s' from %s: cluster version %u, ours is %u\n", key.c_str(),
              opt_.cluster.describe(src).c_str(), h.cluster_version, opt_.cluster.version());
    } else if (!handler_->on_frame(src, h, std::move(key), read)) {
      break;
    }
    // Skip whatever of the payload nobody wanted.
    if (auth) consumed = h.payload_len;
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
  if (!stopping_ && !leaving_ && !said_goodbye) {
    handler_->on_peer_lost(src, Unavailable("lost connection from " + opt_.cluster.describe(src) + ": " + why));
  }
}

// ---------------------------------------------------------------- sending

HandshakeIdentity Transport::identity() const {
  return HandshakeIdentity{opt_.job_id, opt_.cluster.version(), opt_.authenticate_frames};
}

Status Transport::connect_to(int dst, Fd *out, std::unique_ptr<FrameAuthenticator> *auth) {
  const PeerID &peer = opt_.cluster.peer(dst);
  const PeerID &self = opt_.cluster.peer(opt_.self_rank);
  bool use_unix = opt_.same_host_unix_sockets && peer.host == self.host;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(opt_.timeout_seconds));
  std::string last_error;
  int backoff_ms = 5;
  while (!stopping_) {
    Fd fd(::socket(use_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    bool connected;
    if (use_unix) {
      struct sockaddr_un addr;
      socklen_t len = unix_address(peer.port, &addr);
      connected = connect_until(fd.get(), reinterpret_cast<struct sockaddr *>(&addr), len, deadline, &last_error);
    } else {
      struct addrinfo hints = {}, *res = nullptr;
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      int gai = ::getaddrinfo(peer.host.c_str(), std::to_string(peer.port).c_str(), &hints, &res);
      if (gai != 0) return Unavailable("cannot resolve " + peer.str() + ": " + gai_strerror(gai));
      connected = connect_until(fd.get(), res->ai_addr, res->ai_addrlen, deadline, &last_error);
      freeaddrinfo(res);
    }
    if (connected) {
      tune_socket(fd.get(), use_unix);
      // A peer that stops reading fails our sends after the timeout instead
      // of blocking a sender thread forever.
      set_io_timeout(fd.get(), opt_.timeout_seconds);
      std::string err;
      SessionKey key;
      if (!client_handshake(fd.get(), opt_.secret, identity(), self.str(), &key, &err)) {
        return Unavailable("handshake with " + opt_.cluster.describe(dst) + " failed: " + err);
      }
      if (opt_.authenticate_frames) *auth = std::make_unique<FrameAuthenticator>(key, FrameDirection::kClientToServer);
      *out = std::move(fd);
      return Status::OK();
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
  return Unavailable("cannot connect to " + opt_.cluster.describe(dst) + " within " +
                     std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s: " + last_error);
}

Status Transport::write_frame(int dst, int fd, FrameAuthenticator *auth, SendItem &item, bool wait) {
  const size_t total = frame_bytes(item);
  if (auth && !item.tagged) {
    // Signed exactly once, in wire order: only the link's one busy writer gets here.
    item.tag = auth->sign(&item.header, sizeof(item.header), item.key.data(), item.key.size(), item.data, item.len);
    item.tagged = true;
  }
  while (item.written < total) {
    struct iovec iov[4];
    iov[0] = {&item.header, sizeof(item.header)};
    iov[1] = {const_cast<char *>(item.key.data()), item.key.size()};
    iov[2] = {const_cast<void *>(item.data), item.len};
    iov[3] = {item.tag.data(), tag_len()};
    if (item.written == 0) socket_order_before_send(links_[dst]->order, iov, 4);
    // Skip what an earlier, partial write already sent.
    int first = 0;
    size_t skip = item.written;
    while (skip >= iov[first].iov_len) skip -= iov[first++].iov_len;
    iov[first].iov_base = static_cast<char *>(iov[first].iov_base) + skip;
    iov[first].iov_len -= skip;
    struct msghdr msg = {};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = 4 - first;
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
      Status s = connect_to(dst, &fd, &auth);
      lock.lock();
      if (s.ok()) {
        link.fd = std::move(fd);
        link.auth = std::move(auth);
      } else {
        lock.unlock();
        break_link(dst, s);
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
  {
    std::lock_guard<std::mutex> lock(link.mu);
    left.swap(link.queue);
  }
  for (SendItem &item : left) item.on_sent(Unavailable("runtime shutting down"));
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

void Transport::leave(std::chrono::steady_clock::time_point deadline) {
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
