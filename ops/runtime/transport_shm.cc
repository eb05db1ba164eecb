// A same-host link's shared-memory ring: created and handed to the peer
// right after the handshake (shm_handover.h), then written instead of the
// socket. The accepting side reads it in transport_receive.cc.
#include <poll.h>

#include <cstdio>

#include "shm_handover.h"
#include "socket_order.h"
#include "transport.h"

namespace kungfu {

Status Transport::offer_shm_ring(int dst, int fd, std::unique_ptr<ShmRing> *ring) {
  std::unique_ptr<ShmRing> made;
  Status s = ShmRing::create(ShmRing::capacity_for(opt_.cluster.size() - 1), &made);
  if (!s.ok()) {
    // Nothing is sent yet: the socket carries the frames, as with KUNGFU_SHM=0.
    if (!shm_unavailable_logged_.exchange(true)) {
      fprintf(stderr, "kungfu: %s cannot use shared memory (%s); same-host frames go through Unix sockets\n",
              opt_.cluster.describe(opt_.self_rank).c_str(), s.message().c_str());
    }
    return Status::OK();
  }
  s = send_shm_ring(fd, *made, opt_.cluster.version());
  if (!s.ok()) return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: " + s.message());
  *ring = std::move(made);
  ++shm_;
  return Status::OK();
}

Status Transport::write_frame_to_ring(int dst, int fd, ShmRing &ring, SendItem &item, bool wait) {
  struct iovec iov[3] = {{&item.header, sizeof(item.header)},
                         {const_cast<char *>(item.key.data()), item.key.size()},
                         {const_cast<void *>(item.data), item.len}};
  const size_t total = frame_bytes(item);
  if (item.written == 0) {
    socket_order_before_send(links_[dst]->order, iov, 3);
    // A write into the ring of a process that is gone would succeed: look
    // at the socket first, so a send to a dead peer fails as it does on a
    // socket. The peer writes nothing there: anything readable is its end.
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: the peer closed it");
    }
  }
  while (item.written < total) {
    Status corrupt;
    {
      // Counted as read by socket_order_before_send, like a socket's kernel
      // copy: seen here, after that release, the copy would look racy with
      // the reply's write into the same buffer (TSAN only).
      SocketCopyUnseen unseen;
      item.written += ring.write_some(iov, 3, item.written, &corrupt);
    }
    if (!corrupt.ok()) {
      return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: " + corrupt.message());
    }
    if (item.written == total) break;
    if (!wait) return Status::OK();  // the rest goes from the sender thread
    Status s = ring.wait_for_space(fd, opt_.timeout_seconds);
    if (s.code() == Code::kDeadlineExceeded) {
      return DeadlineExceeded(opt_.cluster.describe(dst) + " read nothing we sent for " +
                              std::to_string(static_cast<int>(opt_.timeout_seconds)) + "s (KUNGFU_TIMEOUT)");
    }
    if (!s.ok()) return Unavailable("connection to " + opt_.cluster.describe(dst) + " broke: " + s.message());
  }
  counters_.add_sent(dst, total);
  return Status::OK();
}

}  // namespace kungfu
