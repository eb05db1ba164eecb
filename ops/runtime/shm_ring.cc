#include "shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <new>
#include <thread>

namespace kungfu {

namespace {

constexpr uint64_t kRingMagic = 0x474e49524d48534bULL;  // "KSHMRING"
// The control block takes one page; the data starts page-aligned after it.
constexpr size_t kControlBytes = 4096;
// How long a waiting side spins before it sleeps in poll(), at most: long
// enough to catch the answer of a peer running on another core (a small
// all-reduce answers within microseconds). A pure spin, not sched_yield():
// on an oversubscribed host a yielding thread queues behind every runnable
// process for a whole slice, while one woken by the eventfd runs at once.
constexpr auto kSpinFor = std::chrono::microseconds(20);
constexpr int kPauseTurns = 64;  // between looks at the clock

// What a sleeping side publishes in its *_sleeping flag.
constexpr uint32_t kIdleSleep = 1;   // reader between frames: a poller may read for it
constexpr uint32_t kFrameSleep = 2;  // in the middle of a frame: only this side reads on

// Spinning pays only when the wait is short. Each waiting thread (a ring has
// one reader thread, and its writer waits only on its link's sender thread)
// keeps its own budget: a wait that ended within kSpinFor (spinning or not)
// restores it, a longer one halves it, down to no spin at all. On an idle
// host the budget stays whole; on a host with more runnable threads than
// cores, where a spin only takes the core from the peer that has to answer,
// it falls to zero and waits sleep at once.
thread_local std::chrono::nanoseconds spin_budget = kSpinFor;

void learn_from_wait(std::chrono::nanoseconds waited) {
  if (waited <= kSpinFor) {
    spin_budget = kSpinFor;
  } else {
    spin_budget /= 2;
    if (spin_budget < std::chrono::microseconds(1)) spin_budget = std::chrono::nanoseconds(0);
  }
}

std::string errno_text(const char *what) { return std::string(what) + ": " + strerror(errno); }

bool is_power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// Spins for at most the thread's spin budget until `ready`; false if it never was.
bool spin_until(const std::function<bool()> &ready) {
  if (ready()) return true;
  if (spin_budget.count() == 0) return false;
  auto until = std::chrono::steady_clock::now() + spin_budget;
  do {
    for (int i = 0; i < kPauseTurns; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
  } while (std::chrono::steady_clock::now() < until);
  return ready();
}

void signal_eventfd(int fd) {
  uint64_t one = 1;
  // A full counter (never in practice) still leaves the fd readable: the
  // wake-up it stands for is not lost.
  (void)!::write(fd, &one, sizeof(one));
}

void drain_eventfd(int fd) {
  uint64_t count;
  (void)!::read(fd, &count, sizeof(count));
}

bool is_eventfd(int fd) {
  char path[64], target[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  if (n < 0) return false;
  target[n] = '\0';
  return strcmp(target, "anon_inode:[eventfd]") == 0;
}

}  // namespace

// The first page of the memfd. Positions count bytes since the ring began
// (they never wrap in practice: 2^64 bytes); the offset in the data is the
// position modulo the capacity.
struct ShmRing::Control {
  uint64_t magic;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> tail;  // written by the writer: bytes published
  // The reader is in (or entering) poll(): kIdleSleep between frames,
  // kFrameSleep in the middle of one (then only it can read on).
  std::atomic<uint32_t> reader_sleeping;
  // Threads polling the ring besides its reader (begin_polling()): while
  // any does, a writer need not wake the sleeping reader.
  std::atomic<uint32_t> reader_polled;
  alignas(64) std::atomic<uint64_t> head;  // written by the reader: bytes consumed
  std::atomic<uint32_t> writer_sleeping;   // the writer is in (or entering) poll()
};

size_t ShmRing::capacity_for(int peers) {
  size_t capacity = kDefaultCapacity;
  while (capacity > kSmallestLinkCapacity && capacity * static_cast<size_t>(std::max(peers, 1)) > kRingBudget) {
    capacity /= 2;
  }
  return capacity;
}

Status ShmRing::create(size_t capacity, std::unique_ptr<ShmRing> *out) {
  static_assert(sizeof(Control) <= kControlBytes, "the control block fits its page");
  static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
                "ring positions are shared between processes: their atomics must be lock-free");
  if (!is_power_of_two(capacity) || capacity < kMinCapacity || capacity > kMaxCapacity) {
    return InvalidArgument("shared-memory ring capacity " + std::to_string(capacity) + " is not a power of two in [" +
                           std::to_string(kMinCapacity) + ", " + std::to_string(kMaxCapacity) + "]");
  }
  std::unique_ptr<ShmRing> ring(new ShmRing());
  ring->fds_.memory.reset(::memfd_create("kungfu-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!ring->fds_.memory.valid()) return Unavailable(errno_text("memfd_create"));
  int mem = ring->fds_.memory.get();
  if (::ftruncate(mem, static_cast<off_t>(kControlBytes + capacity)) != 0) return Unavailable(errno_text("ftruncate"));
  // Sealed, the reader may trust that the mapping never shrinks under it
  // (a shrunk memfd makes every access past its end a SIGBUS).
  if (::fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Unavailable(errno_text("sealing the shared-memory ring"));
  }
  ring->fds_.data_ready.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ring->fds_.space_ready.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ring->fds_.data_ready.valid() || !ring->fds_.space_ready.valid()) return Unavailable(errno_text("eventfd"));
  ring->capacity_ = capacity;
  ring->map_len_ = kControlBytes + capacity;
  Status s = ring->map(/*writer=*/true);
  if (!s.ok()) return s;
  *out = std::move(ring);
  return Status::OK();
}

Status ShmRing::attach(Descriptors fds, std::unique_ptr<ShmRing> *out) {
  std::unique_ptr<ShmRing> ring(new ShmRing());
  ring->fds_ = std::move(fds);
  int mem = ring->fds_.memory.get();
  if (!ring->fds_.memory.valid() || !ring->fds_.data_ready.valid() || !ring->fds_.space_ready.valid()) {
    return InvalidArgument("shared-memory ring: a descriptor is missing");
  }
  int seals = ::fcntl(mem, F_GET_SEALS);
  if (seals < 0) return InvalidArgument("shared-memory ring: not a memfd (" + errno_text("F_GET_SEALS") + ")");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgument("shared-memory ring: the memfd is not sealed against shrinking");
  }
  if (!is_eventfd(ring->fds_.data_ready.get()) || !is_eventfd(ring->fds_.space_ready.get())) {
    return InvalidArgument("shared-memory ring: the wake-up descriptors are not eventfds");
  }
  struct stat st;
  if (::fstat(mem, &st) != 0) return InvalidArgument("shared-memory ring: " + errno_text("fstat"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t capacity = size > kControlBytes ? size - kControlBytes : 0;
  if (!is_power_of_two(capacity) || capacity < kMinCapacity || capacity > kMaxCapacity) {
    return InvalidArgument("shared-memory ring: memfd of " + std::to_string(size) +
                           " bytes is not a control page plus a power-of-two capacity in [" +
                           std::to_string(kMinCapacity) + ", " + std::to_string(kMaxCapacity) + "]");
  }
  ring->capacity_ = capacity;
  ring->map_len_ = size;
  Status s = ring->map(/*writer=*/false);
  if (!s.ok()) return s;
  const uint64_t magic = ring->ctl_->magic, said = ring->ctl_->capacity;
  if (magic != kRingMagic) return InvalidArgument("shared-memory ring: bad magic " + std::to_string(magic));
  if (said != capacity) {
    return InvalidArgument("shared-memory ring: control block says capacity " + std::to_string(said) +
                           ", the memfd holds " + std::to_string(capacity));
  }
  // The reader starts where the writer is now (a fresh ring: 0); a position
  // that is not a valid start is caught by the first read.
  ring->own_pos_.store(ring->ctl_->head.load(std::memory_order_acquire), std::memory_order_relaxed);
  *out = std::move(ring);
  return Status::OK();
}

Status ShmRing::map(bool writer) {
  // Populated now: the ring's memory is taken once, at connection time,
  // not page by page as the positions advance through it.
  map_ = ::mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fds_.memory.get(), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    return Unavailable(errno_text("mmap of the shared-memory ring"));
  }
  ctl_ = static_cast<Control *>(map_);
  data_ = static_cast<char *>(map_) + kControlBytes;
  if (writer) {
    ctl_ = new (map_) Control();
    ctl_->magic = kRingMagic;
    ctl_->capacity = capacity_;
  }
  return Status::OK();
}

ShmRing::~ShmRing() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

Status ShmRing::export_descriptors(Descriptors *out) const {
  Descriptors d;
  d.memory.reset(::fcntl(fds_.memory.get(), F_DUPFD_CLOEXEC, 0));
  d.data_ready.reset(::fcntl(fds_.data_ready.get(), F_DUPFD_CLOEXEC, 0));
  d.space_ready.reset(::fcntl(fds_.space_ready.get(), F_DUPFD_CLOEXEC, 0));
  if (!d.memory.valid() || !d.data_ready.valid() || !d.space_ready.valid()) return Unavailable(errno_text("dup"));
  *out = std::move(d);
  return Status::OK();
}

size_t ShmRing::write_some(const struct iovec *iov, int iovcnt, size_t skip, Status *status) {
  const uint64_t head = ctl_->head.load(std::memory_order_acquire);
  const uint64_t pos = own_pos_.load(std::memory_order_relaxed);
  const uint64_t used = pos - head;
  if (used > capacity_) {
    *status = InvalidArgument("shared-memory ring corrupt: the reader is at " + std::to_string(head) +
                              ", the writer at " + std::to_string(pos));
    return 0;
  }
  size_t room = capacity_ - used, written = 0;
  for (int i = 0; i < iovcnt && room > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const char *src = static_cast<const char *>(iov[i].iov_base) + skip;
    size_t n = std::min(iov[i].iov_len - skip, room);
    skip = 0;
    size_t off = (pos + written) & (capacity_ - 1);
    size_t first = std::min(n, capacity_ - off);
    std::memcpy(data_ + off, src, first);
    std::memcpy(data_, src + first, n - first);
    written += n;
    room -= n;
  }
  if (written == 0) return 0;
  own_pos_.store(pos + written, std::memory_order_relaxed);
  // seq_cst pairs with the reader's store of reader_sleeping (or a poller's
  // end of reader_polled) then load of tail: either it sees our bytes or we
  // see that it sleeps unpolled.
  ctl_->tail.store(pos + written, std::memory_order_seq_cst);
  const uint32_t sleeping = ctl_->reader_sleeping.load(std::memory_order_seq_cst);
  if (sleeping == kFrameSleep || (sleeping != 0 && ctl_->reader_polled.load(std::memory_order_seq_cst) == 0)) {
    signal_eventfd(fds_.data_ready.get());
  }
  return written;
}

size_t ShmRing::readable(Status *status) const {
  const uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
  const uint64_t pos = own_pos_.load(std::memory_order_relaxed);
  const uint64_t avail = tail - pos;
  if (avail > capacity_) {
    *status = InvalidArgument("shared-memory ring corrupt: the writer is at " + std::to_string(tail) +
                              ", the reader at " + std::to_string(pos) + ", capacity " + std::to_string(capacity_));
    return 0;
  }
  return static_cast<size_t>(avail);
}

size_t ShmRing::read_some(void *dst, size_t len, Status *status) {
  const size_t n = std::min(readable(status), len);
  if (n == 0) return 0;
  size_t off = own_pos_.load(std::memory_order_relaxed) & (capacity_ - 1);
  size_t first = std::min(n, capacity_ - off);
  std::memcpy(dst, data_ + off, first);
  std::memcpy(static_cast<char *>(dst) + first, data_, n - first);
  consume(n);
  return n;
}

bool ShmRing::peek(size_t offset, void *dst, size_t len, Status *status) const {
  const size_t avail = readable(status);
  if (!status->ok() || avail < offset || avail - offset < len) return false;
  size_t off = (own_pos_.load(std::memory_order_relaxed) + offset) & (capacity_ - 1);
  size_t first = std::min(len, capacity_ - off);
  std::memcpy(dst, data_ + off, first);
  std::memcpy(static_cast<char *>(dst) + first, data_, len - first);
  return true;
}

const char *ShmRing::view(size_t len, Status *status) const {
  const size_t avail = readable(status);
  if (!status->ok() || avail < len) return nullptr;
  size_t off = own_pos_.load(std::memory_order_relaxed) & (capacity_ - 1);
  return len <= capacity_ - off ? data_ + off : nullptr;
}

void ShmRing::consume(size_t len) {
  const uint64_t pos = own_pos_.load(std::memory_order_relaxed) + len;
  own_pos_.store(pos, std::memory_order_relaxed);
  ctl_->head.store(pos, std::memory_order_seq_cst);
  if (ctl_->writer_sleeping.load(std::memory_order_seq_cst) != 0) signal_eventfd(fds_.space_ready.get());
}

void ShmRing::begin_polling() { ctl_->reader_polled.fetch_add(1, std::memory_order_seq_cst); }

void ShmRing::end_polling() {
  ctl_->reader_polled.fetch_sub(1, std::memory_order_seq_cst);
  // Pairs with write_some(): a writer that saw the ring polled did not wake
  // the reader, so whatever is in the ring now is left to it here.
  if (maybe_readable()) wake_reader();
}

bool ShmRing::maybe_readable() const {
  return ctl_->tail.load(std::memory_order_seq_cst) != own_pos_.load(std::memory_order_relaxed);
}

void ShmRing::wake_reader() {
  if (ctl_->reader_sleeping.load(std::memory_order_seq_cst) != 0) signal_eventfd(fds_.data_ready.get());
}

bool ShmRing::sleep_on(int efd, int socket, std::atomic<uint32_t> &sleeping, uint32_t how,
                       const std::function<bool()> &ready, int timeout_ms, bool *ended) {
  *ended = false;
  sleeping.store(how, std::memory_order_seq_cst);
  bool woke = ready();
  if (!woke) {
    struct pollfd fds[2] = {{efd, POLLIN, 0}, {socket, POLLIN | POLLRDHUP, 0}};
    int n = ::poll(fds, 2, timeout_ms);
    if (n < 0 && errno != EINTR) *ended = true;
    if (n > 0 && (fds[0].revents & POLLIN)) drain_eventfd(efd);
    // The peer writes nothing on the socket once the ring is in use:
    // anything readable there is its end.
    if (n > 0 && (fds[1].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) *ended = true;
    woke = n > 0 && !*ended;
  }
  sleeping.store(0, std::memory_order_relaxed);
  return woke;
}

Status ShmRing::wait_for_space(int socket, double timeout_seconds) {
  Status corrupt;
  auto has_space = [&] {
    const uint64_t used = own_pos_.load(std::memory_order_relaxed) - ctl_->head.load(std::memory_order_seq_cst);
    return used != capacity_;  // a corrupt position counts as space: write_some reports it
  };
  const auto began = std::chrono::steady_clock::now();
  if (spin_until(has_space)) {
    learn_from_wait(std::chrono::steady_clock::now() - began);
    return Status::OK();
  }
  auto deadline = began + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded("read nothing from the shared-memory ring for " +
                              std::to_string(static_cast<int>(timeout_seconds)) + "s");
    }
    bool ended = false;
    bool woke = sleep_on(fds_.space_ready.get(), socket, ctl_->writer_sleeping, kFrameSleep, has_space,
                         static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)), &ended);
    if (has_space()) {
      learn_from_wait(std::chrono::steady_clock::now() - began);
      return Status::OK();
    }
    if (ended) return Unavailable("connection closed while waiting for space in the shared-memory ring");
    (void)woke;
  }
}

bool ShmRing::read_exact(void *dst, size_t len, int socket, const std::atomic<bool> &stopping, std::string *err) {
  char *out = static_cast<char *>(dst);
  Status status;
  auto has_data = [&] { return readable(&status) > 0 || !status.ok(); };
  while (len > 0) {
    size_t n = read_some(out, len, &status);
    if (!status.ok()) {
      *err = status.message();
      return false;
    }
    out += n;
    len -= n;
    if (len == 0) break;
    const auto began = std::chrono::steady_clock::now();
    if (spin_until(has_data)) {
      learn_from_wait(std::chrono::steady_clock::now() - began);
      continue;
    }
    bool ended = false;
    sleep_on(fds_.data_ready.get(), socket, ctl_->reader_sleeping, kFrameSleep, has_data, -1, &ended);
    learn_from_wait(std::chrono::steady_clock::now() - began);
    if (stopping.load()) {
      *err = "transport stopping";
      return false;
    }
    // The writer publishes everything before it ends its socket: what the
    // ring holds now is all there will be.
    if (ended && !has_data()) {
      *err = "connection closed by peer";
      return false;
    }
  }
  return true;
}

}  // namespace kungfu

namespace kungfu {

bool ShmRing::wait_readable(int socket, const std::atomic<bool> &stopping, std::string *err) {
  // Not readable(): a poller may move the read position between its two
  // loads, which would look like a corrupt ring. Whether the bytes are
  // sound is checked under the reader's lock.
  auto has_data = [&] { return maybe_readable(); };
  const auto began = std::chrono::steady_clock::now();
  // A poller takes what comes while it polls: spinning beside it would only
  // take a core from it (or from the peer that has to answer).
  auto polled = [&] { return ctl_->reader_polled.load(std::memory_order_relaxed) != 0; };
  if (spin_until([&] { return has_data() || polled(); }) && has_data()) {
    learn_from_wait(std::chrono::steady_clock::now() - began);
  } else {
    while (!has_data()) {
      bool ended = false;
      sleep_on(fds_.data_ready.get(), socket, ctl_->reader_sleeping, kIdleSleep, has_data, -1, &ended);
      if (stopping.load()) {
        *err = "transport stopping";
        return false;
      }
      // The writer publishes everything before it ends its socket: what
      // the ring holds now is all there will be.
      if (ended && !has_data()) {
        *err = "connection closed by peer";
        return false;
      }
    }
    if (!polled()) learn_from_wait(std::chrono::steady_clock::now() - began);
  }
  return true;
}

}  // namespace kungfu
