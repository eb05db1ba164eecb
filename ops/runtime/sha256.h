// SHA-256 (FIPS 180-4), self-contained so the runtime needs no crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kungfu {

class Sha256 {
 public:
  Sha256() { reset(); }

  void update(const void *data, size_t len);
  // Returns the digest and resets the object, so it can hash a new message.
  std::array<uint8_t, 32> finish();

 private:
  void reset();
  void compress(const uint8_t *block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_;
  size_t buf_len_;
  // Message length in bytes; FIPS 180-4 caps messages below 2^64 bits, so a
  // 64-bit byte counter is more than enough.
  uint64_t total_len_;
};

std::array<uint8_t, 32> sha256(const void *data, size_t len);

}  // namespace kungfu
