// Shared helpers for the standalone C++ runtime tests: a CHECK macro, free
// ports, and an in-process cluster of runtimes talking over real sockets.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime.h"

namespace kftest {

// Atomic: tests CHECK from callbacks and helper threads too.
inline std::atomic<int> &failures() {
  static std::atomic<int> n{0};
  return n;
}
inline std::atomic<int> &checks() {
  static std::atomic<int> n{0};
  return n;
}

#define CHECK(cond)                                                                 \
  do {                                                                              \
    ++kftest::checks();                                                             \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++kftest::failures();                                                         \
    }                                                                               \
  } while (0)

#define CHECK_OK(status)                                                                      \
  do {                                                                                        \
    ++kftest::checks();                                                                       \
    kungfu::Status _s = (status);                                                             \
    if (!_s.ok()) {                                                                           \
      std::fprintf(stderr, "%s:%d: not OK: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      ++kftest::failures();                                                                   \
    }                                                                                         \
  } while (0)

inline int report() {
  std::printf("%d passed, %d failed\n", checks() - failures(), failures().load());
  return failures() == 0 ? 0 : 1;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Polls `done` every 5 ms until it holds; false if it still does not after
// `deadline` seconds. Tests wait for an event this way instead of sleeping
// for as long as it "should" take: the deadline only turns a hang into a
// failure, so it is far above the event's usual latency (milliseconds) and a
// loaded machine merely makes the wait longer.
template <typename Pred>
bool eventually(Pred done, double deadline = 30) {
  auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (seconds_since(start) > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline bool contains(const std::string &text, const std::string &needle) {
  return text.find(needle) != std::string::npos;
}

struct NamedTest {
  const char *name;
  void (*fn)();
};

// Runs every test, printing one line each (name, ok/FAILED, seconds); the exit status.
inline int run_tests(std::initializer_list<NamedTest> tests) {
  for (const NamedTest &t : tests) {
    int before = failures();
    auto start = std::chrono::steady_clock::now();
    t.fn();
    std::printf("%-36s %s (%.1fs)\n", t.name, failures() == before ? "ok" : "FAILED", seconds_since(start));
  }
  return report();
}

// A loopback port that was free a moment ago.
inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<struct sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<struct sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline std::vector<kungfu::PeerID> local_peers(int n) {
  std::vector<kungfu::PeerID> peers;
  for (int i = 0; i < n; ++i) peers.push_back(kungfu::PeerID{"127.0.0.1", free_port()});
  return peers;
}

// The job id every runtime of make_cluster has (cluster version 0).
constexpr char kTestJobId[] = "test-job";

inline kungfu::RuntimeOptions options(const std::vector<kungfu::PeerID> &peers, int rank,
                                      kungfu::TopologyKind topo = kungfu::TopologyKind::kAuto, double timeout = 20) {
  kungfu::RuntimeOptions o;
  o.cluster = kungfu::Cluster(0, peers);
  o.self_rank = rank;
  o.secret = "test-secret";
  o.job_id = kTestJobId;
  o.timeout_seconds = timeout;
  o.topology = topo;
  return o;
}

// One runtime per entry of `timeouts` (rank r's timeout in seconds) in this
// process. A port that free_port() found free can be taken before its
// runtime binds it (an ephemeral port of some connection, or the same port
// picked twice): then the whole cluster is made again on fresh ports, a few
// times, before giving up.
inline std::vector<std::unique_ptr<kungfu::Runtime>> make_cluster(const std::vector<double> &timeouts,
                                                                  kungfu::TopologyKind topo, size_t chunk = 1 << 20) {
  constexpr int kAttempts = 5;
  const int n = static_cast<int>(timeouts.size());
  for (int attempt = 1;; ++attempt) {
    std::vector<kungfu::PeerID> peers = local_peers(n);
    std::vector<std::unique_ptr<kungfu::Runtime>> rts(n);
    kungfu::Status failed;
    for (int r = 0; r < n && failed.ok(); ++r) {
      kungfu::RuntimeOptions o = options(peers, r, topo, timeouts[r]);
      o.chunk_bytes = chunk;
      failed = kungfu::Runtime::create(o, &rts[r]);
    }
    if (failed.ok()) return rts;
    const bool port_taken = failed.ToString().find("Address already in use") != std::string::npos;
    if (!port_taken || attempt == kAttempts) {
      std::fprintf(stderr, "cannot create runtime (attempt %d): %s\n", attempt, failed.ToString().c_str());
      std::exit(2);
    }
  }
}

// n runtimes, all with the same timeout.
inline std::vector<std::unique_ptr<kungfu::Runtime>> make_cluster(int n, kungfu::TopologyKind topo, double timeout = 20,
                                                                  size_t chunk = 1 << 20) {
  return make_cluster(std::vector<double>(n, timeout), topo, chunk);
}

// Runs an async operation and waits for its status.
template <typename F>
kungfu::Status wait_for(F start) {
  auto p = std::make_shared<std::promise<kungfu::Status>>();
  auto f = p->get_future();
  start([p](const kungfu::Status &s) { p->set_value(s); });
  return f.get();
}

// Starts an all-reduce (sum) of inputs[r] on every runtime at once, in place;
// the statuses in rank order.
inline std::vector<kungfu::Status> all_reduce_everywhere(std::vector<std::unique_ptr<kungfu::Runtime>> &rts,
                                                         const std::string &name,
                                                         std::vector<std::vector<float>> &inputs) {
  std::vector<std::future<kungfu::Status>> fs;
  for (size_t r = 0; r < rts.size(); ++r) {
    auto p = std::make_shared<std::promise<kungfu::Status>>();
    fs.push_back(p->get_future());
    std::vector<float> &v = inputs[r];
    kungfu::Buffer b{v.data(), v.data(),
                     kungfu::TensorDesc{kungfu::DType::kFloat32, {static_cast<int64_t>(v.size())}, v.size()}, nullptr};
    rts[r]->all_reduce(name, b, kungfu::ReduceOp::kSum, [p](const kungfu::Status &s) { p->set_value(s); });
  }
  std::vector<kungfu::Status> out;
  for (auto &f : fs) out.push_back(f.get());
  return out;
}

}  // namespace kftest
