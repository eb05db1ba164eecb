#include "socket_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace kungfu {

Fd::~Fd() { reset(); }

Fd &Fd::operator=(Fd &&other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Fd::shutdown_both() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool send_all(int fd, const void *buf, size_t len, std::string *err) {
  struct iovec iov;
  iov.iov_base = const_cast<void *>(buf);
  iov.iov_len = len;
  return sendv_all(fd, &iov, 1, err);
}

bool sendv_all(int fd, struct iovec *iov, int iovcnt, std::string *err) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    struct msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = iovcnt;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (err) *err = std::string("send failed: ") + strerror(errno);
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char *>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

bool recv_all(int fd, void *buf, size_t len, std::string *err) {
  char *p = static_cast<char *>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) {
      if (err) *err = "connection closed by peer";
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (err) {
        *err = (errno == EAGAIN || errno == EWOULDBLOCK) ? std::string("receive timed out")
                                                         : std::string("receive failed: ") + strerror(errno);
      }
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void set_io_timeout(int fd, double seconds) {
  struct timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - tv.tv_sec) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

bool connects_two_hosts(int fd) {
  struct sockaddr_storage peer = {};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<struct sockaddr *>(&peer), &len) != 0) return true;
  if (peer.ss_family == AF_UNIX) return false;
  if (peer.ss_family != AF_INET) return true;
  const in_addr_t addr = reinterpret_cast<const struct sockaddr_in *>(&peer)->sin_addr.s_addr;
  if ((ntohl(addr) >> 24) == 127) return false;
  struct ifaddrs *ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return true;
  bool ours = false;
  for (struct ifaddrs *i = ifs; i != nullptr && !ours; i = i->ifa_next) {
    ours = i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
           reinterpret_cast<const struct sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr == addr;
  }
  ::freeifaddrs(ifs);
  return !ours;
}

}  // namespace kungfu
