// Frame authentication in the transport (KUNGFU_AUTHENTICATE_FRAMES): with it
// on, every collective and point-to-point exchange still gives exact results,
// frames of every size are tagged and verified (partial writes included), and
// two workers that disagree on a connection fail its handshake with both
// settings named instead of misreading each other's frames. By default only
// connections between two hosts authenticate (tests/test_multihost_collectives.py
// checks that side); here, on one host, none do.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "socket_io.h"

#include "test_util.h"

using namespace kungfu;
using kftest::all_reduce_everywhere;
using kftest::contains;

namespace {

// One runtime per entry of `policy`. `timeouts`: rank r's (empty: 30 s each,
// which only turns a hang into a failure: nothing here is meant to time out
// unless a test says so).
std::vector<std::unique_ptr<Runtime>> authenticated_cluster(const std::vector<FrameAuthPolicy> &policy,
                                                            TopologyKind topo, std::vector<double> timeouts = {},
                                                            bool unix_sockets = true) {
  const int n = static_cast<int>(policy.size());
  if (timeouts.empty()) timeouts.assign(n, 30);
  std::vector<PeerID> peers = kftest::local_peers(n);
  std::vector<std::unique_ptr<Runtime>> rts(n);
  for (int r = 0; r < n; ++r) {
    RuntimeOptions o = kftest::options(peers, r, topo, timeouts[r]);
    o.frame_auth = policy[r];
    o.same_host_unix_sockets = unix_sockets;
    CHECK_OK(Runtime::create(o, &rts[r]));
  }
  return rts;
}

void test_exact_results_with_authenticated_frames() {
  for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing}) {
    const FrameAuthPolicy on = FrameAuthPolicy::kAlways;
    auto rts = authenticated_cluster({on, on, on}, topo);
    for (size_t count : {size_t(1), size_t(1000), size_t(300000), size_t(4 << 20)}) {  // up to 16 MiB: partial writes
      std::vector<std::vector<float>> in(3);
      for (int r = 0; r < 3; ++r) {
        in[r].resize(count);
        for (size_t i = 0; i < count; ++i) in[r][i] = float((r + 1) * (i % 13));
      }
      std::vector<Status> st = all_reduce_everywhere(rts, "x" + std::to_string(count), in);
      for (int r = 0; r < 3; ++r) {
        CHECK_OK(st[r]);
        bool exact = true;
        for (size_t i = 0; i < count; ++i) exact = exact && in[r][i] == float(6 * (i % 13));
        CHECK(exact);
      }
    }
    std::vector<float> blob(1000, 3.5f), got(1000, 0);
    rts[2]->save("model", 7, blob.data(), blob.size() * sizeof(float));
    CHECK_OK(kftest::wait_for(
        [&](DoneCallback d) { rts[0]->request(2, "model", 7, got.data(), got.size() * sizeof(float), nullptr, d); }));
    CHECK(got == blob);
    // Every rank sent or received through an authenticated connection.
    for (auto &rt : rts) CHECK(rt->authenticated_connections() > 0);
  }
}

// Same-host connections (Unix sockets, loopback TCP) are not authenticated
// unless KUNGFU_AUTHENTICATE_FRAMES=1: nobody can tamper with them without
// already owning the host.
void test_same_host_connections_are_not_authenticated_by_default() {
  for (bool unix_sockets : {true, false}) {
    const FrameAuthPolicy dflt = FrameAuthPolicy::kAcrossHosts;
    auto rts = authenticated_cluster({dflt, dflt}, TopologyKind::kStar, {}, unix_sockets);
    std::vector<std::vector<float>> in = {std::vector<float>(1000, 1), std::vector<float>(1000, 2)};
    std::vector<Status> st = all_reduce_everywhere(rts, "local", in);
    for (int r = 0; r < 2; ++r) {
      CHECK_OK(st[r]);
      CHECK(in[r] == std::vector<float>(1000, 3));
      CHECK(rts[r]->authenticated_connections() == 0);
    }
  }
}

// Which sockets count as joining two hosts.
void test_connects_two_hosts() {
  int pair[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  Fd a(pair[0]), b(pair[1]);
  CHECK(!connects_two_hosts(a.get()));
  CHECK(connects_two_hosts(-1));  // unreadable: authenticate rather than not
  // TCP to a loopback address other than 127.0.0.1.
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.5", &addr.sin_addr);
  CHECK(::bind(listener.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  CHECK(::listen(listener.get(), 1) == 0);
  socklen_t len = sizeof(addr);
  CHECK(::getsockname(listener.get(), reinterpret_cast<sockaddr *>(&addr), &len) == 0);
  Fd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  CHECK(::connect(client.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  Fd server(::accept(listener.get(), nullptr, nullptr));
  CHECK(!connects_two_hosts(client.get()));
  CHECK(!connects_two_hosts(server.get()));
}

void test_disagreeing_workers_fail_their_handshake() {
  // A client fails at once, naming both sides' settings; a rank that cannot
  // hear from its peer at all times out. In a star of two, rank 1 is the
  // client (it sends to the root first) and rank 0 the one that times out:
  // its short timeout is what the test costs, while rank 1's is long, so its
  // failure can only be the handshake's, however slow the machine.
  struct Case {
    FrameAuthPolicy a, b;
    std::vector<const char *> named;
  };
  for (const Case &c : {Case{FrameAuthPolicy::kAlways,
                             FrameAuthPolicy::kNever,
                             {"KUNGFU_AUTHENTICATE_FRAMES=1", "KUNGFU_AUTHENTICATE_FRAMES=0"}},
                        Case{FrameAuthPolicy::kAlways,
                             FrameAuthPolicy::kAcrossHosts,
                             {"KUNGFU_AUTHENTICATE_FRAMES=1", "KUNGFU_AUTHENTICATE_FRAMES unset",
                              "sees the connection as within one host"}}}) {
    auto rts = authenticated_cluster({c.a, c.b}, TopologyKind::kStar, {2, 60});
    std::vector<std::vector<float>> in = {std::vector<float>(4, 1), std::vector<float>(4, 2)};
    std::vector<Status> st = all_reduce_everywhere(rts, "mixed", in);
    CHECK(!st[0].ok() && !st[1].ok());
    bool named = false;
    for (const Status &s : st) {
      bool all = contains(s.message(), "frame authentication differs");
      for (const char *what : c.named) all = all && contains(s.message(), what);
      named = named || all;
    }
    if (!named) std::fprintf(stderr, "  %s\n  %s\n", st[0].ToString().c_str(), st[1].ToString().c_str());
    CHECK(named);
    CHECK(in[0][0] == 1 && in[1][0] == 2);  // nothing was mixed in
  }
}

// A man in the middle on the link from rank 1 to rank 0: forwards every byte
// but flips one bit deep in the stream (inside a large payload). Rank 1's
// cluster names rank 0 by the proxy's address; rank 0 listens on its own.
class BitFlippingProxy {
 public:
  BitFlippingProxy(const PeerID &listen_at, const PeerID &forward_to, size_t flip_at) : flip_at_(flip_at) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = address(listen_at);
    ::bind(listener_.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ::listen(listener_.get(), 4);
    thread_ = std::thread([this, forward_to] {
      Fd client(::accept(listener_.get(), nullptr, nullptr));
      if (!client.valid()) return;
      Fd server(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in b = address(forward_to);
      if (::connect(server.get(), reinterpret_cast<sockaddr *>(&b), sizeof(b)) != 0) return;
      std::thread back([&] { pump(server.get(), client.get(), false); });
      pump(client.get(), server.get(), true);
      ::shutdown(server.get(), SHUT_RDWR);
      ::shutdown(client.get(), SHUT_RDWR);
      back.join();
    });
  }
  ~BitFlippingProxy() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  bool flipped() const { return flipped_; }

 private:
  static sockaddr_in address(const PeerID &p) {
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(p.port);
    ::inet_pton(AF_INET, p.host.c_str(), &a.sin_addr);
    return a;
  }
  void pump(int from, int to, bool tamper) {
    std::vector<char> buf(1 << 16);
    size_t seen = 0;
    for (;;) {
      ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
      if (n <= 0) return;
      if (tamper && !flipped_ && seen + size_t(n) > flip_at_) {
        buf[flip_at_ - seen] ^= 0x10;
        flipped_ = true;
      }
      seen += size_t(n);
      std::string err;
      if (!send_all(to, buf.data(), size_t(n), &err)) return;
    }
  }
  const size_t flip_at_;
  Fd listener_;
  std::atomic<bool> flipped_{false};
  std::thread thread_;
};

// With authentication the tampered frame breaks the connection and the op
// fails naming why; without it the same flipped bit silently changes the sum
// (which is what the option is for, across hosts one does not control).
void test_tampered_frame_is_caught() {
  // Authenticated frames stream in 128 KiB segments (frame_auth.h): flip a
  // bit in the first, a middle and the last segment of the 1 MiB frame.
  struct Case {
    bool authenticate;
    size_t flip_at;  // bytes into the connection (the handshake takes ~200)
  };
  for (const Case &c : {Case{true, 1000}, Case{true, 200000}, Case{true, 1048000}, Case{false, 200000}}) {
    const bool authenticate = c.authenticate;
    uint16_t p0 = kftest::free_port(), p1 = kftest::free_port(), proxy_port = kftest::free_port();
    // A reduce to rank 0 uses the link 1 -> 0 only, so the two views of the
    // cluster differ only in where rank 1 finds rank 0.
    std::vector<PeerID> seen_by_0 = {{"127.0.0.1", p0}, {"127.0.0.2", p1}};
    std::vector<PeerID> seen_by_1 = {{"127.0.0.3", proxy_port}, {"127.0.0.2", p1}};
    BitFlippingProxy proxy({"127.0.0.3", proxy_port}, {"127.0.0.1", p0}, c.flip_at);
    std::vector<std::unique_ptr<Runtime>> rts(2);
    for (int r = 0; r < 2; ++r) {
      // The tampered op fails as soon as the connection breaks (or, without
      // authentication, succeeds): the timeout only turns a hang into a
      // failure, so it is far above that, or a slow machine would fail the
      // op on the timeout before the tampering shows.
      RuntimeOptions o = kftest::options(r == 0 ? seen_by_0 : seen_by_1, r, TopologyKind::kStar, 30);
      o.frame_auth = authenticate ? FrameAuthPolicy::kAlways : FrameAuthPolicy::kNever;
      CHECK_OK(Runtime::create(o, &rts[r]));
    }
    const size_t count = 1 << 18;  // 1 MiB: the flip lands inside a payload
    std::vector<std::vector<float>> in = {std::vector<float>(count, 1.0f), std::vector<float>(count, 2.0f)};
    std::vector<std::future<Status>> fs;
    for (int r = 0; r < 2; ++r) {
      auto p = std::make_shared<std::promise<Status>>();
      fs.push_back(p->get_future());
      std::vector<float> &v = in[r];
      rts[r]->reduce("tampered",
                     Buffer{v.data(), v.data(), TensorDesc{DType::kFloat32, {int64_t(count)}, count}, nullptr},
                     ReduceOp::kSum, 0, [p](const Status &s) { p->set_value(s); });
    }
    Status root = fs[0].get();
    fs[1].get();
    CHECK(proxy.flipped());
    if (authenticate) {
      CHECK(!root.ok());
      if (!contains(root.message(), "frame authentication failed"))
        std::fprintf(stderr, "  %s\n", root.ToString().c_str());
      CHECK(contains(root.message(), "frame authentication failed"));
    } else {
      bool all_three = true;
      for (float x : in[0]) all_three = all_three && x == 3.0f;
      CHECK(root.ok() && !all_three);
    }
    rts.clear();
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"exact_results_with_authenticated_frames", test_exact_results_with_authenticated_frames},
      {"same_host_connections_are_not_authenticated_by_default",
       test_same_host_connections_are_not_authenticated_by_default},
      {"connects_two_hosts", test_connects_two_hosts},
      {"disagreeing_workers_fail_their_handshake", test_disagreeing_workers_fail_their_handshake},
      {"tampered_frame_is_caught", test_tampered_frame_is_caught},
  });
}
