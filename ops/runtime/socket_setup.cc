#include "socket_setup.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>

#include <algorithm>
#include <cstddef>

namespace kungfu {

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

}  // namespace kungfu
