#include "secret.h"

#include <openssl/crypto.h>

#include <cstdlib>

namespace kungfu {

void secure_wipe(void *p, size_t n) {
  if (n > 0) OPENSSL_cleanse(p, n);
}

SecretString secret_from_env(const char *name) {
  const char *v = std::getenv(name);
  return SecretString(v ? v : "");
}

}  // namespace kungfu
