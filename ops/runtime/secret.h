// Key material that wipes itself: the job secret and the keys derived from it
// should not outlive their use in freed heap blocks or dead stack frames,
// where a core dump, a heap read past a buffer's end or a later allocation
// could reveal them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kungfu {

// Overwrites n bytes with zeros in a way the compiler may not drop as a dead
// store (OPENSSL_cleanse), unlike a plain memset before the memory dies.
void secure_wipe(void *p, size_t n);

// A string that holds a secret. Copies are independent; every buffer this
// object owned is wiped before it is released or reused, so moving or
// reassigning leaves nothing behind. Converts implicitly from std::string and
// const char * so a secret can be passed where one is expected; the caller
// remains responsible for its own copy.
class SecretString {
 public:
  SecretString() = default;
  SecretString(const std::string &s) : s_(s) {}  // NOLINT: implicit by design
  SecretString(const char *s) : s_(s) {}         // NOLINT: implicit by design
  SecretString(const SecretString &other) : s_(other.s_) {}
  // Copies rather than steals: a moved-from std::string keeps short contents
  // in its inline buffer, so the source is wiped explicitly instead.
  SecretString(SecretString &&other) noexcept : s_(other.s_) { other.wipe(); }
  SecretString &operator=(const SecretString &other) {
    if (this != &other) {
      wipe();
      s_ = other.s_;
    }
    return *this;
  }
  SecretString &operator=(SecretString &&other) noexcept {
    if (this != &other) {
      wipe();
      s_ = other.s_;
      other.wipe();
    }
    return *this;
  }
  ~SecretString() { wipe(); }

  const char *data() const { return s_.data(); }
  size_t size() const { return s_.size(); }
  bool empty() const { return s_.empty(); }

 private:
  void wipe() {
    if (!s_.empty()) secure_wipe(&s_[0], s_.size());
    s_.clear();
  }

  std::string s_;
};

// The value of environment variable `name` ("" if unset), copied straight
// into a SecretString. (The process environment keeps its own copy.)
SecretString secret_from_env(const char *name);

// A 256-bit key derived from the job secret for one connection (see
// handshake.h); wiped when it goes out of scope.
class SessionKey {
 public:
  static constexpr size_t kSize = 32;

  SessionKey() { bytes_.fill(0); }
  SessionKey(const SessionKey &) = default;
  SessionKey &operator=(const SessionKey &) = default;
  ~SessionKey() { secure_wipe(bytes_.data(), bytes_.size()); }

  uint8_t *data() { return bytes_.data(); }
  const uint8_t *data() const { return bytes_.data(); }
  static constexpr size_t size() { return kSize; }

 private:
  std::array<uint8_t, kSize> bytes_;
};

}  // namespace kungfu
