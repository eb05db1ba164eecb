#include "hmac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

// TensorFlow's headers ship BoringSSL's <openssl/...> (not on our include
// path today); compiling against them while linking OpenSSL would break the
// ABI silently, so refuse to.
#if defined(OPENSSL_IS_BORINGSSL) || !defined(OPENSSL_VERSION_MAJOR) || OPENSSL_VERSION_MAJOR < 3
#error "ops/runtime needs OpenSSL >= 3 headers (Debian: libssl-dev)"
#endif

namespace kungfu {

namespace {

// These calls fail only when memory is exhausted or libcrypto itself is
// broken; a MAC that silently came out wrong would be worse than stopping.
[[noreturn]] void crypto_failure(const char *what) {
  char buf[256] = "no OpenSSL error queued";
  unsigned long e = ERR_get_error();
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  std::fprintf(stderr, "kungfu: fatal: OpenSSL %s failed: %s\n", what, buf);
  std::abort();
}

// Fetched once: a fetch looks the algorithm up under a global lock, too slow
// to repeat per frame. EVP_MAC objects may be shared between threads.
EVP_MAC *hmac_algorithm() {
  static EVP_MAC *const mac = [] {
    // No atexit cleanup: connection threads may still authenticate while the
    // process exits, and OPENSSL_cleanup would free state under them. No
    // system openssl.cnf either: the runtime needs only the built-in default
    // provider, and a host's configuration should not change the protocol.
    if (OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT | OPENSSL_INIT_NO_LOAD_CONFIG, nullptr) != 1) {
      crypto_failure("initialisation");
    }
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

bool constant_time_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  return n == 0 || CRYPTO_memcmp(a, b, n) == 0;
}

bool random_bytes(void *out, size_t n) {
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
