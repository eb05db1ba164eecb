// HMAC-SHA256 and the few other primitives the handshake and frame
// authentication need, from OpenSSL's libcrypto. libkungfu_tf.so links a
// private copy of it (static, symbols hidden): TensorFlow's framework library
// exports BoringSSL under the same names (HMAC, EVP_sha256, RAND_bytes...),
// and a dynamic -lcrypto would have ours bound to those (see setup.py).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "secret.h"

// EVP_MAC_CTX from <openssl/types.h>; declared here so that callers do not
// include OpenSSL headers.
struct evp_mac_ctx_st;

namespace kungfu {

constexpr size_t kHmacSha256Len = 32;
using HmacDigest = std::array<uint8_t, kHmacSha256Len>;

// An HMAC-SHA256 keyed once and reused for many messages: the key schedule
// (the hashed inner and outer pads) is computed in the constructor, so each
// message costs only its own hashing. Not thread-safe; one per thread or
// connection direction. The key is wiped by OpenSSL when the object dies.
class HmacSha256 {
 public:
  HmacSha256(const void *key, size_t key_len);
  explicit HmacSha256(const SecretString &key) : HmacSha256(key.data(), key.size()) {}
  explicit HmacSha256(const SessionKey &key) : HmacSha256(key.data(), key.size()) {}
  ~HmacSha256();
  HmacSha256(const HmacSha256 &) = delete;
  HmacSha256 &operator=(const HmacSha256 &) = delete;

  // Appends to the message being authenticated.
  void update(const void *data, size_t len);
  // Returns the MAC of everything passed to update() since construction or
  // the previous finish(), and starts a new message under the same key.
  HmacDigest finish();

 private:
  evp_mac_ctx_st *ctx_;
};

// One-shot HMAC-SHA256(key, msg).
HmacDigest hmac_sha256(const SecretString &key, const void *msg, size_t len);

// Runtime does not depend on the contents, only on n, so comparing a received
// MAC leaks nothing about how many leading bytes an attacker guessed right.
bool constant_time_equal(const uint8_t *a, const uint8_t *b, size_t n);

// Fills `out` from OpenSSL's CSPRNG (seeded from the kernel). Returns false
// only if no secure source is available; callers must then fail rather than
// use predictable bytes.
bool random_bytes(void *out, size_t n);

}  // namespace kungfu
