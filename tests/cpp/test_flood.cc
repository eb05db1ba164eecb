// Strangers cannot kill, bloat, stall or lock out a worker.
//
// flood_while_training: parallel plain connect/close floods one worker's
// port while the job runs all-reduces and a peer of the job keeps opening
// handshakes. The work is bounded by what it proves, not by the host's
// speed: at least 40 times the handshake slots (Transport::kMaxHandshakes)
// and at least 5 of the acceptor's reaping periods (1 s each). Before the
// first fix every accepted connection left an unjoined thread (8 MiB of
// stack each: 3,000 connections raised the virtual size by 26 GB), one log
// line, and at the thread limit the worker died. Before the second, a
// serial flood ran at ~146 connections/s: the worker accepted one
// connection per poll() from a 128-deep queue, so whenever the acceptor was
// descheduled for ~3 ms the queue overflowed and the kernel dropped SYNs,
// each costing its client (a stranger or a peer of the job) a 1 s
// retransmission; a median connection took 23 us, and five 1 s stalls made
// most of the run. Now the queue is 4,096 deep and drained per wake-up:
// here (2 cores) one serial flooder reaches ~24,000 connections/s between
// stalls and 4 parallel ones ~5,000/s in all (the acceptor's thread starts
// are the limit; past it the kernel sheds SYNs, which is what it is for),
// and a peer's handshake meanwhile gets through in a median 0.4 ms.
//
// silent_strangers_cannot_lock_out_peers: strangers that connect and say
// nothing used to hold every handshake slot for the whole handshake timeout
// (10 s), during which the job's own peers were dropped at the door.
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "handshake.h"
#include "test_util.h"

using namespace kungfu;
using kftest::make_cluster;

namespace {

// A field of /proc/self/status ("Threads", "VmSize", "VmRSS"), in its unit.
long status_field(const std::string &name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, name.size() + 1, name + ":") == 0) return std::stol(line.substr(name.size() + 1));
  }
  return -1;
}

Fd connect_to(uint16_t port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<struct sockaddr *>(&a), sizeof(a)) != 0) return Fd();
  return fd;
}

// Connects to 127.0.0.1:port and closes at once with a reset (no TIME_WAIT,
// so tens of thousands of them do not run out of ephemeral ports).
bool stranger_connect(uint16_t port) {
  Fd fd = connect_to(port);
  if (!fd.valid()) return false;
  struct linger lg = {1, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  return true;
}

// A peer of the job opens a handshake with the worker as a peer does while
// the cluster changes (it claims the next cluster version): the worker
// accepts it, answers with its hello and refuses it as "switching versions",
// without counting or logging it as a stranger, and the job goes on. True if
// the worker answered (the connection got through the door).
//
// `attempts` > 0: that many tries back to back (a test that needs the first
// one to pass). 0: like a real peer (Transport::connect_to) it retries a
// dropped connection with a backoff of 1 ms doubling to 20 ms until its
// dial timeout, `dial_seconds`. A fixed count of back-to-back tries was what
// made flood_while_training flaky under load: a worker whose 64 handshake
// slots hold strangers whose threads have not run yet drops the peer, and
// 20 tries in a few milliseconds could all land before any of them ran
// (6-7 tries were needed beside 3 busy loops); a real peer keeps trying.
bool peer_reaches_handshake(uint16_t port, const std::string &peer_id, int attempts, int *used,
                            double dial_seconds = 0) {
  const auto start = std::chrono::steady_clock::now();
  int backoff_ms = 1;
  for (*used = 1;; ++*used) {
    Fd fd = connect_to(port);
    if (fd.valid()) {
      std::string err;
      VersionSkew skew = VersionSkew::kNone;
      client_handshake(fd.get(), "test-secret", {kftest::kTestJobId, 1}, peer_id, nullptr, &err,
                       kHandshakeTimeoutSeconds, &skew);
      if (skew == VersionSkew::kPeerBehind) return true;
    }
    if (attempts > 0 ? *used >= attempts : kftest::seconds_since(start) > dial_seconds) return false;
    if (attempts == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min(2 * backoff_ms, 20);
    }
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One all-reduce between two runtimes; true if both got the right sum.
bool all_reduce_ok(std::vector<std::unique_ptr<Runtime>> &rts) {
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto pa = std::make_shared<std::promise<Status>>();
  auto fa = pa->get_future();
  rts[0]->all_reduce("step", Buffer{a.data(), a.data(), TensorDesc{DType::kFloat32, {1000}, 1000}, nullptr},
                     ReduceOp::kSum, [pa](const Status &s) { pa->set_value(s); });
  Status sb = kftest::wait_for([&](DoneCallback d) {
    rts[1]->all_reduce("step", Buffer{b.data(), b.data(), TensorDesc{DType::kFloat32, {1000}, 1000}, nullptr},
                       ReduceOp::kSum, d);
  });
  Status sa = fa.get();
  return sa.ok() && sb.ok() && a[999] == 3.0f && b[0] == 3.0f;
}

// Runs all-reduces at a training step's pace until `running` clears.
void train_until(std::vector<std::unique_ptr<Runtime>> &rts, const std::atomic<bool> &running, std::atomic<int> &steps,
                 std::atomic<int> &bad_steps) {
  while (running) {
    if (!all_reduce_ok(rts)) ++bad_steps;
    ++steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a training step's pace, not a busy loop
  }
}

void test_flood_while_training() {
  // KUNGFU_FLOOD_CONNECTIONS raises or lowers the minimum count (make tsan
  // lowers it: each connection is slow under ThreadSanitizer).
  const char *n_env = std::getenv("KUNGFU_FLOOD_CONNECTIONS");
  const int min_connections = n_env != nullptr && std::atoi(n_env) > 0
                                  ? std::atoi(n_env)
                                  : 40 * static_cast<int>(Transport::kMaxHandshakes);
  const double min_seconds = 5.0;  // reaping periods of the acceptor
  const int kFlooders = 4;
  // The worker's log goes to a file for the duration, to count its lines.
  char log_path[] = "/tmp/kungfu-flood-log-XXXXXX";
  int log_fd = ::mkstemp(log_path);
  int saved_stderr = ::dup(2);
  ::dup2(log_fd, 2);

  const double timeout = 30;  // the job's: a peer dials for this long
  auto rts = make_cluster(2, TopologyKind::kStar, timeout);
  const uint16_t port = rts[0]->cluster().peer(0).port;
  const std::string peer_id = rts[0]->cluster().peer(1).str();
  std::atomic<bool> training{true};
  std::atomic<int> steps{0}, bad_steps{0};
  std::thread job([&] { train_until(rts, training, steps, bad_steps); });

  // Warm-up (thread pools, the first connection threads), then the baseline
  // once the job's links are up (it ran steps) and the worker has judged
  // every stranger: events, not a sleep, so a loaded host waits longer.
  for (int i = 0; i < min_connections / 25; ++i) stranger_connect(port);
  CHECK(kftest::eventually([&] { return steps >= 2 && rts[0]->handshakes_in_progress() == 0; }, 120));
  const long threads0 = status_field("Threads"), vm0 = status_field("VmSize"), rss0 = status_field("VmRSS");
  const uint64_t rejected0 = rts[0]->rejected_connections();

  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> sent{0}, connected{0};
  std::atomic<bool> flooding{true};
  std::mutex lat_mu;
  std::vector<double> connect_latency;
  std::vector<std::thread> flooders;
  for (int f = 0; f < kFlooders; ++f) {
    flooders.emplace_back([&] {
      std::vector<double> mine;
      while (flooding) {
        auto t = std::chrono::steady_clock::now();
        connected += stranger_connect(port) ? 1 : 0;
        mine.push_back(kftest::seconds_since(t));
        ++sent;
      }
      std::lock_guard<std::mutex> lock(lat_mu);
      connect_latency.insert(connect_latency.end(), mine.begin(), mine.end());
    });
  }
  // Meanwhile a peer of the job keeps opening handshakes, as it does at every
  // cluster change. The flood also lasts until the job ran a few steps under
  // it (counted, not timed: a loaded host takes longer, not fewer).
  const int min_steps = steps + 10;
  std::vector<double> probe_latency;
  int probes = 0, probes_through = 0, most_attempts = 0;
  while (sent < min_connections || kftest::seconds_since(start) < min_seconds || steps < min_steps) {
    auto t = std::chrono::steady_clock::now();
    int attempts = 0;
    ++probes;
    if (peer_reaches_handshake(port, peer_id, 0, &attempts, timeout)) {
      ++probes_through;
      probe_latency.push_back(kftest::seconds_since(t));
    }
    most_attempts = std::max(most_attempts, attempts);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  flooding = false;
  for (auto &t : flooders) t.join();
  const double flood_seconds = kftest::seconds_since(start);
  // Every connection judged (so `rejected` is complete) and its thread
  // joined (the acceptor reaps once a second; an exited thread keeps its
  // 8 MiB stack mapped until then): waited for, not slept for, since a
  // loaded host takes longer. 120 s only rules out "never": the unfixed
  // worker kept every thread and stack for good, and fails the checks below.
  CHECK(kftest::eventually([&] { return rts[0]->handshakes_in_progress() == 0; }, 120));
  kftest::eventually(
      [&] { return status_field("Threads") <= threads0 + 4 && status_field("VmSize") - vm0 < 512 * 1024; }, 120);
  const long threads1 = status_field("Threads"), vm1 = status_field("VmSize"), rss1 = status_field("VmRSS");
  training = false;
  job.join();
  const uint64_t rejected = rts[0]->rejected_connections() - rejected0;
  rts.clear();

  ::fflush(stderr);
  ::dup2(saved_stderr, 2);
  ::close(saved_stderr);
  ::close(log_fd);
  std::ifstream log(log_path);
  int log_lines = 0;
  for (std::string line; std::getline(log, line);) ++log_lines;
  ::unlink(log_path);

  const int stalls = static_cast<int>(
      std::count_if(connect_latency.begin(), connect_latency.end(), [](double s) { return s > 0.5; }));
  std::printf("  %d connections from %d flooders in %.1f s: %.0f accepted/s (%d connected, %llu rejected)\n",
              sent.load(), kFlooders, flood_seconds, connected / flood_seconds, connected.load(),
              static_cast<unsigned long long>(rejected));
  std::printf("  connect latency: median %.0f us, p99 %.0f us, max %.3f s, %d over 0.5 s (a dropped SYN)\n",
              1e6 * percentile(connect_latency, 0.5), 1e6 * percentile(connect_latency, 0.99),
              percentile(connect_latency, 1.0), stalls);
  std::printf("  a peer's handshake meanwhile: %d of %d got through (most attempts %d), median %.2f ms, max %.3f s\n",
              probes_through, probes, most_attempts, 1e3 * percentile(probe_latency, 0.5),
              percentile(probe_latency, 1.0));
  std::printf(
      "  %d all-reduces (%d bad); threads %ld -> %ld, VmSize %ld -> %ld kB, VmRSS %ld -> %ld kB, %d log lines\n",
      steps.load(), bad_steps.load(), threads0, threads1, vm0, vm1, rss0, rss1, log_lines);
  CHECK(sent >= min_connections);
  CHECK(connected > sent / 2);
  CHECK(rejected >= static_cast<uint64_t>(connected) * 9 / 10);  // the peer's probes are not counted
  CHECK(probes_through == probes && probes > 0);
  CHECK(steps >= min_steps && bad_steps == 0);
  // Flat after warm-up: finished connection threads are joined, stacks freed.
  CHECK(threads1 <= threads0 + 4);
  CHECK(vm1 - vm0 < 512 * 1024);  // kB: the unfixed worker grew ~8 MiB per connection
  CHECK(rss1 - rss0 < 64 * 1024);
  // Rate-limited: a burst of 20, then one line per 10 s, not one per connection.
  CHECK(log_lines <= kftest::seconds_since(start) / 10 + 22);
}

void test_silent_strangers_cannot_lock_out_peers() {
  auto rts = make_cluster(2, TopologyKind::kStar, 30);
  const uint16_t port = rts[0]->cluster().peer(0).port;
  const std::string peer_id = rts[0]->cluster().peer(1).str();
  // Twice as many silent strangers as there are slots: the first 64 take them all.
  std::vector<Fd> silent;
  for (size_t i = 0; i < 2 * Transport::kMaxHandshakes; ++i) silent.push_back(connect_to(port));
  for (int i = 0; i < 3000 && rts[0]->handshakes_in_progress() < Transport::kMaxHandshakes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const size_t taken = rts[0]->handshakes_in_progress();
  // Older than kEvictAfterSeconds (a lower bound: sleeping longer changes nothing, short of the 10 s handshake
  // timeout).
  std::this_thread::sleep_for(std::chrono::duration<double>(Transport::kEvictAfterSeconds + 0.5));
  int attempts = 0;
  auto t = std::chrono::steady_clock::now();
  const bool through = peer_reaches_handshake(port, peer_id, 1, &attempts);
  const double took = kftest::seconds_since(t);
  const uint64_t evicted = rts[0]->evicted_handshakes();
  std::printf("  %zu silent strangers held %zu of %zu slots; a peer's handshake %s in %.2f ms, %llu evicted\n",
              silent.size(), taken, Transport::kMaxHandshakes, through ? "got through" : "was DROPPED", 1e3 * took,
              static_cast<unsigned long long>(evicted));
  CHECK(taken == Transport::kMaxHandshakes);
  CHECK(through);  // at the first attempt: before, every slot stayed taken for 10 s
  CHECK(evicted >= 1);
  silent.clear();
  CHECK(all_reduce_ok(rts));  // the job carries on
}

// Workers listen only on the address the cluster names them by: a worker
// named 127.0.0.2 is not reachable on 127.0.0.1 (before: every interface).
void test_listens_on_its_own_address_only() {
  std::vector<PeerID> peers = {PeerID{"127.0.0.2", kftest::free_port()}, PeerID{"127.0.0.2", kftest::free_port()}};
  std::vector<std::unique_ptr<Runtime>> rts(2);
  for (int r = 0; r < 2; ++r) {
    RuntimeOptions o = kftest::options(peers, r);
    o.same_host_unix_sockets = false;  // the TCP path
    CHECK_OK(Runtime::create(o, &rts[r]));
  }
  CHECK(!stranger_connect(peers[0].port));  // 127.0.0.1: nobody listens there
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  auto pa = std::make_shared<std::promise<Status>>();
  auto fa = pa->get_future();
  rts[0]->all_reduce("x", Buffer{a.data(), a.data(), TensorDesc{DType::kFloat32, {4}, 4}, nullptr}, ReduceOp::kSum,
                     [pa](const Status &s) { pa->set_value(s); });
  CHECK_OK(kftest::wait_for([&](DoneCallback d) {
    rts[1]->all_reduce("x", Buffer{b.data(), b.data(), TensorDesc{DType::kFloat32, {4}, 4}, nullptr}, ReduceOp::kSum,
                       d);
  }));
  CHECK_OK(fa.get());
  CHECK(a[0] == 3.0f && b[3] == 3.0f);
}

}  // namespace

int main() {
  // The VmSize check below catches leaked thread stacks (8 MiB of address
  // space each). glibc gives busy threads their own malloc arena, 64 MiB of
  // address space each, up to 8 per core: on a 16-core host the flood's
  // threads grew VmSize by 720 MB with 1 MB more resident, which failed the
  // check although nothing leaked. A fixed number of arenas makes VmSize
  // independent of the core count.
  mallopt(M_ARENA_MAX, 2);
  return kftest::run_tests({
      {"listens_on_its_own_address_only", test_listens_on_its_own_address_only},
      {"silent_strangers_cannot_lock_out_peers", test_silent_strangers_cannot_lock_out_peers},
      {"flood_while_training", test_flood_while_training},
  });
}
