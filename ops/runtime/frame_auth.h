// Per-frame authentication of one connection's traffic, keyed by the session
// key its handshake derived (handshake.h).
//
// Each frame's tag is HMAC-SHA256(session key, direction u8 | sequence u64 |
// header_len u32 | header | key_len u32 | key | payload | payload_len u64),
// truncated to 16 bytes (128 bits: a forger must guess it; nothing is gained
// from the birthday bound). The sequence number counts the frames of one
// direction of one connection from 0, and each side keeps its own count
// rather than reading one off the wire, so a frame that is replayed, dropped,
// reordered or moved to the other direction fails to verify. Once a frame
// fails, every later one fails too: the stream cannot be trusted to resync and
// the connection must be closed.
//
// The payload can be fed in pieces (the transport receives straight into the
// consumer's buffer), so a receiver sees the tag only after the payload: it
// must not act on a frame's contents until verify_frame() returned true.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "hmac.h"
#include "secret.h"

namespace kungfu {

// Which way the frames flow, from the handshake's point of view; part of
// every tag so the two directions of a connection can never be confused.
enum class FrameDirection : uint8_t {
  kClientToServer = 1,
  kServerToClient = 2,
};

class FrameAuthenticator {
 public:
  static constexpr size_t kTagLen = 16;
  using Tag = std::array<uint8_t, kTagLen>;

  FrameAuthenticator(const SessionKey &key, FrameDirection direction);
  FrameAuthenticator(const FrameAuthenticator &) = delete;
  FrameAuthenticator &operator=(const FrameAuthenticator &) = delete;

  // Starts the next frame: its header and key. A frame that was begun but not
  // ended is abandoned (and its sequence number is not used).
  void begin_frame(const void *header, size_t header_len, const void *key, size_t key_len);
  // Feeds the next `len` bytes of the current frame's payload.
  void add_payload(const void *data, size_t len);
  // Sender: returns the current frame's tag and moves to the next sequence
  // number.
  Tag end_frame();
  // Receiver: whether `received` is the current frame's tag (compared in
  // constant time); moves to the next sequence number either way. False for
  // every frame after the first that failed.
  bool verify_frame(const uint8_t *received);

  // Whole-frame shorthands.
  Tag sign(const void *header, size_t header_len, const void *key, size_t key_len, const void *payload,
           size_t payload_len);
  bool verify(const void *header, size_t header_len, const void *key, size_t key_len, const void *payload,
              size_t payload_len, const uint8_t *received);

  // The sequence number of the next frame to begin (frames ended so far).
  uint64_t next_sequence() const { return seq_; }
  bool failed() const { return failed_; }

 private:
  HmacDigest finish_frame();

  HmacSha256 mac_;
  const FrameDirection direction_;
  uint64_t seq_ = 0;
  uint64_t payload_bytes_ = 0;
  bool in_frame_ = false;
  bool failed_ = false;
};

}  // namespace kungfu
