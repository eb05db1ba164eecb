// Accepting connections: the acceptor thread, the handshake slots (and
// evicting a stalled stranger from one), and reaping finished connections.
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <system_error>

#include "socket_setup.h"

namespace kungfu {

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

size_t Transport::receiver_threads() {
  std::lock_guard<std::mutex> lock(conn_mu_);
  size_t n = 0;
  for (const auto &c : connections_) n += !c->done;
  return n;
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

}  // namespace kungfu
