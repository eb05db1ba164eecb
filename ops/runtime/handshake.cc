#include "handshake.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "hmac.h"
#include "socket_io.h"

namespace kungfu {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMagicLen = 8;
constexpr size_t kNonceLen = 16;
constexpr size_t kLenPrefix = 4;
constexpr size_t kMacLen = 32;
// Distinct magics per direction: a node that dials another client (or itself)
// fails on the first message instead of mis-parsing.
constexpr char kServerMagic[kMagicLen + 1] = "KFAUTHS1";
constexpr char kClientMagic[kMagicLen + 1] = "KFAUTHC1";
// Equal lengths, so the two MAC inputs can never be confused for each other.
constexpr char kClientLabel[] = "kungfu-client";
constexpr char kServerLabel[] = "kungfu-server";
constexpr size_t kLabelLen = sizeof(kClientLabel) - 1;
static_assert(sizeof(kClientLabel) == sizeof(kServerLabel), "label lengths");

using Nonce = std::array<uint8_t, kNonceLen>;
using Mac = std::array<uint8_t, kMacLen>;

bool fail(std::string *err, const std::string &msg) {
  if (err) *err = "handshake: " + msg;
  return false;
}

// Ids end up in logs and peer tables; control bytes there would be a log
// injection vector and are never part of a legitimate host:port or path.
bool id_is_clean(const char *id, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

// Every field of the MAC input before `id` has a fixed length, so plain
// concatenation is unambiguous without a length prefix.
Mac compute_mac(const std::string &secret, const char *label,
                const Nonce &first, const Nonce &second, const char *id,
                size_t id_len) {
  std::array<uint8_t, kLabelLen + 2 * kNonceLen + kHandshakeMaxIdLen> buf;
  size_t off = 0;
  std::memcpy(buf.data() + off, label, kLabelLen);
  off += kLabelLen;
  std::memcpy(buf.data() + off, first.data(), kNonceLen);
  off += kNonceLen;
  std::memcpy(buf.data() + off, second.data(), kNonceLen);
  off += kNonceLen;
  if (id_len > 0) std::memcpy(buf.data() + off, id, id_len);
  off += id_len;
  return hmac_sha256(secret, buf.data(), off);
}

// Sets the handshake timeout and puts back whatever the caller had, so the
// connection's later blocking reads are not cut short by our deadline.
class TimeoutGuard {
 public:
  explicit TimeoutGuard(int fd) : fd_(fd) {
    socklen_t len = sizeof(rcv_);
    have_rcv_ = ::getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv_, &len) == 0;
    len = sizeof(snd_);
    have_snd_ = ::getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd_, &len) == 0;
  }
  ~TimeoutGuard() {
    if (have_rcv_ && have_snd_) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &rcv_, sizeof(rcv_));
      ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &snd_, sizeof(snd_));
    } else {
      set_io_timeout(fd_, 0);
    }
  }
  TimeoutGuard(const TimeoutGuard &) = delete;
  TimeoutGuard &operator=(const TimeoutGuard &) = delete;

 private:
  int fd_;
  struct timeval rcv_ = {};
  struct timeval snd_ = {};
  bool have_rcv_ = false;
  bool have_snd_ = false;
};

// SO_RCVTIMEO alone bounds each recv() call, so a peer sending one byte just
// before every timeout could stretch the handshake almost indefinitely. This
// re-arms the timeout with the time left before each call, making the
// deadline cover the whole handshake; that is why recv_all is not used here.
class Deadline {
 public:
  Deadline(int fd, double seconds)
      : fd_(fd),
        end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(seconds))) {}

  bool send(const void *buf, size_t len, const std::string &what,
            std::string *err) {
    if (!arm()) return fail(err, "timed out before sending " + what);
    std::string why;
    if (!send_all(fd_, buf, len, &why)) {
      return fail(err, "sending " + what + ": " + why);
    }
    return true;
  }

  bool recv(void *buf, size_t len, const std::string &what, std::string *err) {
    char *p = static_cast<char *>(buf);
    while (len > 0) {
      if (!arm()) return fail(err, "timed out waiting for " + what);
      ssize_t n = ::recv(fd_, p, len, 0);
      if (n == 0) {
        return fail(err, "connection closed by peer while reading " + what);
      }
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
          continue;  // arm() reports the timeout once the deadline passes.
        }
        return fail(err, "reading " + what + ": " + strerror(errno));
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }

 private:
  bool arm() {
    double left = std::chrono::duration<double>(end_ - Clock::now()).count();
    if (left <= 0) return false;
    // A zero timeval means "block forever" to the kernel, so never round a
    // small remainder down to it.
    set_io_timeout(fd_, left < 1e-3 ? 1e-3 : left);
    return true;
  }

  int fd_;
  Clock::time_point end_;
};

void put_be32(uint8_t *p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

uint32_t get_be32(const uint8_t *p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) |
         (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

bool server_handshake(int fd, const std::string &secret,
                      std::string *client_id, std::string *err,
                      double timeout_seconds) {
  if (secret.empty()) {
    return fail(err, "refusing to authenticate with an empty secret");
  }
  TimeoutGuard restore(fd);
  Deadline io(fd, timeout_seconds);

  Nonce server_nonce;
  if (!random_bytes(server_nonce.data(), server_nonce.size())) {
    return fail(err, "no secure random source available for nonce");
  }
  std::array<uint8_t, kMagicLen + kNonceLen> hello;
  std::memcpy(hello.data(), kServerMagic, kMagicLen);
  std::memcpy(hello.data() + kMagicLen, server_nonce.data(), kNonceLen);
  if (!io.send(hello.data(), hello.size(), "server hello", err)) return false;

  // Magic first, on its own, so a non-kungfu peer gets a clear diagnosis even
  // if it sends only a few bytes before hanging up.
  char magic[kMagicLen];
  if (!io.recv(magic, kMagicLen, "client magic", err)) return false;
  if (std::memcmp(magic, kClientMagic, kMagicLen) != 0) {
    return fail(err, "bad client magic (peer is not a kungfu client or "
                     "speaks another protocol version)");
  }

  std::array<uint8_t, kNonceLen + kLenPrefix> head;
  if (!io.recv(head.data(), head.size(), "client nonce and id length", err)) {
    return false;
  }
  Nonce client_nonce;
  std::memcpy(client_nonce.data(), head.data(), kNonceLen);
  const uint32_t id_len = get_be32(head.data() + kNonceLen);
  // Checked before reading so a hostile length can never size a buffer.
  if (id_len == 0) return fail(err, "client sent an empty id");
  if (id_len > kHandshakeMaxIdLen) {
    return fail(err, "client id length " + std::to_string(id_len) +
                         " exceeds limit of " +
                         std::to_string(kHandshakeMaxIdLen) + " bytes");
  }
  char id[kHandshakeMaxIdLen];
  if (!io.recv(id, id_len, "client id", err)) return false;

  Mac client_mac;
  if (!io.recv(client_mac.data(), client_mac.size(), "client MAC", err)) {
    return false;
  }
  // Verify the MAC before judging the id's contents: an unauthenticated peer
  // learns only "rejected", never which check it tripped.
  const Mac expected = compute_mac(secret, kClientLabel, server_nonce,
                                   client_nonce, id, id_len);
  if (!constant_time_equal(expected.data(), client_mac.data(), kMacLen)) {
    return fail(err, "client MAC mismatch (peer does not know the job secret)");
  }
  if (!id_is_clean(id, id_len)) {
    return fail(err, "client id contains control characters");
  }

  const Mac proof = compute_mac(secret, kServerLabel, client_nonce,
                                server_nonce, id, id_len);
  if (!io.send(proof.data(), proof.size(), "server MAC", err)) return false;

  if (client_id) client_id->assign(id, id_len);
  return true;
}

bool client_handshake(int fd, const std::string &secret,
                      const std::string &self_id, std::string *err,
                      double timeout_seconds) {
  if (secret.empty()) {
    return fail(err, "refusing to authenticate with an empty secret");
  }
  if (self_id.empty() || self_id.size() > kHandshakeMaxIdLen) {
    return fail(err, "own id must be 1.." +
                         std::to_string(kHandshakeMaxIdLen) + " bytes, got " +
                         std::to_string(self_id.size()));
  }
  if (!id_is_clean(self_id.data(), self_id.size())) {
    return fail(err, "own id contains control characters");
  }
  TimeoutGuard restore(fd);
  Deadline io(fd, timeout_seconds);

  char magic[kMagicLen];
  if (!io.recv(magic, kMagicLen, "server magic", err)) return false;
  if (std::memcmp(magic, kServerMagic, kMagicLen) != 0) {
    return fail(err, "bad server magic (peer is not a kungfu server or "
                     "speaks another protocol version)");
  }
  Nonce server_nonce;
  if (!io.recv(server_nonce.data(), kNonceLen, "server nonce", err)) {
    return false;
  }

  Nonce client_nonce;
  if (!random_bytes(client_nonce.data(), client_nonce.size())) {
    return fail(err, "no secure random source available for nonce");
  }
  const Mac mac = compute_mac(secret, kClientLabel, server_nonce, client_nonce,
                              self_id.data(), self_id.size());

  // One buffer, one send: avoids small-packet latency under Nagle.
  std::array<uint8_t, kMagicLen + kNonceLen + kLenPrefix + kHandshakeMaxIdLen +
                          kMacLen>
      msg;
  size_t off = 0;
  std::memcpy(msg.data() + off, kClientMagic, kMagicLen);
  off += kMagicLen;
  std::memcpy(msg.data() + off, client_nonce.data(), kNonceLen);
  off += kNonceLen;
  put_be32(msg.data() + off, static_cast<uint32_t>(self_id.size()));
  off += kLenPrefix;
  std::memcpy(msg.data() + off, self_id.data(), self_id.size());
  off += self_id.size();
  std::memcpy(msg.data() + off, mac.data(), mac.size());
  off += mac.size();
  if (!io.send(msg.data(), off, "client hello", err)) return false;

  Mac server_mac;
  std::string why;
  if (!io.recv(server_mac.data(), server_mac.size(), "server MAC", &why)) {
    // The server signals rejection by hanging up, so EOF here almost always
    // means the secrets differ; say so instead of a bare "closed".
    if (why.find("connection closed") != std::string::npos) {
      return fail(err, "server closed the connection instead of proving its "
                       "identity (it rejected us: wrong secret?)");
    }
    if (err) *err = why;
    return false;
  }
  const Mac expected = compute_mac(secret, kServerLabel, client_nonce,
                                   server_nonce, self_id.data(),
                                   self_id.size());
  if (!constant_time_equal(expected.data(), server_mac.data(), kMacLen)) {
    return fail(err, "server MAC mismatch (peer does not know the job secret)");
  }
  return true;
}

}  // namespace kungfu
