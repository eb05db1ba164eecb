// Per-frame authentication of one connection's traffic, keyed by the session
// key its handshake derived (handshake.h).
//
// Each frame's tag is AES-256-GMAC: AES-256-GCM under the session key with
// the frame as additional authenticated data and no plaintext,
//   nonce (96 bits) = direction u32 | sequence u64
//   AAD             = header_len u32 | header | key_len u32 | key | payload
// (integers big-endian), 16 bytes. GCM authenticates the AAD's length too,
// and header and key carry their own, so frames that split their bytes
// differently can never share a tag input. GMAC rather than HMAC-SHA256
// because it runs on the CPU's AES and carry-less multiply instructions at
// several times HMAC's speed (make bench-frame-auth).
//
// GCM is broken if one key ever tags two messages under one nonce (the
// hash key leaks, and with it forgeries). Why that cannot happen here:
//  * the key is fresh per connection: it is derived from two 128-bit random
//    nonces, one chosen by each side, so no two connections share it (not
//    even a replayed handshake, whose other side's nonce is new), and
//    nothing but this class uses it;
//  * within a connection, the nonce's first word says which way the frame
//    flows, and only one FrameAuthenticator signs each direction (the
//    sender's); its sequence number grows by one with every tag it emits and
//    would abort rather than wrap (2^64 frames);
//  * a frame begun and abandoned emits no tag, so the next frame taking its
//    sequence number still makes it one tag per nonce;
//  * the receiver computes tags under the same nonces, but reveals only
//    whether a frame matched, and the first mismatch ends the stream (the
//    connection is closed), so a forger gets one guess per connection.
//
// A payload longer than kSegmentLen is tagged in segments of kSegmentLen
// bytes (the last one shorter), so that a receiver can verify and use the
// first segments while later ones are still on the wire (streaming) instead
// of holding the whole frame first. On the wire:
//   header | key | segment 0 | tag 0 | segment 1 | tag 1 | ... | tag n-1
// with n = max(1, ceil(payload_len / kSegmentLen)). Tag 0 is the frame's
// tag as above over header, key and segment 0 only; tag i > 0 has
// AAD = segment i alone (begin_segment). Every tag takes the next sequence
// number, so segments can no more be dropped, replayed or reordered than
// frames, and the header that tag 0 covers fixes where the frame ends.
//
// The sequence number counts the tags of one direction of one connection
// from 0, and each side keeps its own count rather than reading one off the
// wire, so a frame that is replayed, dropped, reordered or moved to the
// other direction fails to verify. Once a frame fails, every later one fails
// too: the stream cannot be trusted to resync and the connection must be
// closed.
//
// The payload can be fed in pieces, so a receiver sees a tag only after the
// bytes it covers: it must not act on them until verify_frame() returned
// true.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "secret.h"

// EVP_CIPHER_CTX from <openssl/types.h>; declared here so that callers do not
// include OpenSSL headers.
struct evp_cipher_ctx_st;

namespace kungfu {

// Which way the frames flow, from the handshake's point of view; part of
// every nonce so the two directions of a connection can never be confused.
enum class FrameDirection : uint8_t {
  kClientToServer = 1,
  kServerToClient = 2,
};

// KUNGFU_AUTHENTICATE_FRAMES: which connections authenticate their frames.
enum class FrameAuthPolicy : uint8_t {
  kAcrossHosts = 0,  // unset (the default): TCP connections between two hosts only
  kNever = 1,        // "0"
  kAlways = 2,       // "1"
};

// Whether a connection under `policy` authenticates its frames, given
// whether it joins two different hosts (socket_io.h: connects_two_hosts).
bool authenticates_frames(FrameAuthPolicy policy, bool across_hosts);
// "KUNGFU_AUTHENTICATE_FRAMES=1", or "KUNGFU_AUTHENTICATE_FRAMES unset
// (authenticated across hosts only)", for error messages.
std::string describe_policy(FrameAuthPolicy policy);

class FrameAuthenticator {
 public:
  static constexpr size_t kTagLen = 16;
  static constexpr size_t kNonceLen = 12;
  // The mailbox's streaming block (mailbox.h: kStreamBlock): a verified
  // segment is consumed while it is still in cache.
  static constexpr size_t kSegmentLen = size_t(128) << 10;
  using Tag = std::array<uint8_t, kTagLen>;

  // How many segments (and tags) a payload of `payload_len` bytes takes.
  static uint64_t segments(uint64_t payload_len) { return payload_len == 0 ? 1 : (payload_len - 1) / kSegmentLen + 1; }

  // Keys one AES-256-GCM context for the whole connection direction: the
  // key schedule and hash key are computed here once, and each frame only
  // sets its nonce (no per-frame allocation).
  FrameAuthenticator(const SessionKey &key, FrameDirection direction);
  ~FrameAuthenticator();
  FrameAuthenticator(const FrameAuthenticator &) = delete;
  FrameAuthenticator &operator=(const FrameAuthenticator &) = delete;

  // Starts the next frame: its header and key. A frame that was begun but not
  // ended is abandoned (and its sequence number is not used).
  void begin_frame(const void *header, size_t header_len, const void *key, size_t key_len);
  // Starts the next segment (after the first) of the current frame's payload;
  // like begin_frame, abandons anything unfinished.
  void begin_segment();
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
  void add_aad(const void *data, size_t len);
  Tag finish_frame();

  evp_cipher_ctx_st *ctx_;
  const FrameDirection direction_;
  uint64_t seq_ = 0;
  bool in_frame_ = false;
  bool failed_ = false;
};

}  // namespace kungfu
