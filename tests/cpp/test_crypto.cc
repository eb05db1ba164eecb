// Tests for SHA-256, HMAC-SHA256 and the connection handshake.
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "handshake.h"
#include "hmac.h"
#include "sha256.h"
#include "socket_io.h"

namespace {

int g_passed = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,     \
                   __LINE__, #cond);                                  \
      std::fprintf(stderr, "%d passed, 1 failed\n", g_passed);        \
      std::exit(1);                                                   \
    }                                                                 \
    ++g_passed;                                                       \
  } while (0)

// Substring match keeps the tests tied to the meaning of an error rather than
// its exact wording.
#define CHECK_ERR(err, needle)                                               \
  do {                                                                       \
    if ((err).find(needle) == std::string::npos) {                           \
      std::fprintf(stderr, "%s:%d: error \"%s\" does not mention \"%s\"\n",  \
                   __FILE__, __LINE__, (err).c_str(), needle);               \
      std::fprintf(stderr, "%d passed, 1 failed\n", g_passed);               \
      std::exit(1);                                                          \
    }                                                                        \
    ++g_passed;                                                              \
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

std::string sha_hex(const std::string &s) {
  return hex(kungfu::sha256(s.data(), s.size()));
}

std::string hmac_hex(const std::string &key, const std::string &msg) {
  return hex(kungfu::hmac_sha256(key, msg.data(), msg.size()));
}

void test_sha256() {
  CHECK(sha_hex("") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha_hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");

  const std::string million(1000000, 'a');
  const std::string million_hex =
      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  CHECK(sha_hex(million) == million_hex);

  // Odd-sized updates exercise every path through the partial-block buffer.
  kungfu::Sha256 h;
  size_t off = 0, step = 1;
  while (off < million.size()) {
    size_t n = std::min(step, million.size() - off);
    h.update(million.data() + off, n);
    off += n;
    step = step * 7 % 257 + 1;
  }
  CHECK(hex(h.finish()) == million_hex);
  // finish() resets, so the same object hashes a new message from scratch.
  h.update("abc", 3);
  CHECK(hex(h.finish()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  h.update(nullptr, 0);
  CHECK(hex(h.finish()) == sha_hex(""));

  // Lengths around the padding boundary (55/56 bytes, 63/64 bytes) must agree
  // between one-shot and byte-at-a-time hashing.
  for (size_t len = 50; len <= 130; ++len) {
    std::string m(len, 'x');
    kungfu::Sha256 b;
    for (char c : m) b.update(&c, 1);
    CHECK(hex(b.finish()) == sha_hex(m));
  }
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
  CHECK(hmac_hex(key4, std::string(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  const std::string key131(131, '\xaa');
  CHECK(hmac_hex(key131,
                 "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(key131,
                 "This is a test using a larger than block-size key and a "
                 "larger than block-size data. The key needs to be hashed "
                 "before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
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
  double rcv_timeout_after = -1;  // seconds, read back after the handshake
};

double rcv_timeout(int fd) {
  struct timeval tv = {};
  socklen_t len = sizeof(tv);
  ::getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len);
  return double(tv.tv_sec) + double(tv.tv_usec) / 1e6;
}

// Each side runs on its own thread and owns its end, so when one side
// finishes (or fails) its close unblocks the other, as with a real peer.
void run_pair(const std::function<void(int)> &server,
              const std::function<void(int)> &client) {
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

std::function<void(int)> real_server(const std::string &secret, Result *r,
                                     double timeout = 10) {
  return [=](int fd) {
    r->ok = kungfu::server_handshake(fd, secret, &r->id, &r->err, timeout);
    r->rcv_timeout_after = rcv_timeout(fd);
  };
}

std::function<void(int)> real_client(const std::string &secret,
                                     const std::string &id, Result *r,
                                     double timeout = 10) {
  return [=](int fd) {
    r->ok = kungfu::client_handshake(fd, secret, id, &r->err, timeout);
    r->rcv_timeout_after = rcv_timeout(fd);
  };
}

bool send_raw(int fd, const std::string &bytes) {
  std::string err;
  return kungfu::send_all(fd, bytes.data(), bytes.size(), &err);
}

std::string read_server_nonce(int fd) {
  char hello[24];
  std::string err;
  if (!kungfu::recv_all(fd, hello, sizeof(hello), &err)) return "";
  return std::string(hello + 8, 16);
}

std::string be32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = char(v >> (24 - 8 * i));
  return s;
}

// Builds what a correct client would send, so tests can vary one field.
std::string client_msg(const std::string &secret,
                       const std::string &server_nonce,
                       const std::string &id) {
  const std::string client_nonce(16, '\x42');
  const std::string mac_in = "kungfu-client" + server_nonce + client_nonce + id;
  auto mac = kungfu::hmac_sha256(secret, mac_in.data(), mac_in.size());
  return "KFAUTHC1" + client_nonce + be32(uint32_t(id.size())) + id +
         std::string(mac.begin(), mac.end());
}

void test_handshake_ok() {
  Result s, c;
  run_pair(real_server("s3cret", &s),
           real_client("s3cret", "127.0.0.1:10001", &c));
  CHECK(s.ok);
  CHECK(c.ok);
  CHECK(s.err.empty());
  CHECK(c.err.empty());
  CHECK(s.id == "127.0.0.1:10001");
  CHECK(s.rcv_timeout_after == 0);
  CHECK(c.rcv_timeout_after == 0);

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
void expect_server_rejects(const HostileClient &client, const char *needle,
                           double timeout = 10, bool read_hello = true) {
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

void test_handshake_hostile_clients() {
  expect_server_rejects(
      [](int fd, const std::string &) { send_raw(fd, std::string(64, 'X')); },
      "bad client magic");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
      },
      "bad client magic");
  // Hanging up at once: only the "handshake:" prefix is deterministic.
  expect_server_rejects([](int, const std::string &) {}, "handshake: ", 10,
                        false);
  expect_server_rejects([](int, const std::string &) {},
                        "closed by peer while reading client magic");
  expect_server_rejects(
      [](int fd, const std::string &) { send_raw(fd, "KFAU"); },
      "closed by peer while reading client magic");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC1" + std::string(5, 'n'));
      },
      "closed by peer while reading client nonce and id length");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC1" + kNonceN + be32(0xffffffffu));
      },
      "exceeds limit");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC1" + kNonceN +
                         be32(uint32_t(kungfu::kHandshakeMaxIdLen + 1)) +
                         std::string(400, 'i'));
      },
      "exceeds limit");
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC1" + kNonceN + be32(0));
      },
      "empty id");
  // Id promised but the peer hangs up mid-way.
  expect_server_rejects(
      [](int fd, const std::string &) {
        send_raw(fd, "KFAUTHC1" + kNonceN + be32(10) + "abc");
      },
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
        m[8 + 16 + 4 + 2] = '2';
        send_raw(fd, m);
      },
      "client MAC mismatch");
  // Authenticated but with an id that would corrupt logs.
  expect_server_rejects(
      [](int fd, const std::string &nonce) {
        send_raw(fd, client_msg("s3cret", nonce, "h:1\nfake"));
      },
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
        std::string hello = "KFAUTHS1" + std::string(16, '\x07');
        send_raw(fd, hello);
        char buf[8 + 16 + 4 + 3 + 32];
        std::string err;
        if (kungfu::recv_all(fd, buf, sizeof(buf), &err)) {
          captured.assign(buf, sizeof(buf));
        }
      },
      real_client("s3cret", "h:1", &c));
  CHECK(captured.size() == 63);
  CHECK(!c.ok);
  CHECK_ERR(c.err, "server closed the connection");
  // ...it is useless against a real server, which picks a fresh nonce.
  expect_server_rejects(
      [&](int fd, const std::string &) { send_raw(fd, captured); },
      "client MAC mismatch");
}

void test_handshake_timeouts() {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  expect_server_rejects(
      [](int, const std::string &) {
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
      },
      "timed out waiting for client magic", 0.2);
  // Each byte arrives well within the timeout, but the deadline covers the
  // whole handshake, so dribbling cannot keep the server busy.
  expect_server_rejects(
      [](int fd, const std::string &) {
        const std::string magic = "KFAUTHC1";
        for (char ch : magic) {
          if (!send_raw(fd, std::string(1, ch))) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      },
      "timed out waiting for client magic", 0.35);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(secs < 3);

  // A server that goes silent after the hello cannot hold the client either.
  Result c;
  run_pair(
      [](int fd) {
        send_raw(fd, "KFAUTHS1" + std::string(16, 'n'));
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
      },
      real_client("s3cret", "h:1", &c, 0.2));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "timed out waiting for server MAC");
  CHECK(c.rcv_timeout_after == 0);
}

void test_handshake_hostile_servers() {
  Result c;
  run_pair([](int fd) { send_raw(fd, std::string(24, '?')); },
           real_client("s3cret", "h:1", &c));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "bad server magic");

  // An impostor that does not know the secret answers with junk.
  Result c2;
  run_pair(
      [](int fd) {
        send_raw(fd, "KFAUTHS1" + std::string(16, 'n'));
        char buf[8 + 16 + 4 + 3 + 32];
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
        send_raw(fd, "KFAUTHS1" + std::string(16, 'n'));
        char buf[8 + 16 + 4 + 3 + 32];
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
}

void test_handshake_bad_self_id() {
  Result s, c;
  run_pair(real_server("s3cret", &s),
           real_client("s3cret",
                       std::string(kungfu::kHandshakeMaxIdLen + 1, 'x'), &c));
  CHECK(!c.ok);
  CHECK_ERR(c.err, "own id");
  CHECK(!s.ok);

  Result s2, c2;
  run_pair(real_server("s3cret", &s2), real_client("s3cret", "", &c2));
  CHECK(!c2.ok);
  CHECK_ERR(c2.err, "own id");
  CHECK(!s2.ok);

  Result s3, c3;
  run_pair(real_server("s3cret", &s3),
           real_client("s3cret", std::string("a\0b", 3), &c3));
  CHECK(!c3.ok);
  CHECK_ERR(c3.err, "control characters");
}

}  // namespace

int main() {
  test_sha256();
  test_hmac();
  test_primitives();
  test_handshake_ok();
  test_handshake_wrong_secret();
  test_handshake_empty_secret();
  test_handshake_hostile_clients();
  test_handshake_replay();
  test_handshake_timeouts();
  test_handshake_hostile_servers();
  test_handshake_bad_self_id();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}
