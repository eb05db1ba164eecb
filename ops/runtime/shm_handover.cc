#include "shm_handover.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "socket_io.h"

namespace kungfu {

namespace {

constexpr int kRingDescriptors = 3;

}  // namespace

Status send_shm_ring(int fd, const ShmRing &ring, uint32_t cluster_version) {
  ShmRing::Descriptors d;
  Status s = ring.export_descriptors(&d);
  if (!s.ok()) return s;
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kShmRing);
  h.cluster_version = cluster_version;
  int fds[kRingDescriptors] = {d.memory.get(), d.data_ready.get(), d.space_ready.get()};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  struct iovec iov = {&h, sizeof(h)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ssize_t n;
  do {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Unavailable(std::string("sending the shared-memory ring failed: ") + strerror(errno));
  // The descriptors went with the first byte; the rest of the header is plain data.
  std::string err;
  if (static_cast<size_t>(n) < sizeof(h) && !send_all(fd, reinterpret_cast<char *>(&h) + n, sizeof(h) - n, &err)) {
    return Unavailable("sending the shared-memory ring failed: " + err);
  }
  return Status::OK();
}

bool recv_first_header(int fd, FrameHeader *header, ShmRing::Descriptors *fds, std::string *why) {
  // Room for one more than a ring needs, so that too many is seen as such.
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kRingDescriptors + 1))];
  struct iovec iov = {header, sizeof(*header)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    *why = std::string("recv failed: ") + strerror(errno);
    return false;
  }
  if (n == 0) {
    *why = "connection closed by peer";
    return false;
  }
  // Take ownership of whatever arrived first, so every descriptor is closed
  // on every way out.
  std::vector<Fd> got;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int d;
      std::memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      got.emplace_back(d);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    *why = "a peer sent more descriptors than a shared-memory ring has";
    return false;
  }
  if (!got.empty() && got.size() != kRingDescriptors) {
    *why = "a peer sent " + std::to_string(got.size()) + " descriptors; a shared-memory ring has " +
           std::to_string(kRingDescriptors);
    return false;
  }
  if (!got.empty()) {
    fds->memory = std::move(got[0]);
    fds->data_ready = std::move(got[1]);
    fds->space_ready = std::move(got[2]);
  }
  if (static_cast<size_t>(n) < sizeof(*header)) {
    return recv_all(fd, reinterpret_cast<char *>(header) + n, sizeof(*header) - n, why);
  }
  return true;
}

Status accept_shm_ring(const FrameHeader &header, ShmRing::Descriptors fds, std::unique_ptr<ShmRing> *ring) {
  if (header.key_len != 0 || header.payload_len != 0) {
    return InvalidArgument("shared-memory ring frame with key_len " + std::to_string(header.key_len) +
                           " and payload_len " + std::to_string(header.payload_len) + " (expected none)");
  }
  if (!fds.memory.valid()) return InvalidArgument("shared-memory ring frame without the ring's descriptors");
  return ShmRing::attach(std::move(fds), ring);
}

}  // namespace kungfu
