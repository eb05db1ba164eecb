#include "libcrypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>

#include <cstdio>
#include <cstdlib>

// TensorFlow's headers ship BoringSSL's <openssl/...> (not on our include
// path today); compiling against them while linking OpenSSL would break the
// ABI silently, so refuse to.
#if defined(OPENSSL_IS_BORINGSSL) || !defined(OPENSSL_VERSION_MAJOR) || OPENSSL_VERSION_MAJOR < 3
#error "ops/runtime needs OpenSSL >= 3 headers (Debian: libssl-dev)"
#endif

namespace kungfu {

void crypto_failure(const char *what) {
  char buf[256] = "no OpenSSL error queued";
  unsigned long e = ERR_get_error();
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  std::fprintf(stderr, "kungfu: fatal: OpenSSL %s failed: %s\n", what, buf);
  std::abort();
}

void init_libcrypto() {
  static const bool done = [] {
    if (OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT | OPENSSL_INIT_NO_LOAD_CONFIG, nullptr) != 1) {
      crypto_failure("initialisation");
    }
    return true;
  }();
  (void)done;
}

}  // namespace kungfu
