// Handing a shared-memory ring (shm_ring.h) from the side that dials a
// same-host peer to the side that accepted it: after the handshake, the
// dialer sends one kShmRing frame over the authenticated Unix socket with
// the ring's descriptors attached (SCM_RIGHTS); every later frame of that
// connection travels through the ring.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "frame.h"
#include "shm_ring.h"
#include "status.h"

namespace kungfu {

// Dialer: sends the kShmRing frame (at `cluster_version`) with `ring`'s
// descriptors on the connected Unix socket `fd`.
Status send_shm_ring(int fd, const ShmRing &ring, uint32_t cluster_version);

// Acceptor: reads the first frame header of a connection into *header like
// recv_all(), also taking descriptors that came with it into *fds (none
// came: they stay invalid). False with *why set when the read failed, or
// when descriptors came that do not fit (more than a ring's three, or
// truncated).
bool recv_first_header(int fd, FrameHeader *header, ShmRing::Descriptors *fds, std::string *why);

// Acceptor: the ring a kShmRing frame hands over, after checking that the
// frame is one (no key, no payload, three descriptors) and that the ring
// is well formed. InvalidArgument naming the cause otherwise.
Status accept_shm_ring(const FrameHeader &header, ShmRing::Descriptors fds, std::unique_ptr<ShmRing> *ring);

}  // namespace kungfu
