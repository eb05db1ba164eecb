// A one-way byte stream between two processes of one host through shared
// memory: a single-producer, single-consumer ring in a sealed memfd, with an
// eventfd per direction for wake-ups. It replaces the bytes of a same-host
// connection after its handshake (transport_shm.cc hands the ring's three
// descriptors over the authenticated Unix socket with SCM_RIGHTS, so only a
// peer that proved it holds the job secret can map it). The socket stays open
// beside it: the ring carries no end-of-stream, the socket's end is how each
// side learns that the other crashed or left.
//
// The mapping is shared with another process, so nothing in it is trusted:
// each side keeps its own copy of the capacity and of the position it owns,
// and a position the other side publishes that would make a read or write
// leave the ring is reported as a corrupt ring instead of being used.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "socket_io.h"
#include "status.h"

namespace kungfu {

class ShmRing {
 public:
  // Ring sizes the attaching side accepts (powers of two).
  static constexpr size_t kMinCapacity = size_t(4) << 10;
  static constexpr size_t kMaxCapacity = size_t(256) << 20;
  // The largest ring a transport link uses: a 1 MiB chunk streams without
  // waiting for the reader at every block.
  static constexpr size_t kDefaultCapacity = size_t(2) << 20;
  // The rings one worker writes take at most this much memory together
  // (the pages are taken at creation, so the footprint is flat from the
  // first frame): with many same-host peers each ring is smaller.
  static constexpr size_t kRingBudget = size_t(16) << 20;
  static constexpr size_t kSmallestLinkCapacity = size_t(64) << 10;
  // The capacity of each ring of a worker with `peers` same-host peers:
  // kDefaultCapacity halved until they fit kRingBudget (never below
  // kSmallestLinkCapacity).
  static size_t capacity_for(int peers);

  // The three descriptors that travel to the reader.
  struct Descriptors {
    Fd memory;       // the memfd: control block, then the data
    Fd data_ready;   // eventfd: the writer published bytes while the reader slept
    Fd space_ready;  // eventfd: the reader freed space while the writer slept
  };

  // A new ring of `capacity` bytes (a power of two in [kMinCapacity,
  // kMaxCapacity]), mapped here as its writer, its pages populated.
  static Status create(size_t capacity, std::unique_ptr<ShmRing> *out);
  // Maps a ring another process created, as its reader. InvalidArgument,
  // naming the cause, for anything that is not a well-formed ring: a memfd
  // that may still shrink (its owner could make our reads fault), a size
  // that is not the control block plus a valid capacity, a control block
  // that disagrees with the size, or descriptors that are not eventfds.
  static Status attach(Descriptors fds, std::unique_ptr<ShmRing> *out);

  ~ShmRing();
  ShmRing(const ShmRing &) = delete;
  ShmRing &operator=(const ShmRing &) = delete;

  // Duplicates of the descriptors, for sending to the reader (writer only).
  Status export_descriptors(Descriptors *out) const;

  size_t capacity() const { return capacity_; }

  // ----- writer
  // Copies as much of `iov` (after its first `skip` bytes) as fits now,
  // publishes it and wakes the reader if it sleeps. Never blocks. Returns the
  // bytes written; InvalidArgument through *status when the reader
  // published a position outside the ring.
  size_t write_some(const struct iovec *iov, int iovcnt, size_t skip, Status *status);
  // Waits until some space is free, `socket` (the connection beside the
  // ring) ends, or `timeout_seconds` pass. OK when there is space.
  Status wait_for_space(int socket, double timeout_seconds);

  // ----- reader
  // Copies up to `len` bytes that are already in the ring into `dst` and
  // frees their space. Never blocks. Returns the bytes read; InvalidArgument
  // through *status when the writer published a position outside the ring.
  size_t read_some(void *dst, size_t len, Status *status);
  // Reads exactly `len` bytes: spins briefly, then sleeps until the writer
  // publishes more or `socket` ends. False with *err set when the ring is
  // corrupt, or when the socket ended (or `stopping` became true) with the
  // bytes not all there.
  bool read_exact(void *dst, size_t len, int socket, const std::atomic<bool> &stopping, std::string *err);
  // Bytes published and not yet read (0 and *status set when corrupt).
  size_t readable(Status *status) const;

  // ----- reader, shared with a thread that polls the ring (Transport's
  // RingReader): the reading side is then used by several threads, one at a
  // time under the RingReader's lock, except wait_readable() and the
  // polling marks, which take no lock.
  // Copies `len` published bytes from `offset` past the read position
  // without consuming them. False when they are not all published yet (or,
  // with *status set, when the ring is corrupt).
  bool peek(size_t offset, void *dst, size_t len, Status *status) const;
  // The next `len` bytes in place, when they are published and do not wrap
  // around the ring's end (null otherwise); consumes nothing. A reduction
  // reads them from here instead of from a copy.
  const char *view(size_t len, Status *status) const;
  // Frees the next `len` bytes (they must be readable) for the writer.
  void consume(size_t len);
  // Bytes read since the ring began (names a frame's place in the stream).
  uint64_t position() const { return own_pos_.load(std::memory_order_relaxed); }
  // Whether the writer published past the read position (without the
  // checks of readable(): safe while a poller moves the position).
  bool maybe_readable() const;
  // Waits until bytes may be readable (spinning first only while no other
  // thread polls the ring: that one takes them), `socket` ends or
  // `stopping` is set. False with *err set when nothing is readable and
  // will be (the socket ended, or stopping).
  bool wait_readable(int socket, const std::atomic<bool> &stopping, std::string *err);
  // Another thread polls the ring from now on: the writer need not wake the
  // sleeping reader for what it publishes (the poller sees it first).
  void begin_polling();
  // That thread stopped polling: bytes it left in the ring (or that came
  // meanwhile) wake the sleeping reader, so none are left unread.
  void end_polling();
  // Wakes the sleeping reader now: a poller leaves it a frame it does not take.
  void wake_reader();

 private:
  struct Control;
  ShmRing() = default;
  Status map(bool writer);
  // Waits on `efd` and `socket`: true when `efd` fired (or `ready` says
  // so), false when the socket ended or the deadline passed (*ended says which).
  // `how`: the value published in `sleeping` meanwhile (shm_ring.cc).
  bool sleep_on(int efd, int socket, std::atomic<uint32_t> &sleeping, uint32_t how, const std::function<bool()> &ready,
                int timeout_ms, bool *ended);

  Descriptors fds_;
  size_t capacity_ = 0;  // our own copy: the control block's may change under us
  size_t map_len_ = 0;
  void *map_ = nullptr;
  Control *ctl_ = nullptr;
  char *data_ = nullptr;
  // The position this side owns, kept privately (the shared one is only
  // published for the other side to read). Atomic: a reader's position is
  // read by wait_readable() while a poller may move it.
  std::atomic<uint64_t> own_pos_{0};
};

}  // namespace kungfu
