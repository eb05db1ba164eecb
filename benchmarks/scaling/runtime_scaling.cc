// How the communication runtime scales with the number of workers, without
// TensorFlow: NP forked processes on loopback, each with its own runtime, on
// one topology, with tiny (4-byte) messages. Measures, in this order:
//   * resources per worker once the topology's links are up: threads, open
//     descriptors and resident memory, read from /proc/self (max and mean
//     over the workers);
//   * all-reduce latency (4 B, sum) and consensus latency (8 bytes, KungFu
//     Alg. 1): medians over REPEATS timed loops of ITERS calls, on rank 0;
//   * the time of three membership changes through Runtime::update_cluster,
//     each up to the first all-reduce on the new version completing on rank 0:
//       shrink: the last rank leaves in order (shutdown), the others switch;
//       grow:   a pre-warmed joiner (a runtime already listening) comes in;
//       crash:  the last rank is SIGKILLed; the survivors' all-reduce fails
//               (detection), they switch without it and all-reduce again.
//
//   runtime_scaling NP TOPOLOGY ITERS REPEATS
//
// Prints one line from rank 0:
//   RESULT {"np": 32, "topology": "STAR", "threads_max": ..., ...}
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime.h"

namespace {

using kungfu::Buffer;
using kungfu::Cluster;
using kungfu::DoneCallback;
using kungfu::PeerID;
using kungfu::Runtime;
using kungfu::Status;
using Clock = std::chrono::steady_clock;

// Shared by the forked processes (MAP_SHARED): the joiner and the victim
// act when rank 0 says so, since neither is in a cluster with it then.
struct Control {
  std::atomic<int> grow_now{0};
  std::atomic<int> crash_now{0};
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status wait_op(const std::function<void(DoneCallback)> &start) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  start([p](const Status &s) { p->set_value(s); });
  return f.get();
}

Status all_reduce(Runtime &rt, const std::string &name) {
  auto v = std::make_shared<float>(1.0f);
  Buffer b{v.get(), v.get(), kungfu::TensorDesc{kungfu::DType::kFloat32, {1}, 1}, v};
  return wait_op([&](DoneCallback d) { rt.all_reduce(name, b, kungfu::ReduceOp::kSum, d); });
}

Status consensus(Runtime &rt, const std::string &name) {
  std::vector<char> bytes(8, 'k');
  return wait_op([&](DoneCallback d) {
    rt.consensus(name, bytes, [d](const Status &s, bool agreed) {
      d(s.ok() && !agreed ? kungfu::Internal("consensus disagreed on equal bytes") : s);
    });
  });
}

Status barrier(Runtime &rt, const std::string &name) {
  return wait_op([&](DoneCallback d) { rt.barrier(name, d); });
}

// Median seconds per call over `repeats` loops of `iters` calls of `op`.
Status time_op(Runtime &rt, const char *what, int iters, int repeats,
               const std::function<Status(const std::string &)> &op, double *median) {
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    Status s = barrier(rt, std::string(what) + "-barrier" + std::to_string(r));
    auto t0 = Clock::now();
    for (int i = 0; s.ok() && i < iters; ++i) s = op(std::string(what) + std::to_string(r * iters + i));
    if (!s.ok()) return s;
    samples.push_back(since(t0) / iters);
  }
  std::sort(samples.begin(), samples.end());
  *median = samples[samples.size() / 2];
  return Status::OK();
}

// Threads, open descriptors and resident kilobytes of this process.
std::vector<double> resources() {
  double threads = 0, rss_kb = 0, fds = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) threads = std::atof(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) rss_kb = std::atof(line.c_str() + 6);
  }
  if (DIR *d = ::opendir("/proc/self/fd")) {
    while (dirent *e = ::readdir(d)) fds += e->d_name[0] != '.';
    ::closedir(d);
    fds -= 1;  // the directory stream itself
  }
  return {threads, fds, rss_kb};
}

// resources() summed and maxed over the workers (STAR: the same on every topology).
Status gather_resources(Runtime &rt, std::vector<double> *sum, std::vector<double> *max) {
  *sum = resources();
  *max = *sum;
  for (auto [out, op, name] : {std::tuple{sum, kungfu::ReduceOp::kSum, "resources-sum"},
                               std::tuple{max, kungfu::ReduceOp::kMax, "resources-max"}}) {
    Buffer b{out->data(), out->data(), kungfu::TensorDesc{kungfu::DType::kFloat64, {3}, 3}, nullptr};
    Status s = wait_op([&](DoneCallback d) { rt.all_reduce_on(kungfu::TopologyKind::kStar, name, b, op, d); });
    if (!s.ok()) return s;
  }
  return Status::OK();
}

kungfu::RuntimeOptions options(const std::vector<PeerID> &peers, uint32_t version, int rank,
                               kungfu::TopologyKind topo) {
  kungfu::RuntimeOptions o;
  o.cluster = Cluster(version, peers);
  o.self_rank = rank;
  o.secret = "benchmark";
  o.job_id = "scaling";
  o.timeout_seconds = 60;
  o.topology = topo;
  return o;
}

#define TRY(expr, what)                                                             \
  do {                                                                              \
    Status _s = (expr);                                                             \
    if (!_s.ok()) {                                                                 \
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, _s.ToString().c_str()); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

struct Args {
  int np, iters, repeats;
  kungfu::TopologyKind topo;
  const char *topo_name;
  std::vector<PeerID> peers;  // np ranks, then the joiner's port
  Control *control;
};

// The last rank: leaves at the shrink, joins again on a fresh port at the
// grow, and is killed at the crash.
int run_last(const Args &a, std::unique_ptr<Runtime> rt) {
  const int rank = a.np - 1;
  TRY(all_reduce(*rt, "warm-up"), "warm-up");
  double unused = 0;
  TRY(time_op(
          *rt, "ar", a.iters, a.repeats, [&](const std::string &n) { return all_reduce(*rt, n); }, &unused),
      "all-reduce");
  TRY(time_op(
          *rt, "cs", 1, a.repeats, [&](const std::string &n) { return consensus(*rt, n); }, &unused),
      "consensus");
  std::vector<double> sum, max;
  TRY(gather_resources(*rt, &sum, &max), "resources");
  TRY(barrier(*rt, "before-shrink"), "barrier");
  rt->shutdown();
  rt.reset();
  // Pre-warmed joiner: listening alone on a fresh port before the grow.
  std::unique_ptr<Runtime> joiner;
  TRY(Runtime::create(options({a.peers[a.np]}, 0, 0, a.topo), &joiner), "joiner");
  while (a.control->grow_now.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  std::vector<PeerID> v2(a.peers.begin(), a.peers.begin() + a.np - 1);
  v2.push_back(a.peers[a.np]);
  TRY(joiner->update_cluster(Cluster(2, v2)), "grow");
  TRY(all_reduce(*joiner, "grown"), "all-reduce after grow");
  TRY(barrier(*joiner, "before-crash"), "barrier");
  while (a.control->crash_now.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  ::raise(SIGKILL);
  return 1;
}

int run_member(const Args &a, int rank, std::unique_ptr<Runtime> rt) {
  TRY(all_reduce(*rt, "warm-up"), "warm-up");
  double ar_s = 0, cs_s = 0;
  TRY(time_op(
          *rt, "ar", a.iters, a.repeats, [&](const std::string &n) { return all_reduce(*rt, n); }, &ar_s),
      "all-reduce");
  TRY(time_op(
          *rt, "cs", 1, a.repeats, [&](const std::string &n) { return consensus(*rt, n); }, &cs_s),
      "consensus");
  std::vector<double> res, mx;
  TRY(gather_resources(*rt, &res, &mx), "resources");
  TRY(barrier(*rt, "before-shrink"), "barrier");

  // Shrink by one: the last rank leaves in order.
  auto t0 = Clock::now();
  std::vector<PeerID> v1(a.peers.begin(), a.peers.begin() + a.np - 1);
  TRY(rt->update_cluster(Cluster(1, v1)), "shrink");
  TRY(all_reduce(*rt, "shrunk"), "all-reduce after shrink");
  double shrink_s = since(t0);

  // Grow by one: the pre-warmed joiner comes in on its fresh port.
  TRY(barrier(*rt, "before-grow"), "barrier");
  t0 = Clock::now();
  if (rank == 0) a.control->grow_now = 1;
  std::vector<PeerID> v2 = v1;
  v2.push_back(a.peers[a.np]);
  TRY(rt->update_cluster(Cluster(2, v2)), "grow");
  TRY(all_reduce(*rt, "grown"), "all-reduce after grow");
  double grow_s = since(t0);

  // Crash of one: the joiner is killed; the survivors' next all-reduce
  // fails when its connection breaks, then they go on without it.
  TRY(barrier(*rt, "before-crash"), "barrier");
  t0 = Clock::now();
  if (rank == 0) a.control->crash_now = 1;
  Status doomed = all_reduce(*rt, "doomed");
  double detect_s = since(t0);
  if (doomed.ok()) {
    std::fprintf(stderr, "rank %d: the all-reduce without the killed rank succeeded\n", rank);
    return 1;
  }
  TRY(rt->update_cluster(Cluster(3, v1)), "crash");
  TRY(all_reduce(*rt, "survived"), "all-reduce after crash");
  double crash_s = since(t0);
  if (rank == 0) {
    int n = a.np;
    std::printf(
        "RESULT {\"np\": %d, \"topology\": \"%s\", \"threads_max\": %.0f, \"threads_mean\": %.2f, "
        "\"fds_max\": %.0f, \"fds_mean\": %.2f, \"rss_kb_max\": %.0f, \"rss_kb_mean\": %.1f, "
        "\"all_reduce_s\": %.9f, \"consensus_s\": %.9f, \"shrink_s\": %.6f, \"grow_s\": %.6f, "
        "\"crash_detect_s\": %.6f, \"crash_s\": %.6f}\n",
        n, a.topo_name, mx[0], res[0] / n, mx[1], res[1] / n, mx[2], res[2] / n, ar_s, cs_s, shrink_s, grow_s, detect_s,
        crash_s);
    std::fflush(stdout);
  }
  // Nobody exits while a peer may still be sending to it: a barrier, then
  // leaving in order (queued frames written, goodbyes said).
  TRY(barrier(*rt, "end"), "barrier");
  rt->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: runtime_scaling NP TOPOLOGY ITERS REPEATS\n");
    return 2;
  }
  Args a;
  a.np = std::atoi(argv[1]);
  a.topo_name = argv[2];
  a.iters = std::atoi(argv[3]);
  a.repeats = std::atoi(argv[4]);
  Status s = kungfu::parse_topology(argv[2], &a.topo);
  if (!s.ok() || a.np < 3 || a.iters < 1 || a.repeats < 1) {
    std::fprintf(stderr, "bad arguments: %s\n", s.ok() ? "NP >= 3, ITERS >= 1, REPEATS >= 1" : s.ToString().c_str());
    return 2;
  }
  void *shared = ::mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 2;
  a.control = new (shared) Control();
  // Ports next to a random base: the benchmark runs alone on loopback.
  int base = 20000 + static_cast<int>(getpid() % 20000);
  for (int r = 0; r <= a.np; ++r) a.peers.push_back(PeerID{"127.0.0.1", static_cast<uint16_t>(base + r)});
  std::vector<PeerID> v0(a.peers.begin(), a.peers.begin() + a.np);
  std::vector<pid_t> children;
  for (int r = 0; r < a.np; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      const int rank = r;
      std::unique_ptr<Runtime> rt;
      TRY(Runtime::create(options(v0, 0, r, a.topo), &rt), "create");
      std::_Exit(r == a.np - 1 ? run_last(a, std::move(rt)) : run_member(a, r, std::move(rt)));
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    waitpid(children[i], &status, 0);
    bool killed_as_planned = i + 1 == children.size() && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!killed_as_planned && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) failed = 1;
  }
  return failed;
}
