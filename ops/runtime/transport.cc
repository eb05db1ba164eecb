// The transport as a whole: construction, its listening port (bound once,
// handed from one cluster version's transport to the next), start and stop,
// and who it says it is in the handshakes of both directions. The rest:
// transport_accept.cc (accepting connections), transport_receive.cc (serving
// one accepted connection), transport_connect.cc (dialing a peer),
// transport_send.cc (links and writing frames) and transport_shm.cc (a
// same-host link's shared-memory ring).
#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>

#include "socket_order.h"
#include "socket_setup.h"

namespace kungfu {

namespace {

std::string errno_text(const char *what) { return std::string(what) + ": " + strerror(errno); }

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
      return Unavailable("cannot bind same-host socket for port " + std::to_string(self.port) + ": " + strerror(errno));
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
  // Sender threads start with each link's first frame (send()): a worker
  // holds threads only for the peers its topologies talk to.
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
    std::unique_lock<std::mutex> lock(link->mu);
    // An inline write (a caller's thread) may still be copying into the
    // ring: it never blocks, so this wait is short, and the ring must
    // outlive it.
    link->cv.wait(lock, [&] { return !link->busy; });
    link->fd.reset();  // a retired generation's transport lives on: release its sockets now
    link->auth.reset();
    link->ring.reset();
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
    fprintf(stderr,
            "kungfu: %s authenticates the frames of its connections to other hosts (AES-GMAC; "
            "KUNGFU_AUTHENTICATE_FRAMES=0 turns it off)\n",
            opt_.cluster.describe(opt_.self_rank).c_str());
  }
}

}  // namespace kungfu
