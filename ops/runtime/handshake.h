// Mutual challenge-response authentication of a freshly connected stream
// socket, run before any application data is read from it. It also binds the
// connection to one run of one job, and derives a key for that connection.
//
// Wire protocol (all integers big-endian; ctx = version u32 | flags u32 |
// job_len u32 | job_id[job_len], the sender's own job identity; flags bit 0:
// frames on this connection are authenticated, bits 1-2: the sender's
// KUNGFU_AUTHENTICATE_FRAMES (FrameAuthPolicy), bit 3: the sender sees the
// connection as joining two hosts; only bit 0 must agree, the others let a
// mismatch be explained):
//   server -> client  "KFAUTHS3" | server_nonce[16] | ctx
//   client -> server  "KFAUTHC3" | client_nonce[16] | ctx | id_len u32 | id
//                     | HMAC(secret, "kungfu-client" | server_nonce
//                                    | client_nonce | ctx | id)
//   server -> client  HMAC(secret, "kungfu-server" | client_nonce
//                                    | server_nonce | ctx | id)
//   session key     = HMAC(secret, "kungfu-session" | server_nonce
//                                    | client_nonce | ctx | id)
// Both nonces are fresh per connection so neither proof can be replayed, and
// the labels differ so one side's proof can never be reflected back as the
// other's. Because the MACs cover the job id and the cluster version, a
// worker of an earlier run (or of another cluster version) that still holds
// the same secret is rejected; the identities travel in clear as well, but
// only so that each side can say *why* it rejects. On any failure the server
// sends nothing more; the caller is expected to close the socket.
//
// This authenticates the peer; it does not encrypt the traffic that follows.
// The session key lets the caller authenticate that traffic (frame_auth.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "frame_auth.h"
#include "secret.h"

namespace kungfu {

constexpr size_t kHandshakeMaxIdLen = 256;
constexpr size_t kHandshakeMaxJobIdLen = 128;
constexpr double kHandshakeTimeoutSeconds = 10.0;

// Which run of which job, at which cluster version, a connection belongs to.
// Both ends must present the same one. job_id is printable, at most
// kHandshakeMaxJobIdLen bytes (the launcher's KUNGFU_JOB_ID).
struct HandshakeIdentity {
  std::string job_id;
  uint32_t cluster_version = 0;
  // Whether every frame on the connection carries a tag (frame_auth.h); two
  // ends that disagree fail the handshake rather than misread each other,
  // and are told both sides' reasons:
  bool authenticate_frames = false;
  FrameAuthPolicy frame_auth_policy = FrameAuthPolicy::kAcrossHosts;  // the setting that decided it
  bool across_hosts = false;  // how this side sees the connection (socket_io.h: connects_two_hosts)
};

// Two ends of the same job at different cluster versions: during a resize
// peers switch a few milliseconds apart, so this is an expected, transient
// outcome rather than a stranger. The handshake still fails (a connection
// belongs to exactly one version) and says which side is ahead: a peer
// behind us will catch up (retry), a peer ahead of us has left our version
// for good.
enum class VersionSkew { kNone, kPeerBehind, kPeerAhead };

// Run by the side that accepted the connection. On success returns true, sets
// *client_id to the identity string the client claimed (e.g.
// "127.0.0.1:10001"), proven by knowledge of `secret`, and *session_key (if
// not null) to the key derived for this connection. `timeout_seconds` bounds
// the whole handshake (not each read, so a peer dribbling bytes cannot hold
// us); a non-positive value fails immediately. *skew (if not null) is set
// when the client proved the secret and the job id but is at another cluster
// version.
bool server_handshake(int fd, const SecretString &secret, const HandshakeIdentity &self, std::string *client_id,
                      SessionKey *session_key, std::string *err, double timeout_seconds = kHandshakeTimeoutSeconds,
                      VersionSkew *skew = nullptr);

// Run by the side that connected. `self_id` is our identity string. Verifies
// the server knows the secret and belongs to the same job and cluster version
// (mutual). On success sets *session_key (if not null) to the same key as the
// server's. *skew (if not null) is set when the server claims our job id at
// another cluster version, even if the connection broke after its hello.
// *cut_before_hello (if not null) is set when the server hung up (end of
// stream, reset) before its hello arrived: what a worker does whose
// transport is being replaced in a cluster change, so the caller may retry.
bool client_handshake(int fd, const SecretString &secret, const HandshakeIdentity &self, const std::string &self_id,
                      SessionKey *session_key, std::string *err, double timeout_seconds = kHandshakeTimeoutSeconds,
                      VersionSkew *skew = nullptr, bool *cut_before_hello = nullptr);

}  // namespace kungfu
