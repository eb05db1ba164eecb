// What every user of OpenSSL's libcrypto in the runtime shares: one
// initialisation with the runtime's settings, and one way to stop when a
// primitive that cannot fail in a sane process does.
#pragma once

namespace kungfu {

// Initialises libcrypto once (thread-safe; later calls return at once). No
// atexit cleanup: connection threads may still authenticate while the
// process exits, and OPENSSL_cleanup would free state under them. No system
// openssl.cnf either: the runtime needs only the built-in default provider,
// and a host's configuration should not change the protocol.
void init_libcrypto();

// Prints what failed with OpenSSL's queued error and aborts. For calls that
// fail only when memory is exhausted or libcrypto itself is broken: a MAC
// that silently came out wrong would be worse than stopping.
[[noreturn]] void crypto_failure(const char *what);

}  // namespace kungfu
