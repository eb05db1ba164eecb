// Blocking, EINTR-safe helpers for whole-buffer socket I/O.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <string>

namespace kungfu {

// Owns a file descriptor; closes it on destruction (RAII).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd &&other) noexcept : fd_(other.release()) {}
  Fd &operator=(Fd &&other) noexcept;
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);
  // Half-close both directions so a thread blocked in recv() on this fd wakes up.
  void shutdown_both() const;

 private:
  int fd_ = -1;
};

// Writes exactly `len` bytes. Returns false (and sets *err) on error or EOF.
bool send_all(int fd, const void *buf, size_t len, std::string *err);
// Writes all of the iovecs (modified in place). Returns false on error.
bool sendv_all(int fd, struct iovec *iov, int iovcnt, std::string *err);
// Reads exactly `len` bytes. Returns false on error or EOF (err says which).
bool recv_all(int fd, void *buf, size_t len, std::string *err);
// Sets SO_RCVTIMEO/SO_SNDTIMEO; 0 disables the timeout.
void set_io_timeout(int fd, double seconds);

// Whether the connected socket `fd` joins this host to another one: false
// for a Unix socket, a loopback address (127/8) or a peer address that one
// of this host's (this network namespace's) interfaces holds; true for any
// other TCP peer, and when the peer's address cannot be read.
bool connects_two_hosts(int fd);

}  // namespace kungfu
