// Mutual challenge-response authentication of a freshly connected stream
// socket, run before any application data is read from it.
//
// Wire protocol (all integers big-endian):
//   server -> client  "KFAUTHS1" | server_nonce[16]
//   client -> server  "KFAUTHC1" | client_nonce[16] | id_len u32 | id[id_len]
//                     | HMAC(secret, "kungfu-client" | server_nonce
//                                    | client_nonce | id)
//   server -> client  HMAC(secret, "kungfu-server" | client_nonce
//                                    | server_nonce | id)
// Both nonces are fresh per connection so neither proof can be replayed, and
// the two labels differ so one side's proof can never be reflected back as the
// other's. On any failure the server sends nothing more; the caller is
// expected to close the socket.
//
// This authenticates the peer, it does not encrypt or integrity-protect the
// traffic that follows.
#pragma once

#include <cstddef>
#include <string>

namespace kungfu {

constexpr size_t kHandshakeMaxIdLen = 256;
constexpr double kHandshakeTimeoutSeconds = 10.0;

// Run by the side that accepted the connection. On success returns true and
// sets *client_id to the identity string the client claimed (e.g.
// "127.0.0.1:10001"), proven by knowledge of `secret`. `timeout_seconds` bounds
// the whole handshake (not each read, so a peer dribbling bytes cannot hold
// us); a non-positive value fails immediately.
bool server_handshake(int fd, const std::string &secret,
                      std::string *client_id, std::string *err,
                      double timeout_seconds = kHandshakeTimeoutSeconds);

// Run by the side that connected. `self_id` is our identity string. Verifies
// the server knows the secret too (mutual).
bool client_handshake(int fd, const std::string &secret,
                      const std::string &self_id, std::string *err,
                      double timeout_seconds = kHandshakeTimeoutSeconds);

}  // namespace kungfu
