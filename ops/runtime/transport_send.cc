// Sending: each peer's link (queue, sender thread, inline writes), writing
// frames (tagged per segment when authenticated), breaking links, and the
// orderly leave.
#include "transport.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <system_error>

#include "socket_order.h"

namespace kungfu {

namespace {

// Frames up to this size are written inline by the caller when the link is idle:
// they fit in the socket buffer, so the write cannot block for long, and we save
// a thread hand-off on the latency-critical path.
constexpr size_t kInlineSendLimit = 64 * 1024;

}  // namespace

Status Transport::write_frame(int dst, int fd, FrameAuthenticator *auth, SendItem &item, bool wait) {
  if (auth) item.authenticated = true;
  const size_t total = frame_bytes(item);
  const size_t prefix = sizeof(item.header) + item.key.size();
  const uint64_t segments = FrameAuthenticator::segments(item.len);
  constexpr size_t kSeg = FrameAuthenticator::kSegmentLen, kTag = FrameAuthenticator::kTagLen;
  if (item.written == 0) {
    // The whole frame's bytes, once, before its first byte goes out (TSAN only).
    struct iovec whole[3] = {{&item.header, sizeof(item.header)},
                             {const_cast<char *>(item.key.data()), item.key.size()},
                             {const_cast<void *>(item.data), item.len}};
    socket_order_before_send(links_[dst]->order, whole, 3);
  }
  while (item.written < total) {
    // The bytes of the wire still to write: everything, or (authenticated)
    // what is left of the current segment and its tag.
    struct iovec iov[4];
    int n_iov = 0;
    size_t start = 0;  // wire offset of iov[0]
    if (!item.authenticated) {
      iov[n_iov++] = {&item.header, sizeof(item.header)};
      iov[n_iov++] = {const_cast<char *>(item.key.data()), item.key.size()};
      iov[n_iov++] = {const_cast<void *>(item.data), item.len};
    } else {
      const uint64_t seg = item.written < prefix
                               ? 0
                               : std::min<uint64_t>((item.written - prefix) / (kSeg + kTag), segments - 1);
      const size_t seg_off = seg * kSeg;
      const size_t seg_len = std::min(kSeg, item.len - seg_off);
      if (item.signed_segments == seg) {
        // Signed exactly once, in wire order: only the link's one busy writer gets here.
        if (seg == 0) {
          auth->begin_frame(&item.header, sizeof(item.header), item.key.data(), item.key.size());
        } else {
          auth->begin_segment();
        }
        auth->add_payload(static_cast<const char *>(item.data) + seg_off, seg_len);
        item.tag = auth->end_frame();
        ++item.signed_segments;
      }
      if (seg == 0) {
        iov[n_iov++] = {&item.header, sizeof(item.header)};
        iov[n_iov++] = {const_cast<char *>(item.key.data()), item.key.size()};
      } else {
        start = prefix + seg * (kSeg + kTag);
      }
      iov[n_iov++] = {const_cast<char *>(static_cast<const char *>(item.data)) + seg_off, seg_len};
      iov[n_iov++] = {item.tag.data(), kTag};
    }
    // Skip what an earlier, partial write already sent.
    int first = 0;
    size_t skip = item.written - start;
    while (skip >= iov[first].iov_len) skip -= iov[first++].iov_len;
    iov[first].iov_base = static_cast<char *>(iov[first].iov_base) + skip;
    iov[first].iov_len -= skip;
    struct msghdr msg = {};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = n_iov - first;
    ssize_t n;
    {
      SocketCopyUnseen unseen;  // counted as read by socket_order_before_send
      n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait) return Status::OK();  // the rest goes from the sender thread
        // The send timeout (KUNGFU_TIMEOUT) passed with no progress at all.
        return DeadlineExceeded(opt_.cluster.describe(dst) + " read nothing we sent for " +
                                std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s (KUNGFU_TIMEOUT)");
      }
      // No key here: the link keeps this status for every later send, and
      // each op that fails on it adds its own name.
      return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: send failed: " + strerror(errno));
    }
    item.written += static_cast<size_t>(n);
  }
  counters_.add_sent(dst, total);
  return Status::OK();
}

void Transport::write_exclusively(int dst, Link &link, std::unique_lock<std::mutex> &lock, SendItem &item, bool wait) {
  // `busy` keeps frames in order: nobody else writes until we are done, and the
  // lock is not held during the (possibly long) write.
  link.busy = true;
  int fd = link.fd.get();
  FrameAuthenticator *auth = link.auth.get();
  ShmRing *ring = link.ring.get();
  lock.unlock();
  Status s = ring ? write_frame_to_ring(dst, fd, *ring, item, wait) : write_frame(dst, fd, auth, item, wait);
  lock.lock();
  link.busy = false;
  if (s.ok() && item.written < frame_bytes(item)) {
    // The socket is full and the caller may not wait (a TF kernel thread):
    // the sender thread writes the rest, before anything queued after it.
    link.queue.push_front(std::move(item));
    lock.unlock();
    link.cv.notify_all();
    return;
  }
  if (s.ok() && item.header.type == static_cast<uint8_t>(FrameType::kGoodbye)) {
    // Nothing follows a goodbye: end our stream so the peer reads EOF.
    link.goodbye_written = true;
    ::shutdown(fd, SHUT_WR);
  }
  // Someone waits for this write only if a frame queued behind it (the
  // sender thread), we are leaving or stopping (leave(), stop()), or it
  // failed. Waking the idle sender thread after every inline write cost
  // each small frame a futex wake-up and that thread a context switch.
  const bool awaited = !link.queue.empty() || link.closing || stopping_ || !s.ok();
  lock.unlock();
  if (awaited) link.cv.notify_all();
  if (!s.ok()) break_link(dst, s);
  item.on_sent(s);
}

void Transport::send(int dst, FrameHeader header, std::string key, const void *data, size_t len,
                     std::shared_ptr<const void> keepalive, SendCallback on_sent) {
  Link &link = *links_[dst];
  header.key_len = static_cast<uint32_t>(key.size());
  header.payload_len = len;
  header.cluster_version = opt_.cluster.version();
  SendItem item{header, std::move(key), data, len, std::move(keepalive), std::move(on_sent)};
  std::unique_lock<std::mutex> lock(link.mu);
  if (!link.broken.ok() || link.closing) {
    Status s = link.broken.ok() ? Unavailable(opt_.cluster.describe(opt_.self_rank) + " is leaving the cluster")
                                : link.broken;
    lock.unlock();
    item.on_sent(s);
    return;
  }
  if (!link.sender.joinable()) {
    Status s = start_sender(dst, link);
    if (!s.ok()) {
      lock.unlock();
      item.on_sent(s);
      return;
    }
  }
  if (len <= kInlineSendLimit && link.queue.empty() && !link.busy && link.fd.valid()) {
    // Written by the caller without ever blocking it: what does not fit in
    // the socket now is left to the sender thread.
    write_exclusively(dst, link, lock, item, false);
    return;
  }
  link.queue.push_back(std::move(item));
  lock.unlock();
  link.cv.notify_all();
}

Status Transport::start_sender(int dst, Link &link) {
  try {
    link.sender = std::thread([this, dst] { sender_loop(dst); });
  } catch (const std::system_error &e) {
    // No thread to be had (resource limits): this frame fails, the link
    // stays usable, and a later send tries again.
    return Unavailable("cannot send to " + opt_.cluster.describe(dst) +
                       ": cannot start its sender thread: " + e.what());
  }
  ++senders_started_;
  return Status::OK();
}

void Transport::sender_loop(int dst) {
  Link &link = *links_[dst];
  while (true) {
    std::unique_lock<std::mutex> lock(link.mu);
    auto has_work = [&] { return stopping_ || (!link.queue.empty() && !link.busy); };
    while (!has_work()) {
      link.cv.wait(lock);
      if (!has_work()) ++sender_idle_wakeups_;
    }
    if (stopping_) break;
    if (!link.fd.valid() && link.broken.ok()) {
      lock.unlock();
      Fd fd;
      std::unique_ptr<FrameAuthenticator> auth;
      std::unique_ptr<ShmRing> ring;
      bool moved_on = false;
      Status s = connect_to(dst, &fd, &auth, &ring, &moved_on);
      lock.lock();
      if (s.ok()) {
        link.fd = std::move(fd);
        link.auth = std::move(auth);
        link.ring = std::move(ring);
      } else {
        lock.unlock();
        if (moved_on) {
          // Not a crash: the peer switched to a newer cluster version and
          // will never send us anything at ours again.
          peer_departed(dst, s);
          if (!stopping_ && !leaving_) handler_->on_peer_left(dst, s);
        } else {
          break_link(dst, s);
        }
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
    write_exclusively(dst, link, lock, item, true);
  }
  // Shutting down: whatever is still queued fails.
  std::deque<SendItem> left;
  Status why = Unavailable("runtime shutting down");
  {
    std::lock_guard<std::mutex> lock(link.mu);
    left.swap(link.queue);
    if (!link.broken.ok()) why = link.broken;
  }
  for (SendItem &item : left) item.on_sent(why);
}

void Transport::break_link(int dst, const Status &why) {
  std::deque<SendItem> failed;
  {
    std::lock_guard<std::mutex> lock(links_[dst]->mu);
    if (links_[dst]->broken.ok()) links_[dst]->broken = why;
    failed.swap(links_[dst]->queue);
  }
  for (SendItem &item : failed) item.on_sent(why);
  links_[dst]->cv.notify_all();
  if (!stopping_ && !leaving_) handler_->on_peer_lost(dst, why);
}

void Transport::peer_departed(int dst, const Status &why) {
  Link &link = *links_[dst];
  std::deque<SendItem> failed;
  {
    std::lock_guard<std::mutex> lock(link.mu);
    if (link.broken.ok()) link.broken = why;
    failed.swap(link.queue);
    // A write in progress finishes on its own; nothing is written after it.
    if (!link.busy && link.fd.valid()) ::shutdown(link.fd.get(), SHUT_WR);
  }
  link.cv.notify_all();
  for (SendItem &item : failed) item.on_sent(why);
}

int Transport::leave(std::chrono::steady_clock::time_point deadline, uint32_t next_version) {
  leaving_ = true;
  for (int r = 0; r < opt_.cluster.size(); ++r) {
    if (r == opt_.self_rank) continue;
    Link &link = *links_[r];
    std::unique_lock<std::mutex> lock(link.mu);
    // Peers we never opened a stream to are waiting for nothing from us.
    // On a cluster change (next_version > 0) that includes a link still
    // dialing: what it queued belongs to ops of this version, which all
    // fail now, and it may be dialing a dead peer it never talked to (told
    // of a crash by an abort), which would hold up the change until the
    // deadline. stop() cuts the dial short and fails what it queued.
    bool connected = link.fd.valid() || (next_version == 0 && !link.queue.empty());
    if (link.closing || !link.broken.ok() || !connected) continue;
    link.closing = true;
    FrameHeader h;
    h.type = static_cast<uint8_t>(FrameType::kGoodbye);
    h.cluster_version = opt_.cluster.version();
    h.seq = next_version;
    link.queue.push_back(SendItem{h, std::string(), nullptr, 0, nullptr, [](const Status &) {}});
    lock.unlock();
    link.cv.notify_all();
  }
  int cut_short = 0;
  for (int r = 0; r < opt_.cluster.size(); ++r) {
    if (r == opt_.self_rank) continue;
    Link &link = *links_[r];
    std::unique_lock<std::mutex> lock(link.mu);
    auto done_with_peer = [&] { return !link.closing || link.goodbye_written || !link.broken.ok(); };
    if (!link.cv.wait_until(lock, deadline, done_with_peer)) ++cut_short;
  }
  return cut_short;
}

}  // namespace kungfu
