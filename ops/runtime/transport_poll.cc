// A waiting caller reads same-host peers' rings itself (Transport::poll_rings):
// a small all-reduce's answer is in the ring within a microsecond of being
// written, while handing it through the connection's receiving thread costs
// that thread's wake-up and the caller's, each tens of microseconds on a VM.
// The receiving thread stays the owner of everything unusual: a poller takes
// only whole frames that pass the same checks, and leaves the rest in order.
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>

#include "socket_order.h"
#include "transport.h"

namespace kungfu {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

constexpr int kTurnsPerClockLook = 64;

}  // namespace

void Transport::add_ring_reader(const std::shared_ptr<RingReader> &r) {
  std::lock_guard<std::mutex> lock(rings_mu_);
  rings_.push_back(r);
}

void Transport::remove_ring_reader(const RingReader *r) {
  std::lock_guard<std::mutex> lock(rings_mu_);
  rings_.erase(std::remove_if(rings_.begin(), rings_.end(), [r](const auto &x) { return x.get() == r; }), rings_.end());
}

bool Transport::poll_rings(const std::function<bool()> &done, std::chrono::nanoseconds budget) {
  if (done()) return true;
  std::vector<std::shared_ptr<RingReader>> rings;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    rings = rings_;
  }
  if (rings.empty() || budget.count() <= 0) return done();
  for (auto &r : rings) r->ring->begin_polling();
  std::vector<uint64_t> left_at(rings.size(), UINT64_MAX);
  const auto until = std::chrono::steady_clock::now() + budget;
  bool finished = false;
  for (int turn = 1;; ++turn) {
    bool took = false;
    for (size_t i = 0; i < rings.size(); ++i) took = poll_ring(*rings[i], &left_at[i]) || took;
    if ((finished = done())) break;
    if (!took) cpu_relax();
    if (turn % kTurnsPerClockLook == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  // What arrived meanwhile and was not taken is the receiving threads' again.
  for (auto &r : rings) r->ring->end_polling();
  return finished || done();
}

bool Transport::poll_ring(RingReader &r, uint64_t *left_at) {
  std::unique_lock<std::mutex> lock(r.mu, std::try_to_lock);
  // Busy: the receiving thread (or another poller) is in a frame.
  if (!lock.owns_lock() || r.closed || !r.broken.empty() || stopping_) return false;
  ShmRing &ring = *r.ring;
  // The receiving thread sleeps while we poll (no writer wakes it): a frame
  // we leave must, once.
  auto leave = [&] {
    if (*left_at != ring.position()) {
      *left_at = ring.position();
      ring.wake_reader();
    }
    return false;
  };
  Status status;
  FrameHeader h;
  if (!ring.peek(0, &h, sizeof(h), &status)) {
    // Not even a header yet; a corrupt ring is the receiving thread's to report.
    return status.ok() ? false : leave();
  }
  const size_t avail = ring.readable(&status);
  // Frames a poller does not take: the receiving thread handles them (and
  // reports what is wrong with them) exactly as it always has.
  const bool usual = check_frame_header(h).ok() && h.type != static_cast<uint8_t>(FrameType::kShmRing) &&
                     h.type != static_cast<uint8_t>(FrameType::kGoodbye) && h.cluster_version == opt_.cluster.version();
  const bool whole = status.ok() && avail - sizeof(h) >= h.key_len && avail - sizeof(h) - h.key_len >= h.payload_len;
  if (!usual || !whole) return leave();
  ring.consume(sizeof(h));
  socket_order_after_header(r.order);
  std::string key(h.key_len, '\0');
  ring.read_some(key.data(), key.size(), &status);
  counters_.add_received(r.src, sizeof(h) + h.key_len + h.payload_len);
  uint64_t consumed = 0;
  std::string why;
  PartialReader read = [&](void *dst, size_t len) {
    if (consumed + len > h.payload_len) {
      why = "handler read past the end of a frame";
      return false;
    }
    // The frame is whole in the ring: this never waits.
    Status s;
    const size_t n = ring.read_some(dst, len, &s);
    consumed += n;
    if (!s.ok() || n != len) {
      why = s.ok() ? "shared-memory ring: a whole frame came out short" : s.message();
      return false;
    }
    return true;
  };
  const bool handled = handler_->on_frame(r.src, h, std::move(key), read);
  if (handled && why.empty()) {
    ring.consume(h.payload_len - consumed);  // whatever of the payload nobody wanted
    polled_frames_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // The receiving thread ends the connection with this reason; the
  // shutdown ends its wait on the ring.
  r.broken = why.empty() ? "a frame of type " + std::to_string(h.type) + " could not be read whole" : why;
  ::shutdown(r.fd, SHUT_RDWR);
  return true;
}

}  // namespace kungfu
