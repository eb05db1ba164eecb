// Dialing a peer: connecting (retried while it starts up or switches
// versions) and the client side of the handshake.
#include "transport.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <thread>

#include "socket_setup.h"

namespace kungfu {

Status Transport::connect_to(int dst, Fd *out, std::unique_ptr<FrameAuthenticator> *auth,
                             std::unique_ptr<ShmRing> *ring, bool *moved_on) {
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
      connected = connect_until(fd.get(), reinterpret_cast<struct sockaddr *>(&addr), len, deadline, &last_error,
                                &refused);
    } else {
      struct addrinfo hints = {}, *res = nullptr;
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      int gai = ::getaddrinfo(peer.host.c_str(), std::to_string(peer.port).c_str(), &hints, &res);
      if (gai != 0) return Unavailable("cannot resolve " + peer.str() + ": " + gai_strerror(gai));
      connected = connect_until(fd.get(), res->ai_addr, res->ai_addrlen, deadline, &last_error, &refused);
      freeaddrinfo(res);
    }
    if (!connected && refused == ECONNREFUSED && dst < static_cast<int>(opt_.listening.size()) && opt_.listening[dst]) {
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
        } else if (use_unix && opt_.same_host_shm) {
          Status s = offer_shm_ring(dst, fd.get(), ring);
          if (!s.ok()) return s;
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

}  // namespace kungfu
