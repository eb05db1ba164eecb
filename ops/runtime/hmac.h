// HMAC-SHA256 (RFC 2104) and the small primitives the handshake needs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kungfu {

std::array<uint8_t, 32> hmac_sha256(const std::string &key, const void *msg,
                                    size_t len);

// Runtime does not depend on the contents, only on n, so comparing a received
// MAC leaks nothing about how many leading bytes an attacker guessed right.
bool constant_time_equal(const uint8_t *a, const uint8_t *b, size_t n);

// Fills `out` from the kernel CSPRNG (getrandom(2), falling back to
// /dev/urandom). Returns false only if no secure source is available; callers
// must then fail rather than use predictable bytes.
bool random_bytes(void *out, size_t n);

}  // namespace kungfu
