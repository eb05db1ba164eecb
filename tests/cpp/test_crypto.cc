// Tests for HMAC-SHA256 (OpenSSL), key material, the connection handshake
// and per-frame authentication (AES-256-GMAC).
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "frame_auth.h"
#include "handshake.h"
#include "hmac.h"
#include "runtime.h"
#include "secret.h"
#include "socket_io.h"

namespace {

int g_passed = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "%d passed, 1 failed\n", g_passed);                      \
      std::exit(1);                                                                 \
    }                                                                               \
    ++g_passed;                                                                     \
  } while (0)

// Substring match keeps the tests tied to the meaning of an error rather than
// its exact wording.
#define CHECK_ERR(err, needle)                                                                                 \
  do {                                                                                                         \
    if ((err).find(needle) == std::string::npos) {                                                             \
      std::fprintf(stderr, "%s:%d: error \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, (err).c_str(), \
                   needle);                                                                                    \
      std::fprintf(stderr, "%d passed, 1 failed\n", g_passed);                                                 \
      std::exit(1);                                                                                            \
    }                                                                                                          \
    ++g_passed;                                                                                                \
  } while (0)

using kungfu::Fd;

std::string hex(const std::array<uint8_t, 32> &d) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string hmac_hex(const std::string &key, const std::string &msg) {
  return hex(kungfu::hmac_sha256(key, msg.data(), msg.size()));
}

void test_hmac() {
  // RFC 4231 test cases 1-4, 6, 7.
  CHECK(hmac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += char(i);
  CHECK(hmac_hex(key4, std::string(50, '\xcd')) == "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  const std::string key131(131, '\xaa');
  CHECK(hmac_hex(key131, "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(key131,
                 "This is a test using a larger than block-size key and a "
                 "larger than block-size data. The key needs to be hashed "
                 "before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // References from Python's hmac module.
  CHECK(hmac_hex("", "") == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  const std::string million(1000000, 'a');
  const std::string million_hex = "6e7005164aec3b1035635787fbdd6b729031b2eb39915ec3bd249d52731cc7a5";
  CHECK(hmac_hex("key", million) == million_hex);

  // Odd-sized updates, and the same object reused for later messages (its
  // key schedule is kept across finish()).
  kungfu::HmacSha256 h("key", 3);
  for (int round = 0; round < 2; ++round) {
    size_t off = 0, step = 1;
    while (off < million.size()) {
      size_t n = std::min(step, million.size() - off);
      h.update(million.data() + off, n);
      off += n;
      step = step * 7 % 257 + 1;
    }
    CHECK(hex(h.finish()) == million_hex);
  }
  h.update(nullptr, 0);
  CHECK(hex(h.finish()) == hmac_hex("key", ""));
}

void test_key_material() {
  uint8_t buf[40];
  std::memset(buf, 0xa5, sizeof(buf));
  kungfu::secure_wipe(buf + 4, 32);
  CHECK(buf[3] == 0xa5 && buf[36] == 0xa5);
  for (int i = 4; i < 36; ++i) CHECK(buf[i] == 0);
  kungfu::secure_wipe(nullptr, 0);

  kungfu::SecretString a("hunter2-but-longer-than-sso-buffer");
  kungfu::SecretString b = a;  // copies are independent
  CHECK(b.size() == a.size());
  CHECK(std::string(b.data(), b.size()) == "hunter2-but-longer-than-sso-buffer");
  kungfu::SecretString c(std::move(a));
  CHECK(a.empty());  // NOLINT: the moved-from secret is wiped, not left behind
  CHECK(std::string(c.data(), c.size()) == std::string(b.data(), b.size()));
  kungfu::SecretString d("short");
  d = std::move(c);
  CHECK(c.empty());  // NOLINT
  CHECK(d.size() == b.size());
  d = kungfu::SecretString("x");
  CHECK(std::string(d.data(), d.size()) == "x");
  kungfu::SecretString e;
  CHECK(e.empty() && e.size() == 0);

  kungfu::SessionKey k;
  for (size_t i = 0; i < k.size(); ++i) CHECK(k.data()[i] == 0);
}

void test_primitives() {
  uint8_t a[32], b[32];
  for (int i = 0; i < 32; ++i) a[i] = b[i] = uint8_t(i);
  CHECK(kungfu::constant_time_equal(a, b, 32));
  CHECK(kungfu::constant_time_equal(a, b, 0));
  b[31] ^= 0x80;
  CHECK(!kungfu::constant_time_equal(a, b, 32));
  b[31] ^= 0x80;
  b[0] ^= 1;
  CHECK(!kungfu::constant_time_equal(a, b, 32));

  std::array<uint8_t, 64> r1{}, r2{};
  CHECK(kungfu::random_bytes(r1.data(), r1.size()));
  CHECK(kungfu::random_bytes(r2.data(), r2.size()));
  CHECK(r1 != r2);  // 2^-512 chance of a false failure.
  CHECK(kungfu::random_bytes(nullptr, 0));
}

// ---- handshake harness ----

struct Result {
  bool ok = false;
  std::string err;
  std::string id;
  kungfu::SessionKey key;
  double rcv_timeout_after = -1;  // seconds, read back after the handshake
};

std::string key_hex(const kungfu::SessionKey &k) {
  std::array<uint8_t, 32> a;
  std::memcpy(a.data(), k.data(), a.size());
  return hex(a);
}

const std::string kZeroKeyHex(64, '0');

// The identity both ends use unless a test varies it.
const kungfu::HandshakeIdentity kJob{"job-1", 7};

double rcv_timeout(int fd) {
  struct timeval tv = {};
  socklen_t len = sizeof(tv);
  ::getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len);
  return double(tv.tv_sec) + double(tv.tv_usec) / 1e6;
}

// Each side runs on its own thread and owns its end, so when one side
// finishes (or fails) its close unblocks the other, as with a real peer.
void run_pair(const std::function<void(int)> &server, const std::function<void(int)> &client) {
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  Fd s(sv[0]), c(sv[1]);
  std::thread ts([&] {
    Fd mine(std::move(s));
    server(mine.get());
  });
  std::thread tc([&] {
    Fd mine(std::move(c));
    client(mine.get());
  });
  ts.join();
  tc.join();
}

std::function<void(int)> real_server(const std::string &secret, Result *r, double timeout = 10,
                                     kungfu::HandshakeIdentity job = kJob) {
  return [=](int fd) {
    r->ok = kungfu::server_handshake(fd, secret, job, &r->id, &r->key, &r->err, timeout);
    r->rcv_timeout_after = rcv_timeout(fd);
  };
}

std::function<void(int)> real_client(const std::string &secret, const std::string &id, Result *r, double timeout = 10,
                                     kungfu::HandshakeIdentity job = kJob) {
  return [=](int fd) {
    r->ok = kungfu::client_handshake(fd, secret, job, id, &r->key, &r->err, timeout);
    r->rcv_timeout_after = rcv_timeout(fd);
  };
}

bool send_raw(int fd, const std::string &bytes) {
  std::string err;
  return kungfu::send_all(fd, bytes.data(), bytes.size(), &err);
}

// Reads and drops what arrives on `fd` until the peer closes it (true) or
// `seconds` pass (false). One end of a handshake outwaits the other's
// timeout this way, however late that fires, instead of sleeping for "longer
// than the timeout" (a loaded machine can make the timeout fire later than
// the sleep ends, and the peer would then see a close instead).
bool closed_within(int fd, double seconds) {
  auto start = std::chrono::steady_clock::now();
  char buf[512];
  while (true) {
    double left = seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left <= 0) return false;
    struct pollfd p = {fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (n <= 0) continue;  // EINTR, or the time is up (checked above)
    ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
  }
}

std::string be32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = char(v >> (24 - 8 * i));
  return s;
}

// The ctx field of handshake.h's wire format, written independently.
std::string ctx(const kungfu::HandshakeIdentity &job) {
  return be32(job.cluster_version) + be32(job.authenticate_frames ? 1u : 0u) + be32(uint32_t(job.job_id.size())) +
         job.job_id;
}

std::string server_hello(const std::string &nonce, const kungfu::HandshakeIdentity &job = kJob) {
  return "KFAUTHS3" + nonce + ctx(job);
}

// Reads a server hello; returns its nonce ("" if it could not be read).
std::string read_server_nonce(int fd) {
  char head[8 + 16 + 12];
  std::string err;
  if (!kungfu::recv_all(fd, head, sizeof(head), &err)) return "";
  const uint8_t *p = reinterpret_cast<const uint8_t *>(head) + 32;
  uint32_t job_len = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
  std::string job(job_len, '\0');
  if (job_len > 0 && !kungfu::recv_all(fd, &job[0], job_len, &err)) return "";
  return std::string(head + 8, 16);
}

const std::string kClientNonce(16, '\x42');

std::string mac_of(const std::string &secret, const std::string &input) {
  auto mac = kungfu::hmac_sha256(secret, input.data(), input.size());
  return std::string(mac.begin(), mac.end());
}

// Builds what a correct client would send, so tests can vary one field.
std::string client_msg(const std::string &secret, const std::string &server_nonce, const std::string &id,
                       const kungfu::HandshakeIdentity &job = kJob) {
  const std::string mac = mac_of(secret, "kungfu-client" + server_nonce + kClientNonce + ctx(job) + id);
  return "KFAUTHC3" + kClientNonce + ctx(job) + be32(uint32_t(id.size())) + id + mac;
}

// Bytes a real client sends for id "h:1" under kJob.
constexpr size_t kClientHelloLen = 8 + 16 + 12 + 5 + 4 + 3 + 32;

void test_handshake_ok() {
  Result s, c;
  run_pair(real_server("s3cret", &s), real_client("s3cret", "127.0.0.1:10001", &c));
  CHECK(s.ok);
  CHECK(c.ok);
  CHECK(s.err.empty());
  CHECK(c.err.empty());
  CHECK(s.id == "127.0.0.1:10001");
  CHECK(s.rcv_timeout_after == 0);
  CHECK(c.rcv_timeout_after == 0);
  // Both ends derived the same session key, and it is not all zeros.
  CHECK(key_hex(s.key) == key_hex(c.key));
  CHECK(key_hex(s.key) != kZeroKeyHex);

  // A caller's own timeout survives the handshake.
  Result s2, c2;
  run_pair(
      [&](int fd) {
        kungfu::set_io_timeout(fd, 5);
        real_server("k", &s2)(fd);
      },
      real_client("k", std::string(kungfu::kHandshakeMaxIdLen, 'z'), &c2));
  CHECK(s2.ok);
  CHECK(c2.ok);
  CHECK(s2.id == std::string(kungfu::kHandshakeMaxIdLen, 'z'));
  CHECK(s2.rcv_timeout_after == 5);

  // A long binary secret works too.
  const std::string secret(300, '\0');
  Result s3, c3;
  run_pair(real_server(secret, &s3), real_client(secret, "/tmp/kf.sock", &c3));
  CHECK(s3.ok && c3.ok && s3.id == "/tmp/kf.sock");

  // An empty job id is a valid identity when both ends have it.
  Result s4, c4;
  const kungfu::HandshakeIdentity anon{"", 0};
  run_pair(real_server("k", &s4, 10, anon), real_client("k", "h:1", &c4, 10, anon));
  CHECK(s4.ok && c4.ok);
}

// The MACs cover the job id and the cluster version: a worker that knows the
// secret but belongs to another run (or cluster version) is turned away by
// both ends, each naming the mismatch.
void test_handshake_job_binding() {
  const kungfu::HandshakeIdentity old_run{"job-0", kJob.cluster_version};
  Result s, c;
  run_pair(real_server("s3cret", &s), real_client("s3cret", "h:1", &c, 10, old_run));
  CHECK(!s.ok);
  CHECK(!c.ok);
  CHECK(s.id.empty());
  CHECK_ERR(s.err, "client h:1 knows the secret but belongs to job 'job-0' at cluster version 7");
  CHECK_ERR(s.err, "this worker is job 'job-1' at cluster version 7");
  CHECK_ERR(c.err, "server belongs to job 'job-1' at cluster version 7");
  CHECK_ERR(c.err, "this worker is job 'job-0'");
  CHECK_ERR(c.err, "left over from another run");
  CHECK(key_hex(s.key) == kZeroKeyHex && key_hex(c.key) == kZeroKeyHex);

  // The leftover on the server side: same result from the other direction.
  Result s2, c2;
  run_pair(real_server("s3cret", &s2, 10, old_run), real_client("s3cret", "h:1", &c2));
  CHECK(!s2.ok && !c2.ok);
  CHECK_ERR(s2.err, "belongs to job 'job-1'");
  CHECK_ERR(c2.err, "server belongs to job 'job-0'");

  // Same job, another cluster version: peers switching versions a few ms
  // apart (a resize), named as such, not as a leftover of another run.
  Result s3, c3;
  run_pair(real_server("s3cret", &s3), real_client("s3cret", "h:1", &c3, 10, {kJob.job_id, kJob.cluster_version + 1}));
  CHECK(!s3.ok && !c3.ok);
  CHECK_ERR(s3.err, "client h:1 is at cluster version 8, this worker at 7");
  CHECK_ERR(c3.err, "the server is at cluster version 7, this worker at 8");
  CHECK(s3.err.find("another run") == std::string::npos && c3.err.find("another run") == std::string::npos);

  // Job ids that differ only in length are not confused ("job-1" vs "job-1x").
  Result s4, c4;
  run_pair(real_server("s3cret", &s4), real_client("s3cret", "h:1", &c4, 10, {"job-1x", 7}));
  CHECK(!s4.ok && !c4.ok);

  // A client that claims the server's identity in clear but computed its MAC
  // over its own (as a tampered hello would look): the MAC gives it away.
  Result s5;
  run_pair(real_server("s3cret", &s5), [](int fd) {
    std::string m = client_msg("s3cret", read_server_nonce(fd), "h:1", {"job-9", 7});
    m.replace(8 + 16 + 12, 5, "job-1");
    send_raw(fd, m);
  });
  CHECK(!s5.ok);
  CHECK_ERR(s5.err, "client MAC mismatch");

  // Own identities are checked before anything is sent.
  Result s6, c6;
  run_pair(real_server("s3cret", &s6),
           real_client("s3cret", "h:1", &c6, 10, {std::string(kungfu::kHandshakeMaxJobIdLen + 1, 'j'), 7}));
  CHECK(!c6.ok && !s6.ok);
  CHECK_ERR(c6.err, "own job id must be at most 128 bytes, got 129");
  Result s7, c7;
  run_pair(real_server("s3cret", &s7, 10, {"job\n1", 7}), real_client("s3cret", "h:1", &c7));
  CHECK(!s7.ok && !c7.ok);
  CHECK_ERR(s7.err, "own job id contains control characters");
}

// The session key is HMAC(secret, "kungfu-session" | server nonce | client
// nonce | ctx | client id), as handshake.h says, and fresh per connection.
void test_session_key() {
  Result s;
  std::string nonce;
  run_pair(real_server("s3cret", &s), [&](int fd) {
    nonce = read_server_nonce(fd);
    send_raw(fd, client_msg("s3cret", nonce, "h:1"));
    char mac[32];
    std::string err;
    kungfu::recv_all(fd, mac, sizeof(mac), &err);
  });
  CHECK(s.ok);
  const std::string want = mac_of("s3cret", "kungfu-session" + nonce + kClientNonce + ctx(kJob) + "h:1");
  std::array<uint8_t, 32> want_bytes;
  std::memcpy(want_bytes.data(), want.data(), 32);
  CHECK(key_hex(s.key) == hex(want_bytes));

  Result s2, c2, s3, c3;
  run_pair(real_server("s3cret", &s2), real_client("s3cret", "h:1", &c2));
  run_pair(real_server("s3cret", &s3), real_client("s3cret", "h:1", &c3));
  CHECK(s2.ok && c2.ok && s3.ok && c3.ok);
  CHECK(key_hex(s2.key) == key_hex(c2.key));
  CHECK(key_hex(s2.key) != key_hex(s3.key));

  // A null out-parameter is allowed.
  bool ok_s = false, ok_c = false;
  run_pair(
      [&](int fd) {
        std::string id, err;
        ok_s = kungfu::server_handshake(fd, "s3cret", kJob, &id, nullptr, &err);
      },
      [&](int fd) {
        std::string err;
        ok_c = kungfu::client_handshake(fd, "s3cret", kJob, "h:1", nullptr, &err);
      });
  CHECK(ok_s && ok_c);
}

void test_handshake_wrong_secret() {
  Result s, c;
  run_pair(real_server("right", &s), real_client("wrong", "h:1", &c));
  CHECK(!s.ok);
  CHECK(!c.ok);
  CHECK(s.id.empty());
  CHECK_ERR(s.err, "client MAC mismatch");
  CHECK_ERR(c.err, "server closed the connection");
  CHECK(s.rcv_timeout_after == 0);

  // Secrets differing only in length (prefix) must not be confused.
  Result s2, c2;
  run_pair(real_server("abc", &s2), real_client("abcd", "h:1", &c2));
  CHECK(!s2.ok && !c2.ok);
}

void test_handshake_empty_secret() {
  Result s, c;
  // Both refuse up front; the closes let the other side finish promptly.
  run_pair(real_server("", &s), real_client("", "h:1", &c));
  CHECK(!s.ok && !c.ok);
  CHECK_ERR(s.err, "empty secret");
  CHECK_ERR(c.err, "empty secret");
}

using HostileClient = std::function<void(int fd, const std::string &nonce)>;

// The hostile client gets the server hello read for it unless told otherwise:
// hanging up with it unread makes the server fail with EPIPE or ECONNRESET
// depending on scheduling, which would make the expected error racy.
void expect_server_rejects(const HostileClient &client, const char *needle, double timeout = 10,
                           bool read_hello = true) {
  Result s;
  run_pair(real_server("s3cret", &s, timeout), [&](int fd) {
    std::string nonce = read_hello ? read_server_nonce(fd) : std::string();
    client(fd, nonce);
  });
  CHECK(!s.ok);
  CHECK(s.id.empty());
  CHECK_ERR(s.err, needle);
  CHECK(s.rcv_timeout_after == 0);
}

const std::string kNonceN(16, 'n');
const std::string kHello = server_hello(kNonceN);

void test_handshake_hostile_clients() {
  expect_server_rejects([](int fd, const std::string &) { send_raw(fd, std::string(64, 'X')); }, "bad client magic");
  expect_server_rejects([](int fd, const std::string &) { send_raw(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); },
                        "bad client magic");
  // Hanging up at once: only the "handshake:" prefix is deterministic.
  expect_server_rejects([](int, const std::string &) {}, "handshake: ", 10, false);
  expect_server_rejects([](int, const std::string &) {}, "closed by peer while reading client magic");
  expect_server_rejects([](int fd, const std::string &) { send_raw(fd, "KFAU"); },
                        "closed by peer while reading client magic");
  expect_server_rejects([](int fd, const std::string &) { send_raw(fd, "KFAUTHC3" + std::string(5, 'n')); },
                        "closed by peer while reading client nonce");
  expect_server_rejects(
      [](int fd, const std::string &) { send_raw(fd, "KFAUTHC3" + kNonceN + be32(7) + be32(0) + be32(0xffffffffu)); },
      "client job id length 4294967295 exceeds limit of 128 bytes");
  expect_server_rejects([](int fd,
                           const std::string &) { send_raw(fd, "KFAUTHC3" + kNonceN + ctx(kJob) + be32(0xffffffffu)); },
                        "client id length 4294967295 exceeds limit of 256 bytes");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC3" + kNonceN + ctx(kJob) + be32(uint32_t(kungfu::kHandshakeMaxIdLen + 1)) +
                         std::string(400, 'i'));
      },
      "exceeds limit");
  expect_server_rejects([](int fd, const std::string &) { send_raw(fd, "KFAUTHC3" + kNonceN + ctx(kJob) + be32(0)); },
                        "empty client id");
  // Job id and id promised but the peer hangs up mid-way.
  expect_server_rejects(
      [](int fd, const std::string &) { send_raw(fd, "KFAUTHC3" + kNonceN + be32(7) + be32(0) + be32(5) + "jo"); },
      "closed by peer while reading client job id");
  expect_server_rejects([](int fd,
                           const std::string &) { send_raw(fd, "KFAUTHC3" + kNonceN + ctx(kJob) + be32(10) + "abc"); },
                        "closed by peer while reading client id");
  // Correct everything except a truncated MAC.
  expect_server_rejects(
      [](int fd, const std::string &nonce) {
        std::string m = client_msg("s3cret", nonce, "h:1");
        send_raw(fd, m.substr(0, m.size() - 1));
      },
      "closed by peer while reading client MAC");
  // One flipped MAC bit.
  expect_server_rejects(
      [](int fd, const std::string &nonce) {
        std::string m = client_msg("s3cret", nonce, "h:1");
        m.back() = char(m.back() ^ 1);
        send_raw(fd, m);
      },
      "client MAC mismatch");
  // The MAC covers the id: a valid proof for one id cannot claim another.
  expect_server_rejects(
      [](int fd, const std::string &nonce) {
        std::string m = client_msg("s3cret", nonce, "h:1");
        m[8 + 16 + 12 + 5 + 4 + 2] = '2';
        send_raw(fd, m);
      },
      "client MAC mismatch");
  // ... and the cluster version sent in clear.
  expect_server_rejects(
      [](int fd, const std::string &nonce) {
        std::string m = client_msg("s3cret", nonce, "h:1");
        m[8 + 16 + 3] = char(m[8 + 16 + 3] ^ 1);
        send_raw(fd, m);
      },
      "client MAC mismatch");
  // Authenticated but with an id that would corrupt logs.
  expect_server_rejects([](int fd,
                           const std::string &nonce) { send_raw(fd, client_msg("s3cret", nonce, "h:1\nfake")); },
                        "control characters");
  // Sanity check of the crafted messages themselves: unmodified, it passes.
  Result s;
  run_pair(real_server("s3cret", &s), [](int fd) {
    send_raw(fd, client_msg("s3cret", read_server_nonce(fd), "h:9"));
    char mac[32];
    std::string err;
    kungfu::recv_all(fd, mac, sizeof(mac), &err);
  });
  CHECK(s.ok);
  CHECK(s.id == "h:9");
}

void test_handshake_replay() {
  // Capture a genuine client's answer to one challenge...
  std::string captured;
  Result c;
  run_pair(
      [&](int fd) {
        std::string hello = server_hello(std::string(16, '\x07'));
        send_raw(fd, hello);
        char buf[kClientHelloLen];
        std::string err;
        if (kungfu::recv_all(fd, buf, sizeof(buf), &err)) {
          captured.assign(buf, sizeof(buf));
        }
      },
      real_client("s3cret", "h:1", &c));
  CHECK(captured.size() == kClientHelloLen);
  CHECK(!c.ok);
  CHECK_ERR(c.err, "server closed the connection");
  // ...it is useless against a real server, which picks a fresh nonce.
  expect_server_rejects([&](int fd, const std::string &) { send_raw(fd, captured); }, "client MAC mismatch");
}

void test_handshake_timeouts() {
  // A client that sends nothing, and hangs up only once the server has.
  expect_server_rejects([](int fd, const std::string &) { CHECK(closed_within(fd, 30)); },
                        "timed out waiting for client magic", 0.2);
  // Each byte arrives well within the timeout, but the deadline covers the
  // whole handshake, so dribbling cannot keep the server busy: a valid hello
  // (456 bytes, one every 100 ms: 46 s) is cut off after a few bytes, at the
  // server's deadline. A server whose timeout covered each read alone would
  // take it all and accept it. Which field the server waited for depends on
  // how many bytes it read by then (the magic's, unless it was descheduled).
  bool cut_off = false;
  expect_server_rejects(
      [&](int fd, const std::string &nonce) {
        const std::string hello = client_msg("s3cret", nonce, std::string(kungfu::kHandshakeMaxIdLen, 'h'),
                                             {std::string(kungfu::kHandshakeMaxJobIdLen, 'j'), 7});
        for (char ch : hello) {
          if (!send_raw(fd, std::string(1, ch)) || closed_within(fd, 0.1)) {
            cut_off = true;
            return;
          }
        }
      },
      "timed out waiting for client ", 0.35);
  // Both end at the server's deadline (0.2 s, 0.35 s), not the clients'
  // (30 s, 46 s): the server's "timed out waiting for client" rejections,
  // closed_within() seeing the server hang up, and cut_off say so, not the clock.
  CHECK(cut_off);

  // A server that goes silent after the hello cannot hold the client either
  // (it hangs up only once the client has).
  Result c;
  run_pair(
      [](int fd) {
        send_raw(fd, kHello);
        CHECK(closed_within(fd, 30));
      },
      real_client("s3cret", "h:1", &c, 0.2));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "timed out waiting for server MAC");
  CHECK(c.rcv_timeout_after == 0);
}

void test_handshake_hostile_servers() {
  Result c;
  run_pair([](int fd) { send_raw(fd, std::string(24, '?')); }, real_client("s3cret", "h:1", &c));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "bad server magic");

  // An impostor that does not know the secret answers with junk.
  Result c2;
  run_pair(
      [](int fd) {
        send_raw(fd, kHello);
        char buf[kClientHelloLen];
        std::string err;
        kungfu::recv_all(fd, buf, sizeof(buf), &err);
        send_raw(fd, std::string(32, '\x5a'));
      },
      real_client("s3cret", "h:1", &c2));
  CHECK(!c2.ok);
  CHECK_ERR(c2.err, "server MAC mismatch");

  // Reflection: echoing the client's own MAC back must not pass as the
  // server's proof.
  Result c3;
  run_pair(
      [](int fd) {
        send_raw(fd, kHello);
        char buf[kClientHelloLen];
        std::string err;
        kungfu::recv_all(fd, buf, sizeof(buf), &err);
        send_raw(fd, std::string(buf + sizeof(buf) - 32, 32));
      },
      real_client("s3cret", "h:1", &c3));
  CHECK(!c3.ok);
  CHECK_ERR(c3.err, "server MAC mismatch");

  Result c4;
  run_pair([](int) {}, real_client("s3cret", "h:1", &c4));
  CHECK(!c4.ok);
  CHECK_ERR(c4.err, "reading server magic");

  Result c5;
  run_pair([](int fd) { send_raw(fd, "KFAUTHS3" + kNonceN + be32(7) + be32(0) + be32(1u << 31)); },
           real_client("s3cret", "h:1", &c5));
  CHECK(!c5.ok);
  CHECK_ERR(c5.err, "server job id length 2147483648 exceeds limit of 128 bytes");

  // The server's proof covers the job identity: a server of another run that
  // knows the secret and echoes our identity in its hello still cannot prove
  // it belongs to our run.
  Result c6;
  run_pair(
      [](int fd) {
        send_raw(fd, kHello);
        char buf[kClientHelloLen];
        std::string err;
        kungfu::recv_all(fd, buf, sizeof(buf), &err);
        const std::string client_nonce(buf + 8, 16);
        send_raw(fd, mac_of("s3cret", "kungfu-server" + client_nonce + kNonceN + ctx({"job-0", 7}) + "h:1"));
      },
      real_client("s3cret", "h:1", &c6));
  CHECK(!c6.ok);
  CHECK_ERR(c6.err, "server MAC mismatch");
  // The same proof over our own identity passes (the crafted bytes are right).
  Result c7;
  run_pair(
      [](int fd) {
        send_raw(fd, kHello);
        char buf[kClientHelloLen];
        std::string err;
        kungfu::recv_all(fd, buf, sizeof(buf), &err);
        const std::string client_nonce(buf + 8, 16);
        send_raw(fd, mac_of("s3cret", "kungfu-server" + client_nonce + kNonceN + ctx(kJob) + "h:1"));
      },
      real_client("s3cret", "h:1", &c7));
  CHECK(c7.ok);
}

void test_handshake_bad_self_id() {
  Result s, c;
  run_pair(real_server("s3cret", &s), real_client("s3cret", std::string(kungfu::kHandshakeMaxIdLen + 1, 'x'), &c));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "own id");
  CHECK(!s.ok);

  Result s2, c2;
  run_pair(real_server("s3cret", &s2), real_client("s3cret", "", &c2));
  CHECK(!c2.ok);
  CHECK_ERR(c2.err, "own id");
  CHECK(!s2.ok);

  Result s3, c3;
  run_pair(real_server("s3cret", &s3), real_client("s3cret", std::string("a\0b", 3), &c3));
  CHECK(!c3.ok);
  CHECK_ERR(c3.err, "control characters");
}

// KUNGFU_JOB_ID as RuntimeOptions::from_env reads it.
const char *const kHexSecret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
void test_job_id_from_env() {
  auto load = [](const char *job_id, const char *peers, kungfu::RuntimeOptions *o) {
    ::setenv("KUNGFU_PEERS", peers, 1);
    ::setenv("KUNGFU_SELF", "127.0.0.1:10001", 1);
    ::setenv("KUNGFU_JOB_SECRET", kHexSecret, 1);
    if (job_id) {
      ::setenv("KUNGFU_JOB_ID", job_id, 1);
    } else {
      ::unsetenv("KUNGFU_JOB_ID");
    }
    return kungfu::RuntimeOptions::from_env(o);
  };
  const char *two = "127.0.0.1:10001,127.0.0.1:10002";
  kungfu::RuntimeOptions o;
  CHECK(load("4f1c-run", two, &o).ok());
  CHECK(o.job_id == "4f1c-run");
  CHECK(std::string(o.secret.data(), o.secret.size()) == kHexSecret);
  // One worker never connects to anyone: no id needed.
  CHECK(load(nullptr, "127.0.0.1:10001", &o).ok());

  kungfu::Status s = load(nullptr, two, &o);
  CHECK(s.code() == kungfu::Code::kInvalidArgument);
  CHECK_ERR(s.message(), "KUNGFU_JOB_ID is not set");
  s = load("", two, &o);
  CHECK_ERR(s.message(), "KUNGFU_JOB_ID is not set");
  s = load(std::string(129, 'j').c_str(), two, &o);
  CHECK_ERR(s.message(), "KUNGFU_JOB_ID must be at most 128 bytes, got 129");
  CHECK(load(std::string(128, 'j').c_str(), two, &o).ok());
  s = load("run\x1b[2J", two, &o);
  CHECK_ERR(s.message(), "KUNGFU_JOB_ID must be printable ASCII, got byte 27 at offset 3");
  s = load("caf\xc3\xa9", two, &o);
  CHECK_ERR(s.message(), "got byte 195 at offset 3");
  for (const char *v : {"KUNGFU_PEERS", "KUNGFU_SELF", "KUNGFU_JOB_SECRET", "KUNGFU_JOB_ID"}) ::unsetenv(v);
}

// ---- per-frame authentication ----

using kungfu::FrameAuthenticator;
using kungfu::FrameDirection;

kungfu::SessionKey make_key(uint8_t seed) {
  kungfu::SessionKey k;
  for (size_t i = 0; i < k.size(); ++i) k.data()[i] = uint8_t(seed + i);
  return k;
}

std::string be64(uint64_t v) { return be32(uint32_t(v >> 32)) + be32(uint32_t(v)); }

// frame_auth.h's tag (AES-256-GMAC), computed independently: GHASH written
// out from NIST SP 800-38D (Algorithm 1, bit by bit) and AES as a bare block
// cipher (ECB of one block), none of OpenSSL's GCM code.
using Block = std::array<uint8_t, 16>;

Block aes256_block(const uint8_t key[32], const Block &in) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  Block out{};
  int n = 0;
  bool ok = ctx && EVP_EncryptInit_ex(ctx, EVP_aes_256_ecb(), nullptr, key, nullptr) == 1 &&
            EVP_CIPHER_CTX_set_padding(ctx, 0) == 1 && EVP_EncryptUpdate(ctx, out.data(), &n, in.data(), 16) == 1 &&
            n == 16;
  EVP_CIPHER_CTX_free(ctx);
  CHECK(ok);
  return out;
}

// X * Y in GF(2^128) with GCM's bit order (bit 0 = the first byte's MSB).
Block gf_multiply(const Block &x, const Block &y) {
  Block z{}, v = y;
  for (int i = 0; i < 128; ++i) {
    if ((x[i / 8] >> (7 - i % 8)) & 1) {
      for (int j = 0; j < 16; ++j) z[j] ^= v[j];
    }
    const bool lsb = v[15] & 1;
    for (int j = 15; j > 0; --j) v[j] = uint8_t((v[j] >> 1) | (v[j - 1] << 7));
    v[0] >>= 1;
    if (lsb) v[0] ^= 0xe1;
  }
  return z;
}

// GMAC(key, iv (12 bytes), aad): GCM with an empty plaintext.
std::string reference_gmac(const uint8_t key[32], const std::string &iv, const std::string &aad) {
  const Block h = aes256_block(key, Block{});
  Block x{};
  auto absorb = [&](const uint8_t *b, size_t n) {  // one block, zero-padded
    for (size_t j = 0; j < n; ++j) x[j] ^= b[j];
    x = gf_multiply(x, h);
  };
  for (size_t off = 0; off < aad.size(); off += 16) {
    absorb(reinterpret_cast<const uint8_t *>(aad.data()) + off, std::min<size_t>(16, aad.size() - off));
  }
  Block lengths{};  // len(A) in bits, then len(C) = 0, both 64-bit big-endian
  const uint64_t bits = uint64_t(aad.size()) * 8;
  for (int j = 0; j < 8; ++j) lengths[j] = uint8_t(bits >> (56 - 8 * j));
  absorb(lengths.data(), 16);
  Block j0{};
  std::memcpy(j0.data(), iv.data(), 12);
  j0[15] = 1;
  const Block mask = aes256_block(key, j0);
  std::string tag(16, '\0');
  for (int j = 0; j < 16; ++j) tag[j] = char(x[j] ^ mask[j]);
  return tag;
}

void test_reference_gmac() {
  // The GCM specification's test case 13 (AES-256, all-zero key and IV,
  // nothing to authenticate) pins the reference itself.
  const uint8_t zero_key[32] = {};
  const std::string t = reference_gmac(zero_key, std::string(12, '\0'), "");
  const uint8_t expected[16] = {0x53, 0x0f, 0x8a, 0xfb, 0xc7, 0x45, 0x36, 0xb9,
                                0xa9, 0x63, 0xb4, 0xf1, 0xc4, 0xcb, 0x73, 0x8b};
  CHECK(t == std::string(reinterpret_cast<const char *>(expected), 16));
}

std::string reference_tag(const kungfu::SessionKey &k, FrameDirection dir, uint64_t seq, const std::string &header,
                          const std::string &key, const std::string &payload) {
  const std::string nonce = be32(uint32_t(dir)) + be64(seq);
  const std::string aad = be32(uint32_t(header.size())) + header + be32(uint32_t(key.size())) + key + payload;
  return reference_gmac(k.data(), nonce, aad);
}

struct Frame {
  std::string header, key, payload;
};

std::string tag_str(const FrameAuthenticator::Tag &t) { return std::string(t.begin(), t.end()); }

FrameAuthenticator::Tag sign(FrameAuthenticator &a, const Frame &f) {
  return a.sign(f.header.data(), f.header.size(), f.key.data(), f.key.size(), f.payload.data(), f.payload.size());
}

bool verify(FrameAuthenticator &a, const Frame &f, const std::string &tag) {
  return a.verify(f.header.data(), f.header.size(), f.key.data(), f.key.size(), f.payload.data(), f.payload.size(),
                  reinterpret_cast<const uint8_t *>(tag.data()));
}

void test_frame_auth() {
  const kungfu::SessionKey k = make_key(1);
  const FrameDirection c2s = FrameDirection::kClientToServer;
  std::vector<Frame> frames = {
      {std::string(104, 'h'), "grad/0", std::string(1 << 20, 'p')},
      {"H", "", ""},
      {std::string(104, 'h'), "grad/0", std::string(1 << 20, 'p')},  // same bytes again
      {"hdr", "k", std::string(1000, '\xff')},
  };
  FrameAuthenticator sender(k, c2s), receiver(k, c2s);
  std::vector<std::string> tags;
  for (size_t i = 0; i < frames.size(); ++i) {
    const Frame &f = frames[i];
    tags.push_back(tag_str(sign(sender, f)));
    CHECK(tags.back() == reference_tag(k, c2s, i, f.header, f.key, f.payload));
    CHECK(verify(receiver, f, tags.back()));
  }
  CHECK(sender.next_sequence() == frames.size());
  CHECK(receiver.next_sequence() == frames.size());
  CHECK(!receiver.failed());
  // Identical frames at different positions get different tags.
  CHECK(tags[0] != tags[2]);

  // The payload fed in pieces gives the same tag.
  {
    FrameAuthenticator a(k, c2s);
    const Frame &f = frames[0];
    a.begin_frame(f.header.data(), f.header.size(), f.key.data(), f.key.size());
    size_t off = 0, step = 1;
    while (off < f.payload.size()) {
      size_t n = std::min(step, f.payload.size() - off);
      a.add_payload(f.payload.data() + off, n);
      off += n;
      step = step * 13 % 70001 + 1;
    }
    CHECK(tag_str(a.end_frame()) == tags[0]);
  }

  // A frame in segments: the first tag covers header, key and segment 0, each
  // later one its segment alone, each under the next sequence number.
  {
    FrameAuthenticator a(k, c2s);
    const std::string seg0(1000, 's'), seg1(300, 't');
    a.begin_frame("hdr", 3, "key", 3);
    a.add_payload(seg0.data(), seg0.size());
    CHECK(tag_str(a.end_frame()) == reference_tag(k, c2s, 0, "hdr", "key", seg0));
    a.begin_segment();
    a.add_payload(seg1.data(), seg1.size());
    CHECK(tag_str(a.end_frame()) == reference_gmac(k.data(), be32(uint32_t(c2s)) + be64(1), seg1));
    CHECK(a.next_sequence() == 2);
    CHECK(FrameAuthenticator::segments(0) == 1 && FrameAuthenticator::segments(1) == 1);
    CHECK(FrameAuthenticator::segments(FrameAuthenticator::kSegmentLen) == 1);
    CHECK(FrameAuthenticator::segments(FrameAuthenticator::kSegmentLen + 1) == 2);
  }

  // A frame begun and abandoned does not use up a sequence number.
  {
    FrameAuthenticator a(k, c2s);
    a.begin_frame("x", 1, "y", 1);
    a.add_payload("zz", 2);
    CHECK(tag_str(sign(a, frames[0])) == tags[0]);
  }

  // Moving bytes between header, key and payload changes the tag.
  {
    FrameAuthenticator a(k, c2s), b(k, c2s), c(k, c2s);
    CHECK(tag_str(sign(a, {"ab", "c", "d"})) != tag_str(sign(b, {"a", "bc", "d"})));
    CHECK(tag_str(sign(c, {"a", "b", "cd"})) != reference_tag(k, c2s, 0, "a", "bc", "d"));
  }
}

// Every way a frame can be altered in transit is caught, and a stream that
// failed once stays failed.
void test_frame_auth_rejects() {
  const kungfu::SessionKey k = make_key(1);
  const FrameDirection c2s = FrameDirection::kClientToServer;
  const Frame f0{std::string(104, 'h'), "op/1", std::string(4096, 'a')};
  const Frame f1{std::string(104, 'h'), "op/2", std::string(4096, 'b')};
  FrameAuthenticator sender(k, c2s);
  const std::string t0 = tag_str(sign(sender, f0));
  const std::string t1 = tag_str(sign(sender, f1));

  auto fresh_rejects = [&](const Frame &f, const std::string &tag, const kungfu::SessionKey &key, FrameDirection dir) {
    FrameAuthenticator r(key, dir);
    return !verify(r, f, tag) && r.failed();
  };
  Frame bad = f0;
  bad.header[10] ^= 1;
  CHECK(fresh_rejects(bad, t0, k, c2s));
  bad = f0;
  bad.key = "op/9";
  CHECK(fresh_rejects(bad, t0, k, c2s));
  bad = f0;
  bad.payload[4095] ^= 0x80;
  CHECK(fresh_rejects(bad, t0, k, c2s));
  bad = f0;
  bad.payload.pop_back();  // truncated
  CHECK(fresh_rejects(bad, t0, k, c2s));
  std::string bad_tag = t0;
  bad_tag[15] ^= 1;
  CHECK(fresh_rejects(f0, bad_tag, k, c2s));
  // Another connection's key, or the other direction of this one.
  CHECK(fresh_rejects(f0, t0, make_key(2), c2s));
  CHECK(fresh_rejects(f0, t0, k, FrameDirection::kServerToClient));
  // Reordered: the second frame first.
  CHECK(fresh_rejects(f1, t1, k, c2s));

  // Replayed: frame 0 delivered twice.
  FrameAuthenticator r(k, c2s);
  CHECK(verify(r, f0, t0));
  CHECK(!verify(r, f0, t0));
  CHECK(r.failed());

  // Sticky: after a tampered frame 0, the genuine frame 1 (which would verify
  // at its position) is refused too.
  FrameAuthenticator r3(k, c2s);
  CHECK(!verify(r3, bad, t0));
  CHECK(!verify(r3, f1, t1));
  CHECK(r3.failed());
  FrameAuthenticator r4(k, c2s);  // the same two frames, untampered
  CHECK(verify(r4, f0, t0) && verify(r4, f1, t1));

  // Dropped: frame 1 without frame 0.
  FrameAuthenticator r2(k, c2s);
  CHECK(!verify(r2, f1, t1));
}

}  // namespace

int main() {
  test_hmac();
  test_key_material();
  test_primitives();
  test_handshake_ok();
  test_handshake_job_binding();
  test_session_key();
  test_handshake_wrong_secret();
  test_handshake_empty_secret();
  test_handshake_hostile_clients();
  test_handshake_replay();
  test_handshake_timeouts();
  test_handshake_hostile_servers();
  test_handshake_bad_self_id();
  test_job_id_from_env();
  test_reference_gmac();
  test_frame_auth();
  test_frame_auth_rejects();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}
