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
#include <cstdio>

#include "handshake.h"

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

}  // namespace

Transport::Transport(TransportOptions options, FrameHandler *handler)
    : opt_(std::move(options)), handler_(handler), counters_(opt_.cluster.size()) {
  for (int i = 0; i < opt_.cluster.size(); ++i) links_.push_back(std::make_unique<Link>());
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
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(tcp, reinterpret_cast<struct sockaddr *>(&addr), sizeof(addr)) != 0) {
    return Unavailable("cannot listen on port " + std::to_string(self.port) + " for " + self.str() + ": " +
                       strerror(errno));
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
  std::vector<std::thread> receivers;
  {
    std::lock_guard<std::mutex> lock(conn_mu_);
    for (int fd : open_incoming_) ::shutdown(fd, SHUT_RDWR);
    receivers.swap(receivers_);
  }
  for (auto &t : receivers) t.join();
}

// ---------------------------------------------------------------- receiving

void Transport::accept_loop() {
  struct pollfd fds[3];
  int nfds = 0;
  fds[nfds++] = {wake_read_.get(), POLLIN, 0};
  fds[nfds++] = {tcp_listener_.get(), POLLIN, 0};
  if (unix_listener_.valid()) fds[nfds++] = {unix_listener_.get(), POLLIN, 0};
  while (!stopping_) {
    int n = ::poll(fds, nfds, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    for (int i = 1; i < nfds; ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      int fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      bool is_unix = (i == 2);
      tune_socket(fd, is_unix);
      std::lock_guard<std::mutex> lock(conn_mu_);
      if (stopping_) {
        ::close(fd);
        break;
      }
      open_incoming_.push_back(fd);
      receivers_.emplace_back([this, fd, is_unix] { serve_connection(Fd(fd), is_unix); });
    }
  }
}

void Transport::serve_connection(Fd fd, bool is_unix) {
  (void)is_unix;
  auto forget = [this, &fd] {
    std::lock_guard<std::mutex> lock(conn_mu_);
    for (size_t i = 0; i < open_incoming_.size(); ++i) {
      if (open_incoming_[i] == fd.get()) {
        open_incoming_.erase(open_incoming_.begin() + i);
        break;
      }
    }
  };
  std::string client_id, err;
  if (!server_handshake(fd.get(), opt_.secret, {opt_.job_id, opt_.cluster.version()}, &client_id, nullptr, &err)) {
    ++rejected_;
    if (!stopping_) fprintf(stderr, "kungfu: rejected a connection: %s\n", err.c_str());
    forget();
    return;
  }
  int src = opt_.cluster.rank_of(client_id);
  if (src < 0 || src == opt_.self_rank) {
    ++rejected_;
    fprintf(stderr, "kungfu: rejected a connection from '%s': not a peer of this cluster\n", client_id.c_str());
    forget();
    return;
  }

  std::vector<char> scratch;
  std::string why;
  while (true) {
    FrameHeader h;
    if (!recv_all(fd.get(), &h, sizeof(h), &why)) break;
    if (h.magic != kFrameMagic || h.key_len > kMaxKeyLen || h.ndims > kMaxDims) {
      why = "malformed frame header";
      break;
    }
    std::string key(h.key_len, '\0');
    if (!recv_all(fd.get(), key.data(), key.size(), &why)) break;
    counters_.add_received(src, sizeof(h) + h.key_len + h.payload_len);

    uint64_t consumed = 0;
    bool read_ok = true;
    PartialReader read = [&](void *dst, size_t len) {
      if (consumed + len > h.payload_len) {
        why = "handler read past the end of a frame";
        read_ok = false;
        return false;
      }
      consumed += len;
      read_ok = recv_all(fd.get(), dst, len, &why);
      return read_ok;
    };
    if (h.cluster_version != opt_.cluster.version()) {
      fprintf(stderr, "kungfu: dropped '%s' from %s: cluster version %u, ours is %u\n", key.c_str(),
              opt_.cluster.describe(src).c_str(), h.cluster_version, opt_.cluster.version());
    } else if (!handler_->on_frame(src, h, std::move(key), read)) {
      break;
    }
    // Skip whatever of the payload nobody wanted.
    while (read_ok && consumed < h.payload_len) {
      scratch.resize(std::min<uint64_t>(h.payload_len - consumed, 1 << 20));
      size_t n = scratch.size();
      read_ok = recv_all(fd.get(), scratch.data(), n, &why);
      consumed += n;
    }
    if (!read_ok) break;
  }
  forget();
  if (!stopping_) {
    handler_->on_peer_lost(src, Unavailable("lost connection from " + opt_.cluster.describe(src) + ": " + why));
  }
}

// ---------------------------------------------------------------- sending

Status Transport::connect_to(int dst, Fd *out) {
  const PeerID &peer = opt_.cluster.peer(dst);
  const PeerID &self = opt_.cluster.peer(opt_.self_rank);
  bool use_unix = opt_.same_host_unix_sockets && peer.host == self.host;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.timeout_seconds);
  std::string last_error;
  int backoff_ms = 5;
  while (!stopping_) {
    Fd fd(::socket(use_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int rc;
    if (use_unix) {
      struct sockaddr_un addr;
      socklen_t len = unix_address(peer.port, &addr);
      rc = ::connect(fd.get(), reinterpret_cast<struct sockaddr *>(&addr), len);
    } else {
      struct addrinfo hints = {}, *res = nullptr;
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      int gai = ::getaddrinfo(peer.host.c_str(), std::to_string(peer.port).c_str(), &hints, &res);
      if (gai != 0) return Unavailable("cannot resolve " + peer.str() + ": " + gai_strerror(gai));
      rc = ::connect(fd.get(), res->ai_addr, res->ai_addrlen);
      freeaddrinfo(res);
    }
    if (rc == 0) {
      tune_socket(fd.get(), use_unix);
      std::string err;
      if (!client_handshake(fd.get(), opt_.secret, {opt_.job_id, opt_.cluster.version()}, self.str(), nullptr, &err)) {
        return Unavailable("handshake with " + opt_.cluster.describe(dst) + " failed: " + err);
      }
      *out = std::move(fd);
      return Status::OK();
    }
    last_error = strerror(errno);
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
  return Unavailable("cannot connect to " + opt_.cluster.describe(dst) + " within " +
                     std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s: " + last_error);
}

Status Transport::write_frame(int dst, int fd, SendItem &item) {
  item.header.key_len = static_cast<uint32_t>(item.key.size());
  item.header.payload_len = item.len;
  item.header.cluster_version = opt_.cluster.version();
  struct iovec iov[3];
  iov[0] = {&item.header, sizeof(item.header)};
  iov[1] = {const_cast<char *>(item.key.data()), item.key.size()};
  iov[2] = {const_cast<void *>(item.data), item.len};
  std::string err;
  if (!sendv_all(fd, iov, 3, &err)) {
    // No key here: the link keeps this status for every later send, and each
    // op that fails on it adds its own name.
    return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: " + err);
  }
  counters_.add_sent(dst, sizeof(item.header) + item.key.size() + item.len);
  return Status::OK();
}

void Transport::write_exclusively(int dst, Link &link, std::unique_lock<std::mutex> &lock, SendItem &item) {
  // `busy` keeps frames in order: nobody else writes until we are done, and the
  // lock is not held during the (possibly long) write.
  link.busy = true;
  int fd = link.fd.get();
  lock.unlock();
  Status s = write_frame(dst, fd, item);
  lock.lock();
  link.busy = false;
  lock.unlock();
  link.cv.notify_all();
  if (!s.ok()) break_link(dst, s);
  item.on_sent(s);
}

void Transport::send(int dst, FrameHeader header, std::string key, const void *data, size_t len,
                     std::shared_ptr<const void> keepalive, SendCallback on_sent) {
  Link &link = *links_[dst];
  SendItem item{header, std::move(key), data, len, std::move(keepalive), std::move(on_sent)};
  std::unique_lock<std::mutex> lock(link.mu);
  if (!link.broken.ok()) {
    Status s = link.broken;
    lock.unlock();
    item.on_sent(s);
    return;
  }
  if (len <= kInlineSendLimit && link.queue.empty() && !link.busy && link.fd.valid()) {
    write_exclusively(dst, link, lock, item);
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
      Status s = connect_to(dst, &fd);
      lock.lock();
      if (s.ok()) {
        link.fd = std::move(fd);
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
    write_exclusively(dst, link, lock, item);
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
  if (!stopping_) handler_->on_peer_lost(dst, why);
}

}  // namespace kungfu
