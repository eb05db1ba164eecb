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
constexpr size_t kU32 = 4;
constexpr size_t kMacLen = kHmacSha256Len;
// Distinct magics per direction: a node that dials another client (or itself)
// fails on the first message instead of mis-parsing. The digit is the
// protocol version (2: the MACs cover the job identity).
constexpr char kServerMagic[kMagicLen + 1] = "KFAUTHS3";
constexpr char kClientMagic[kMagicLen + 1] = "KFAUTHC3";
// No label is a prefix of another, so the MAC inputs of the three can never
// be confused for each other.
constexpr char kClientLabel[] = "kungfu-client";
constexpr char kServerLabel[] = "kungfu-server";
constexpr char kSessionLabel[] = "kungfu-session";

using Nonce = std::array<uint8_t, kNonceLen>;

bool fail(std::string *err, const std::string &msg) {
  if (err) *err = "handshake: " + msg;
  return false;
}

// Ids end up in logs and peer tables; control bytes there would be a log
// injection vector and are never part of a legitimate host:port, path or job id.
bool is_clean(const char *s, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

void put_be32(uint8_t *p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

uint32_t get_be32(const uint8_t *p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// "job 'x' at cluster version 3", quoting a peer's unverified claim safely.
std::string describe(const HandshakeIdentity &who) {
  std::string job = is_clean(who.job_id.data(), who.job_id.size()) ? "'" + who.job_id + "'" : "(unprintable)";
  return "job " + job + " at cluster version " + std::to_string(who.cluster_version);
}

// "authenticates frames on this connection (KUNGFU_AUTHENTICATE_FRAMES unset
// (authenticated across hosts only), and the connection joins two hosts)".
std::string describe_frame_auth(const HandshakeIdentity &who) {
  std::string out = who.authenticate_frames ? "authenticates frames on this connection ("
                                            : "does not authenticate frames on this connection (";
  out += describe_policy(who.frame_auth_policy);
  if (who.frame_auth_policy == FrameAuthPolicy::kAcrossHosts) {
    out += who.across_hosts ? ", and it sees the connection as joining two hosts"
                            : ", and it sees the connection as within one host";
  }
  return out + ")";
}

bool same_job(const HandshakeIdentity &a, const HandshakeIdentity &b) {
  return a.job_id == b.job_id && a.cluster_version == b.cluster_version;
}

// How `peer` stands to `self` when both belong to one run of the job.
VersionSkew skew_of(const HandshakeIdentity &peer, const HandshakeIdentity &self) {
  if (peer.job_id != self.job_id || peer.cluster_version == self.cluster_version) return VersionSkew::kNone;
  return peer.cluster_version < self.cluster_version ? VersionSkew::kPeerBehind : VersionSkew::kPeerAhead;
}

// Both ends of a connection must frame it alike.
std::string frame_auth_mismatch(const std::string &peer, const HandshakeIdentity &theirs,
                                const HandshakeIdentity &ours) {
  return "frame authentication differs: " + peer + " " + describe_frame_auth(theirs) + ", this worker " +
         describe_frame_auth(ours) + "; set KUNGFU_AUTHENTICATE_FRAMES alike on every host";
}

// Bits of the ctx flags field.
constexpr uint32_t kFlagAuthenticateFrames = 1;
constexpr int kPolicyShift = 1;  // bits 1-2: FrameAuthPolicy
constexpr uint32_t kPolicyMask = 3;
constexpr uint32_t kFlagAcrossHosts = 8;

// The ctx field of the wire format: version u32 | flags u32 | job_len u32 | job_id.
std::string encode_identity(const HandshakeIdentity &who) {
  std::string out(3 * kU32, '\0');
  uint8_t *p = reinterpret_cast<uint8_t *>(&out[0]);
  put_be32(p, who.cluster_version);
  const uint32_t flags = (who.authenticate_frames ? kFlagAuthenticateFrames : 0) |
                         (static_cast<uint32_t>(who.frame_auth_policy) << kPolicyShift) |
                         (who.across_hosts ? kFlagAcrossHosts : 0);
  put_be32(p + kU32, flags);
  put_be32(p + 2 * kU32, static_cast<uint32_t>(who.job_id.size()));
  return out + who.job_id;
}

// Every field before `id` has a fixed length or a length prefix, so plain
// concatenation is unambiguous.
HmacDigest compute_mac(const SecretString &secret, const char *label, const Nonce &first, const Nonce &second,
                       const HandshakeIdentity &who, const std::string &id) {
  HmacSha256 mac(secret);
  mac.update(label, std::strlen(label));
  mac.update(first.data(), first.size());
  mac.update(second.data(), second.size());
  const std::string ctx = encode_identity(who);
  mac.update(ctx.data(), ctx.size());
  mac.update(id.data(), id.size());
  return mac.finish();
}

void derive_session_key(const SecretString &secret, const Nonce &server_nonce, const Nonce &client_nonce,
                        const HandshakeIdentity &who, const std::string &client_id, SessionKey *out) {
  if (out == nullptr) return;
  HmacDigest k = compute_mac(secret, kSessionLabel, server_nonce, client_nonce, who, client_id);
  static_assert(SessionKey::kSize == kMacLen, "session key is one HMAC-SHA256 output");
  std::memcpy(out->data(), k.data(), k.size());
  secure_wipe(k.data(), k.size());
}

bool check_own_identity(const HandshakeIdentity &self, std::string *err) {
  if (self.job_id.size() > kHandshakeMaxJobIdLen) {
    return fail(err, "own job id must be at most " + std::to_string(kHandshakeMaxJobIdLen) + " bytes, got " +
                         std::to_string(self.job_id.size()));
  }
  if (!is_clean(self.job_id.data(), self.job_id.size())) {
    return fail(err, "own job id contains control characters");
  }
  return true;
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
        end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}

  bool send(const void *buf, size_t len, const std::string &what, std::string *err) {
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
        hung_up_ = true;
        return fail(err, "connection closed by peer while reading " + what);
      }
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
          continue;  // arm() reports the timeout once the deadline passes.
        }
        hung_up_ = errno == ECONNRESET;
        return fail(err, "reading " + what + ": " + strerror(errno));
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }

  bool recv_u32(uint32_t *v, const std::string &what, std::string *err) {
    uint8_t b[kU32];
    if (!recv(b, sizeof(b), what, err)) return false;
    *v = get_be32(b);
    return true;
  }

  // A length-prefixed string of at most `limit` bytes; the length is checked
  // before reading so a hostile one can never size a buffer.
  bool recv_string(size_t limit, bool allow_empty, const std::string &what, std::string *out, std::string *err) {
    uint32_t len = 0;
    if (!recv_u32(&len, what + " length", err)) return false;
    if (len == 0 && !allow_empty) return fail(err, "peer sent an empty " + what);
    if (len > limit) {
      return fail(err,
                  what + " length " + std::to_string(len) + " exceeds limit of " + std::to_string(limit) + " bytes");
    }
    out->assign(len, '\0');
    return len == 0 || recv(&(*out)[0], len, what, err);
  }

  // ctx: version u32 | flags u32 | job_len u32 | job_id.
  bool recv_identity(const std::string &whose, HandshakeIdentity *out, std::string *err) {
    uint32_t flags = 0;
    bool ok = recv_u32(&out->cluster_version, whose + " cluster version", err) &&
              recv_u32(&flags, whose + " flags", err) &&
              recv_string(kHandshakeMaxJobIdLen, true, whose + " job id", &out->job_id, err);
    out->authenticate_frames = (flags & kFlagAuthenticateFrames) != 0;
    // Only explains a mismatch; an unknown value reads as the default.
    const uint32_t policy = (flags >> kPolicyShift) & kPolicyMask;
    out->frame_auth_policy = policy <= static_cast<uint32_t>(FrameAuthPolicy::kAlways)
                                 ? static_cast<FrameAuthPolicy>(policy)
                                 : FrameAuthPolicy::kAcrossHosts;
    out->across_hosts = (flags & kFlagAcrossHosts) != 0;
    return ok;
  }

  // The last read failed because the peer closed or reset the connection
  // (not a timeout, not bad data).
  bool hung_up() const { return hung_up_; }

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
  bool hung_up_ = false;
};

}  // namespace

bool server_handshake(int fd, const SecretString &secret, const HandshakeIdentity &self, std::string *client_id,
                      SessionKey *session_key, std::string *err, double timeout_seconds, VersionSkew *skew) {
  if (skew) *skew = VersionSkew::kNone;
  if (secret.empty()) {
    return fail(err, "refusing to authenticate with an empty secret");
  }
  if (!check_own_identity(self, err)) return false;
  TimeoutGuard restore(fd);
  Deadline io(fd, timeout_seconds);

  Nonce server_nonce;
  if (!random_bytes(server_nonce.data(), server_nonce.size())) {
    return fail(err, "no secure random source available for nonce");
  }
  const std::string hello = std::string(kServerMagic, kMagicLen) +
                            std::string(reinterpret_cast<const char *>(server_nonce.data()), kNonceLen) +
                            encode_identity(self);
  if (!io.send(hello.data(), hello.size(), "server hello", err)) return false;

  // Magic first, on its own, so a non-kungfu peer gets a clear diagnosis even
  // if it sends only a few bytes before hanging up.
  char magic[kMagicLen];
  if (!io.recv(magic, kMagicLen, "client magic", err)) return false;
  if (std::memcmp(magic, kClientMagic, kMagicLen) != 0) {
    return fail(err, "bad client magic (peer is not a kungfu client or speaks another protocol version)");
  }
  Nonce client_nonce;
  if (!io.recv(client_nonce.data(), kNonceLen, "client nonce", err)) return false;
  HandshakeIdentity claimed;
  if (!io.recv_identity("client", &claimed, err)) return false;
  std::string id;
  if (!io.recv_string(kHandshakeMaxIdLen, false, "client id", &id, err)) return false;
  HmacDigest client_mac;
  if (!io.recv(client_mac.data(), client_mac.size(), "client MAC", err)) return false;

  // Verify the MAC before judging the claims: an unauthenticated peer learns
  // only "rejected", never which check it tripped, and an authenticated one
  // gets its mismatch named precisely.
  const HmacDigest expected = compute_mac(secret, kClientLabel, server_nonce, client_nonce, claimed, id);
  if (!constant_time_equal(expected.data(), client_mac.data(), kMacLen)) {
    return fail(err, "client MAC mismatch (peer does not know the job secret)");
  }
  if (!is_clean(id.data(), id.size())) {
    return fail(err, "client id contains control characters");
  }
  if (skew_of(claimed, self) != VersionSkew::kNone) {
    if (skew) *skew = skew_of(claimed, self);
    return fail(err, "client " + id + " is at cluster version " + std::to_string(claimed.cluster_version) +
                         ", this worker at " + std::to_string(self.cluster_version) + " (switching versions)");
  }
  if (!same_job(claimed, self)) {
    return fail(err, "client " + id + " knows the secret but belongs to " + describe(claimed) + "; this worker is " +
                         describe(self) + " (a worker left over from another run?)");
  }
  if (claimed.authenticate_frames != self.authenticate_frames) {
    return fail(err, frame_auth_mismatch("client " + id, claimed, self));
  }

  const HmacDigest proof = compute_mac(secret, kServerLabel, client_nonce, server_nonce, self, id);
  if (!io.send(proof.data(), proof.size(), "server MAC", err)) return false;

  derive_session_key(secret, server_nonce, client_nonce, self, id, session_key);
  if (client_id) *client_id = id;
  return true;
}

bool client_handshake(int fd, const SecretString &secret, const HandshakeIdentity &self, const std::string &self_id,
                      SessionKey *session_key, std::string *err, double timeout_seconds, VersionSkew *skew,
                      bool *cut_before_hello) {
  if (skew) *skew = VersionSkew::kNone;
  if (cut_before_hello) *cut_before_hello = false;
  if (secret.empty()) {
    return fail(err, "refusing to authenticate with an empty secret");
  }
  if (self_id.empty() || self_id.size() > kHandshakeMaxIdLen) {
    return fail(err, "own id must be 1.." + std::to_string(kHandshakeMaxIdLen) + " bytes, got " +
                         std::to_string(self_id.size()));
  }
  if (!is_clean(self_id.data(), self_id.size())) {
    return fail(err, "own id contains control characters");
  }
  if (!check_own_identity(self, err)) return false;
  TimeoutGuard restore(fd);
  Deadline io(fd, timeout_seconds);

  // A hang-up before the server's hello is whole is reported as such.
  auto cut = [&] {
    if (cut_before_hello) *cut_before_hello = io.hung_up();
    return false;
  };
  char magic[kMagicLen];
  if (!io.recv(magic, kMagicLen, "server magic", err)) return cut();
  if (std::memcmp(magic, kServerMagic, kMagicLen) != 0) {
    return fail(err, "bad server magic (peer is not a kungfu server or speaks another protocol version)");
  }
  Nonce server_nonce;
  if (!io.recv(server_nonce.data(), kNonceLen, "server nonce", err)) return cut();
  HandshakeIdentity server_claims;
  if (!io.recv_identity("server", &server_claims, err)) return cut();
  // Known before our hello goes out: a server at another version that hangs
  // up on it (its transport is being replaced) is still that skew.
  const VersionSkew server_skew = skew_of(server_claims, self);

  Nonce client_nonce;
  if (!random_bytes(client_nonce.data(), client_nonce.size())) {
    return fail(err, "no secure random source available for nonce");
  }
  const HmacDigest mac = compute_mac(secret, kClientLabel, server_nonce, client_nonce, self, self_id);

  // One buffer, one send: avoids small-packet latency under Nagle.
  std::string msg = std::string(kClientMagic, kMagicLen) +
                    std::string(reinterpret_cast<const char *>(client_nonce.data()), kNonceLen) + encode_identity(self);
  std::string id_len(kU32, '\0');
  put_be32(reinterpret_cast<uint8_t *>(&id_len[0]), static_cast<uint32_t>(self_id.size()));
  msg += id_len + self_id + std::string(reinterpret_cast<const char *>(mac.data()), mac.size());
  if (!io.send(msg.data(), msg.size(), "client hello", err)) {
    if (skew) *skew = server_skew;
    return false;
  }

  // Sent our hello even so: the server then names the mismatch in its own log.
  if (server_skew != VersionSkew::kNone) {
    if (skew) *skew = server_skew;
    return fail(err, "the server is at cluster version " + std::to_string(server_claims.cluster_version) +
                         ", this worker at " + std::to_string(self.cluster_version));
  }
  if (!same_job(server_claims, self)) {
    return fail(err, "server belongs to " + describe(server_claims) + "; this worker is " + describe(self) +
                         " (a worker left over from another run?)");
  }
  if (server_claims.authenticate_frames != self.authenticate_frames) {
    return fail(err, frame_auth_mismatch("the server", server_claims, self));
  }

  HmacDigest server_mac;
  std::string why;
  if (!io.recv(server_mac.data(), server_mac.size(), "server MAC", &why)) {
    // The server signals rejection by hanging up, so EOF here almost always
    // means the secrets differ; say so instead of a bare "closed".
    if (why.find("connection closed") != std::string::npos) {
      return fail(err, "server closed the connection instead of proving its identity (it rejected us: wrong secret?)");
    }
    if (err) *err = why;
    return false;
  }
  const HmacDigest expected = compute_mac(secret, kServerLabel, client_nonce, server_nonce, self, self_id);
  if (!constant_time_equal(expected.data(), server_mac.data(), kMacLen)) {
    return fail(err, "server MAC mismatch (peer does not know the job secret)");
  }
  derive_session_key(secret, server_nonce, client_nonce, self, self_id, session_key);
  return true;
}

}  // namespace kungfu
