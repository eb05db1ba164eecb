// libFuzzer target: the reader of a shared-memory ring (shm_ring.h) facing a
// hostile writer. The writer process owns the mapping as much as we do, so
// the input plays it: a script of steps that write bytes through the ring
// honestly, or scribble over the shared control block (the published
// positions, the magic, the capacity) between our reads. The reader then
// reads frames as Transport::serve_connection does (header,
// check_frame_header, key, payload in pieces) until the ring reports an
// error or runs dry. Nothing it reads may go outside the mapping (ASan),
// and a dry ring must end the read (the writer's socket is closed), not hang.
// Steps with bit 2 of their op set read the way a polling caller does
// instead (Transport::poll_ring): peek at the header, take the frame only
// when it is whole, read the payload in place (view) or copied, consume.
//
// Script: repeated [op byte][8-byte little-endian argument][bytes...]:
//   op % 4 == 0: write the next (argument % 8192) input bytes into the ring
//   op % 4 == 1: store the argument as the published tail (writer position)
//   op % 4 == 2: store the argument as the published head (reader position)
//   op % 4 == 3: store the argument over the magic and capacity words
// After each step the reader consumes frames while whole ones are there.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "frame.h"
#include "shm_ring.h"

namespace {

constexpr size_t kCapacity = kungfu::ShmRing::kMinCapacity;
// Where the control block keeps them (shm_ring.cc): magic, capacity, then
// the writer's position at byte 64 and the reader's at byte 128.
constexpr size_t kTailOffset = 64, kHeadOffset = 128;

std::atomic<bool> never_stopping{false};

// Reads whole frames while the ring holds them; false once the ring failed.
bool read_frames(kungfu::ShmRing &ring, int socket) {
  std::string err;
  std::vector<char> payload;
  while (true) {
    kungfu::Status s;
    if (ring.readable(&s) < sizeof(kungfu::FrameHeader)) return s.ok();
    kungfu::FrameHeader h;
    if (!ring.read_exact(&h, sizeof(h), socket, never_stopping, &err)) return false;
    if (!kungfu::check_frame_header(h).ok()) return false;  // the transport drops the connection
    std::string key(h.key_len, '\0');
    if (!ring.read_exact(key.data(), key.size(), socket, never_stopping, &err)) return false;
    // The payload in pieces, as a handler reads it; the writer's socket is
    // closed, so a payload longer than the ring holds ends the read.
    uint64_t left = h.payload_len;
    while (left > 0) {
      payload.resize(static_cast<size_t>(std::min<uint64_t>(left, 1000)));
      if (!ring.read_exact(payload.data(), payload.size(), socket, never_stopping, &err)) return false;
      left -= payload.size();
    }
  }
}

// Takes whole frames as Transport::poll_ring does; false once the ring failed.
bool poll_frames(kungfu::ShmRing &ring) {
  std::vector<char> piece(1000);
  while (true) {
    kungfu::Status s;
    if (!ring.maybe_readable()) return true;
    kungfu::FrameHeader h;
    if (!ring.peek(0, &h, sizeof(h), &s)) return s.ok();
    const size_t avail = ring.readable(&s);
    if (!s.ok()) return false;
    if (!kungfu::check_frame_header(h).ok()) return false;
    if (avail - sizeof(h) < h.key_len || avail - sizeof(h) - h.key_len < h.payload_len) return true;  // not whole
    ring.consume(sizeof(h));
    std::string key(h.key_len, '\0');
    if (ring.read_some(key.data(), key.size(), &s) != key.size() || !s.ok()) return false;
    uint64_t left = h.payload_len;
    volatile char sink = 0;
    if (const char *in_place = ring.view(static_cast<size_t>(left), &s)) {
      for (uint64_t i = 0; i < left; ++i) sink = sink ^ in_place[i];  // every byte must be mapped (ASan)
      ring.consume(static_cast<size_t>(left));
      continue;
    }
    if (!s.ok()) return false;
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, piece.size()));
      if (ring.read_some(piece.data(), n, &s) != n || !s.ok()) return false;
      left -= n;
    }
  }
}

uint64_t take_u64(const uint8_t *&data, size_t &size) {
  uint64_t v = 0;
  size_t n = std::min<size_t>(8, size);
  std::memcpy(&v, data, n);
  data += n;
  size -= n;
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::unique_ptr<kungfu::ShmRing> writer, reader;
  if (!kungfu::ShmRing::create(kCapacity, &writer).ok()) return 0;
  kungfu::ShmRing::Descriptors d;
  if (!writer->export_descriptors(&d).ok()) return 0;
  // The hostile writer's own view of the control block.
  void *ctl = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, d.memory.get(), 0);
  if (ctl == MAP_FAILED) return 0;
  if (!kungfu::ShmRing::attach(std::move(d), &reader).ok()) {
    ::munmap(ctl, 4096);
    return 0;
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    ::munmap(ctl, 4096);
    return 0;
  }
  ::close(sv[0]);  // the writer's end: a dry ring ends every read at once
  char *words = static_cast<char *>(ctl);
  bool alive = true;
  while (alive && size > 0) {
    uint8_t op = *data++;
    --size;
    uint64_t arg = take_u64(data, size);
    switch (op % 4) {
      case 0: {
        size_t n = std::min<size_t>(arg % 8192, size);
        struct iovec iov = {const_cast<uint8_t *>(data), n};
        kungfu::Status s;
        writer->write_some(&iov, 1, 0, &s);  // what fits; a scribbled head may refuse it
        data += n;
        size -= n;
        break;
      }
      case 1: std::memcpy(words + kTailOffset, &arg, 8); break;
      case 2: std::memcpy(words + kHeadOffset, &arg, 8); break;
      default: std::memcpy(words + (arg & 1) * 8, &arg, 8); break;
    }
    alive = (op & 4) ? poll_frames(*reader) : read_frames(*reader, sv[1]);
  }
  ::close(sv[1]);
  ::munmap(ctl, 4096);
  return 0;
}
