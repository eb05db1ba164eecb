#include "hmac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "libcrypto.h"

namespace kungfu {

namespace {

// Fetched once: a fetch looks the algorithm up under a global lock, too slow
// to repeat per frame. EVP_MAC objects may be shared between threads.
EVP_MAC *hmac_algorithm() {
  static EVP_MAC *const mac = [] {
    init_libcrypto();
    EVP_MAC *m = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
    if (m == nullptr) crypto_failure("EVP_MAC_fetch(HMAC)");
    return m;
  }();
  return mac;
}

}  // namespace

HmacSha256::HmacSha256(const void *key, size_t key_len) : ctx_(EVP_MAC_CTX_new(hmac_algorithm())) {
  if (ctx_ == nullptr) crypto_failure("EVP_MAC_CTX_new");
  char digest[] = OSSL_DIGEST_NAME_SHA2_256;
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  // OpenSSL rejects a NULL key pointer even with length 0.
  static const unsigned char kEmpty = 0;
  const unsigned char *k = key_len > 0 ? static_cast<const unsigned char *>(key) : &kEmpty;
  if (EVP_MAC_init(ctx_, k, key_len, params) != 1) crypto_failure("EVP_MAC_init");
}

HmacSha256::~HmacSha256() { EVP_MAC_CTX_free(ctx_); }

void HmacSha256::update(const void *data, size_t len) {
  if (len == 0) return;
  if (EVP_MAC_update(ctx_, static_cast<const unsigned char *>(data), len) != 1) {
    crypto_failure("EVP_MAC_update");
  }
}

HmacDigest HmacSha256::finish() {
  HmacDigest out;
  size_t n = 0;
  if (EVP_MAC_final(ctx_, out.data(), &n, out.size()) != 1 || n != out.size()) {
    crypto_failure("EVP_MAC_final");
  }
  // A NULL key re-initialises with the key already set: the precomputed pads
  // are reused, which is what makes per-frame MACs cheap.
  if (EVP_MAC_init(ctx_, nullptr, 0, nullptr) != 1) crypto_failure("EVP_MAC_init (reset)");
  return out;
}

HmacDigest hmac_sha256(const SecretString &key, const void *msg, size_t len) {
  HmacSha256 mac(key);
  mac.update(msg, len);
  return mac.finish();
}

bool constant_time_equal(const uint8_t *a, const uint8_t *b, size_t n) { return n == 0 || CRYPTO_memcmp(a, b, n) == 0; }

bool random_bytes(void *out, size_t n) {
  init_libcrypto();
  unsigned char *p = static_cast<unsigned char *>(out);
  while (n > 0) {
    const int chunk = n > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(n);
    if (RAND_bytes(p, chunk) != 1) return false;
    p += chunk;
    n -= static_cast<size_t>(chunk);
  }
  return true;
}

}  // namespace kungfu
