// Tells ThreadSanitizer about the ordering a connection creates: everything
// a thread did before it sent a frame happens before whatever the thread
// that reads the frame does after reading the frame's header.
//
// TSAN cannot see that ordering (bytes through the kernel), so an
// in-process cluster (the C++ tests) looks racy to it on every tensor:
// rank A's sender thread reads a buffer inside sendmsg(), and a thread of A
// later writes the same buffer after B's reply, which exists only because
// B read what A sent. Suppressing those reports is not enough: a range
// access (a recv() into a tensor) yields one report per racing 8-byte word,
// and TSAN (with its default suppress_equal_addresses) appends each word to
// one global list before it consults the suppressions, scanning the whole
// list under a global mutex every time. Measured in test_shutdown's np=8
// BINARY_TREE 256 KiB case: the list held 100,000 entries after 20 s and
// grew by ~3,700 a second, receiving threads sat in that scan and the
// all-reduces timed out.
//
// Everything here is a no-op unless the build uses -fsanitize=thread.
#pragma once

#include <sys/uio.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

#if defined(__SANITIZE_THREAD__)
#define KUNGFU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KUNGFU_TSAN 1
#endif
#endif

#ifdef KUNGFU_TSAN
extern "C" {
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_read_range(void *addr, unsigned long size);
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
}
#endif

namespace kungfu {

// The synchronisation object of the connections between peers `from` and
// `to` ("host:port" each), both directions: both ends compute the same one
// (no lock is taken to find it). One for both directions, because a peer
// in another process (a forked test rank) releases nothing in ours: what
// we sent it happens before its reply only through our own send's release,
// which the reply's reader then acquires. It orders a pair's two
// directions more than needed, never less.
inline void *socket_order_key(const std::string &from, const std::string &to) {
#ifdef KUNGFU_TSAN
  // One cell per pair, found by hash; a collision only orders two pairs'
  // frames more than needed, never less.
  constexpr size_t kCells = size_t(1) << 16;
  alignas(8) static uint64_t cells[kCells];
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const std::string pair = from < to ? from + "|" + to : to + "|" + from;
  for (char c : pair) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return &cells[h % kCells];
#else
  (void)from;
  (void)to;
  return nullptr;
#endif
}

// Sender, before the first byte of a frame is written: the frame's bytes
// count as read now, and everything this thread did so far is published to
// the reader of the frame. The kernel's copy inside sendmsg() must then run
// under SocketCopyUnseen: TSAN would record it only after the call, when the
// receiver may already have the bytes and be acting on them.
inline void socket_order_before_send(void *key, const struct iovec *iov, int iovcnt) {
#ifdef KUNGFU_TSAN
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len > 0) __tsan_read_range(iov[i].iov_base, iov[i].iov_len);
  }
  __tsan_release(key);
#else
  (void)key;
  (void)iov;
  (void)iovcnt;
#endif
}

// Receiver, once a frame's header is read: what the sender did before the
// frame happens before anything this thread does from now on (reading the
// payload into a consumer's buffer included).
inline void socket_order_after_header(void *key) {
#ifdef KUNGFU_TSAN
  __tsan_acquire(key);
#else
  (void)key;
#endif
}

// While alive, TSAN does not record this thread's memory accesses (the
// kernel's copy of a frame, already accounted for by socket_order_before_send).
class SocketCopyUnseen {
 public:
#ifdef KUNGFU_TSAN
  SocketCopyUnseen() { __tsan_ignore_thread_begin(); }
  ~SocketCopyUnseen() {
    int saved = errno;  // the caller reads the system call's errno after us
    __tsan_ignore_thread_end();
    errno = saved;
  }
#else
  SocketCopyUnseen() {}  // user-provided: a scoped guard, not an unused variable
#endif
  SocketCopyUnseen(const SocketCopyUnseen &) = delete;
  SocketCopyUnseen &operator=(const SocketCopyUnseen &) = delete;
};

}  // namespace kungfu
