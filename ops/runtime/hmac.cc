#include "hmac.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include "sha256.h"
#include "socket_io.h"

namespace kungfu {

namespace {

constexpr size_t kBlockSize = 64;  // SHA-256 block size, the "B" of RFC 2104.

// A plain memset before the buffer dies is a dead store the optimiser may
// drop; writing through volatile keeps key material from lingering on the
// stack.
void secure_zero(void *p, size_t n) {
  volatile uint8_t *v = static_cast<volatile uint8_t *>(p);
  while (n--) *v++ = 0;
}

bool read_urandom(uint8_t *p, size_t n) {
  Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  while (n > 0) {
    ssize_t r = ::read(fd.get(), p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

std::array<uint8_t, 32> hmac_sha256(const std::string &key, const void *msg,
                                    size_t len) {
  // RFC 2104: keys longer than the block are replaced by their hash; shorter
  // keys are zero-padded to the block size.
  uint8_t k[kBlockSize] = {};
  if (key.size() > kBlockSize) {
    std::array<uint8_t, 32> kh = sha256(key.data(), key.size());
    for (size_t i = 0; i < kh.size(); ++i) k[i] = kh[i];
    secure_zero(kh.data(), kh.size());
  } else {
    for (size_t i = 0; i < key.size(); ++i) k[i] = uint8_t(key[i]);
  }

  uint8_t pad[kBlockSize];
  for (size_t i = 0; i < kBlockSize; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, kBlockSize);
  inner.update(msg, len);
  std::array<uint8_t, 32> inner_digest = inner.finish();

  for (size_t i = 0; i < kBlockSize; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, kBlockSize);
  outer.update(inner_digest.data(), inner_digest.size());

  secure_zero(k, sizeof(k));
  secure_zero(pad, sizeof(pad));
  return outer.finish();
}

bool constant_time_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  // Volatile stops the compiler from turning the accumulation into an
  // early-exit comparison.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = uint8_t(diff | (a[i] ^ b[i]));
  return diff == 0;
}

bool random_bytes(void *out, size_t n) {
  uint8_t *p = static_cast<uint8_t *>(out);
  while (n > 0) {
    ssize_t r = ::getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      // Old kernels or seccomp sandboxes may lack the syscall.
      if (errno == ENOSYS || errno == EPERM) return read_urandom(p, n);
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace kungfu
