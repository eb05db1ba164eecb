#include "frame_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "libcrypto.h"

namespace kungfu {

namespace {

void put_be(uint8_t *p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    p[i] = uint8_t(v);
    v >>= 8;
  }
}

// Calling the steps out of order is a bug in the caller; a tag computed over
// a different byte sequence than the peer's would only surface as a spurious
// "tampered frame" much later.
void require(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "kungfu: fatal: FrameAuthenticator misuse: %s\n", what);
    std::abort();
  }
}

// Fetched once: a fetch looks the algorithm up under a global lock. EVP_CIPHER
// objects may be shared between threads.
EVP_CIPHER *aes_256_gcm() {
  static EVP_CIPHER *const cipher = [] {
    init_libcrypto();
    EVP_CIPHER *c = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
    if (c == nullptr) crypto_failure("EVP_CIPHER_fetch(AES-256-GCM)");
    return c;
  }();
  return cipher;
}

}  // namespace

bool authenticates_frames(FrameAuthPolicy policy, bool across_hosts) {
  switch (policy) {
    case FrameAuthPolicy::kAlways: return true;
    case FrameAuthPolicy::kNever: return false;
    case FrameAuthPolicy::kAcrossHosts: return across_hosts;
  }
  return true;
}

std::string describe_policy(FrameAuthPolicy policy) {
  switch (policy) {
    case FrameAuthPolicy::kAlways: return "KUNGFU_AUTHENTICATE_FRAMES=1";
    case FrameAuthPolicy::kNever: return "KUNGFU_AUTHENTICATE_FRAMES=0";
    case FrameAuthPolicy::kAcrossHosts: break;
  }
  return "KUNGFU_AUTHENTICATE_FRAMES unset (authenticated across hosts only)";
}

FrameAuthenticator::FrameAuthenticator(const SessionKey &key, FrameDirection direction)
    : ctx_(EVP_CIPHER_CTX_new()), direction_(direction) {
  if (ctx_ == nullptr) crypto_failure("EVP_CIPHER_CTX_new");
  static_assert(SessionKey::kSize == 32, "AES-256 takes the 32-byte session key as it is");
  // The default GCM nonce length is the 96 bits used here.
  if (EVP_EncryptInit_ex(ctx_, aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
    crypto_failure("EVP_EncryptInit_ex(AES-256-GCM)");
  }
}

// Wipes the key schedule.
FrameAuthenticator::~FrameAuthenticator() { EVP_CIPHER_CTX_free(ctx_); }

void FrameAuthenticator::add_aad(const void *data, size_t len) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  while (len > 0) {
    const int chunk = len > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(len);
    int out_len = 0;
    if (EVP_EncryptUpdate(ctx_, nullptr, &out_len, p, chunk) != 1) crypto_failure("EVP_EncryptUpdate (AAD)");
    p += chunk;
    len -= static_cast<size_t>(chunk);
  }
}

void FrameAuthenticator::begin_segment() {
  // Never wraps in practice (2^64 tags); if it did, nonces would repeat.
  require(seq_ != UINT64_MAX, "frame sequence number exhausted");
  uint8_t nonce[kNonceLen];
  put_be(nonce, static_cast<uint8_t>(direction_), 4);
  put_be(nonce + 4, seq_, 8);
  // A new nonce alone: the key schedule stays, GCM's hash state restarts (so
  // an unfinished frame is dropped with it).
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1) crypto_failure("EVP_EncryptInit_ex (nonce)");
  in_frame_ = true;
}

void FrameAuthenticator::begin_frame(const void *header, size_t header_len, const void *key, size_t key_len) {
  begin_segment();
  uint8_t len[4];
  put_be(len, header_len, 4);
  add_aad(len, sizeof(len));
  add_aad(header, header_len);
  put_be(len, key_len, 4);
  add_aad(len, sizeof(len));
  add_aad(key, key_len);
}

void FrameAuthenticator::add_payload(const void *data, size_t len) {
  require(in_frame_, "add_payload outside a frame");
  add_aad(data, len);
}

FrameAuthenticator::Tag FrameAuthenticator::finish_frame() {
  require(in_frame_, "a frame ended without begin_frame");
  unsigned char no_output[16];
  int out_len = 0;
  Tag tag;
  if (EVP_EncryptFinal_ex(ctx_, no_output, &out_len) != 1) crypto_failure("EVP_EncryptFinal_ex");
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(tag.size()), tag.data()) != 1) {
    crypto_failure("EVP_CTRL_AEAD_GET_TAG");
  }
  in_frame_ = false;
  ++seq_;
  return tag;
}

FrameAuthenticator::Tag FrameAuthenticator::end_frame() { return finish_frame(); }

bool FrameAuthenticator::verify_frame(const uint8_t *received) {
  Tag expected = finish_frame();
  if (CRYPTO_memcmp(expected.data(), received, kTagLen) != 0) failed_ = true;
  return !failed_;
}

FrameAuthenticator::Tag FrameAuthenticator::sign(const void *header, size_t header_len, const void *key, size_t key_len,
                                                 const void *payload, size_t payload_len) {
  begin_frame(header, header_len, key, key_len);
  add_payload(payload, payload_len);
  return end_frame();
}

bool FrameAuthenticator::verify(const void *header, size_t header_len, const void *key, size_t key_len,
                                const void *payload, size_t payload_len, const uint8_t *received) {
  begin_frame(header, header_len, key, key_len);
  add_payload(payload, payload_len);
  return verify_frame(received);
}

}  // namespace kungfu
