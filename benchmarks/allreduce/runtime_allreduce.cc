// All-reduce through the communication runtime alone, without TensorFlow:
// np forked processes on loopback, each with its own runtime. Separates what
// the runtime costs from what TF op dispatch costs in the main benchmark.
//
//   runtime_allreduce NP TOPOLOGY BYTES ITERS REPEATS [NAMES | PEERS RANK [NAMES]]
//   (KUNGFU_AUTHENTICATE_FRAMES=1 tags and verifies every frame, =0 none;
//   unset: only frames between hosts; KUNGFU_SHM=0: same-host peers talk
//   through Unix sockets instead of shared-memory rings; KUNGFU_AUTO_PROBES,
//   KUNGFU_AUTO_PRUNE and KUNGFU_AUTO_LOG as in a job)
//
// With PEERS (host:port,... of all NP ranks) and RANK, runs that one rank in
// this process instead of forking NP on loopback: start one per host (or
// network namespace) to measure across a link. NAMES is "unique" (the
// default: every call a new name), "repeated" (every call the same name,
// as a training step all-reduces one gradient: AUTO's probe takes one sample
// after each call of a name but its first, so only this lets it run; the
// timed calls carry the probe) or "settled" (repeated, and AUTO is timed
// only once every worker holds its choice: its steady state).
//
// Prints one line from rank 0:
//   RESULT {"np": 2, "topology": "STAR", "auto_choice": "", "transport": "shm", "size": 4, "median_s": ...,
//           "polled_frames": ..., "timed_calls": ..., "samples": [...]}
// (auto_choice: for AUTO, the topology its probe chose for this size;
// calls_held_for_sample: rank 0's calls that waited for a timed sample of
// the probe, auto_topology.h;
// polled_frames: frames rank 0's caller took from the rings itself during
// the timed calls, the rest went through the receiving threads.)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "env_values.h"
#include "runtime.h"

namespace {

using kungfu::Buffer;
using kungfu::DoneCallback;
using kungfu::Runtime;
using kungfu::Status;

// Waits for an op as a TF kernel does: first reading same-host peers'
// rings on this thread (Runtime::poll_until: nothing to read over Unix
// sockets, so there it returns at once), then as the runtime's receivers
// wait for a peer, a short spin on a flag, then sleeping. Both transports'
// rows are timed this way.
Status wait_op(Runtime &rt, const std::function<void(DoneCallback)> &start) {
  struct Result {
    std::atomic<bool> done{false};
    std::mutex mu;
    std::condition_variable cv;
    Status status;
  };
  auto r = std::make_shared<Result>();
  start([r](const Status &s) {
    r->status = s;
    std::lock_guard<std::mutex> lock(r->mu);
    r->done.store(true, std::memory_order_release);
    r->cv.notify_one();
  });
  if (rt.poll_until([&r] { return r->done.load(std::memory_order_acquire); })) return r->status;
  // Then a short spin on the flag (a futex wake-up of a sleeping caller
  // costs tens of microseconds on a VM, more than a small all-reduce).
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  while (!r->done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
  }
  std::unique_lock<std::mutex> lock(r->mu);
  r->cv.wait(lock, [&] { return r->done.load(std::memory_order_acquire); });
  return r->status;
}

int run_worker(const kungfu::RuntimeOptions &opt, size_t count, int iters, int repeats, const char *topo_name,
               bool repeated_name, bool settle) {
  std::unique_ptr<Runtime> rt;
  Status s = Runtime::create(opt, &rt);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", opt.self_rank, s.ToString().c_str());
    return 1;
  }
  std::vector<float> in(count, 1.0f), out(count);
  Buffer buf{in.data(), out.data(), kungfu::TensorDesc{kungfu::DType::kFloat32, {int64_t(count)}, count}, nullptr};
  int op_id = 0;
  auto all_reduce = [&]() {
    return wait_op(*rt, [&](DoneCallback d) {
      rt->all_reduce(repeated_name ? std::string("grad") : "op" + std::to_string(op_id++), buf, kungfu::ReduceOp::kSum,
                     d);
    });
  };
  for (int i = 0; i < 3; ++i) {  // warm-up: connections, pools
    if (!(s = all_reduce()).ok()) break;
  }
  // AUTO is timed on its choice, not on the calls that carry its probe's
  // samples (issue 23 §2 allows a probe at start): with repeated names, call
  // until every worker holds the class's choice (a min on a fixed topology,
  // so every worker makes the same calls), at most kSettleCalls times.
  constexpr int kSettleCalls = 500;
  const int size_class = kungfu::auto_size_class(count * 4);
  for (int i = 0; settle && std::string(topo_name) == "AUTO" && s.ok() && i < kSettleCalls; ++i) {
    int32_t decided = rt->auto_choices().count(size_class) ? 1 : 0;
    Buffer flag{&decided, &decided, kungfu::TensorDesc{kungfu::DType::kInt32, {1}, 1}, nullptr};
    s = wait_op(*rt, [&](DoneCallback d) {
      rt->all_reduce_on(kungfu::TopologyKind::kStar, "settled" + std::to_string(i), flag, kungfu::ReduceOp::kMin, d);
    });
    if (!s.ok() || decided) break;
    s = all_reduce();
  }
  std::vector<double> samples;
  const uint64_t polled_before = rt->polled_frames();
  for (int r = 0; r < repeats && s.ok(); ++r) {
    s = wait_op(*rt, [&](DoneCallback d) { rt->barrier("barrier" + std::to_string(r), d); });
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters && s.ok(); ++i) s = all_reduce();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  const uint64_t polled = rt->polled_frames() - polled_before;
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", opt.self_rank, s.ToString().c_str());
    return 1;
  }
  if (out[0] != static_cast<float>(opt.cluster.size())) {
    std::fprintf(stderr, "rank %d: wrong result %f\n", opt.self_rank, out[0]);
    return 1;
  }
  if (opt.self_rank == 0) {
    std::vector<double> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    // What AUTO measured and chose for this size ("" for a fixed topology).
    std::map<int, kungfu::TopologyKind> chosen = rt->auto_choices();
    auto it = chosen.find(size_class);
    const char *auto_choice = it == chosen.end() ? "" : kungfu::topology_name(it->second);
    std::printf(
        "RESULT {\"np\": %d, \"topology\": \"%s\", \"auto_choice\": \"%s\", \"transport\": \"%s\", \"size\": %zu, "
        "\"median_s\": %.9f, \"polled_frames\": %llu, \"timed_calls\": %d, \"calls_held_for_sample\": %llu, "
        "\"samples\": [",
        opt.cluster.size(), topo_name, auto_choice, opt.same_host_shm ? "shm" : "unix", count * 4,
        sorted[sorted.size() / 2], static_cast<unsigned long long>(polled), iters * repeats,
        static_cast<unsigned long long>(rt->auto_calls_held_for_sample()));
    for (size_t i = 0; i < samples.size(); ++i) std::printf("%s%.9f", i ? ", " : "", samples[i]);
    std::printf("]}\n");
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 6 || argc > 9) {
    std::fprintf(stderr,
                 "usage: runtime_allreduce NP TOPOLOGY BYTES ITERS REPEATS [NAMES | PEERS RANK [NAMES]], "
                 "NAMES: unique, repeated or settled\n");
    return 2;
  }
  int np = std::atoi(argv[1]);
  kungfu::TopologyKind topo;
  Status s = kungfu::parse_topology(argv[2], &topo);
  size_t bytes = std::strtoull(argv[3], nullptr, 10);
  int iters = std::atoi(argv[4]), repeats = std::atoi(argv[5]);
  if (!s.ok() || np < 1 || bytes % 4 != 0 || iters < 1 || repeats < 1) {
    std::fprintf(stderr, "bad arguments: %s\n",
                 s.ok() ? "np, bytes (multiple of 4), iters, repeats" : s.ToString().c_str());
    return 2;
  }
  std::vector<kungfu::PeerID> peers;
  int only_rank = -1;
  const std::string names = argc == 9 ? argv[8] : argc == 7 ? argv[6] : "unique";
  if (names != "unique" && names != "repeated" && names != "settled") {
    std::fprintf(stderr, "bad NAMES '%s': expected unique, repeated or settled\n", names.c_str());
    return 2;
  }
  if (argc >= 8) {
    s = kungfu::parse_peer_list(argv[6], &peers);
    only_rank = std::atoi(argv[7]);
    if (!s.ok() || static_cast<int>(peers.size()) != np || only_rank < 0 || only_rank >= np) {
      std::fprintf(stderr, "bad PEERS or RANK: %s\n", s.ok() ? "NP peers and 0 <= RANK < NP" : s.ToString().c_str());
      return 2;
    }
  } else {
    // Ports next to a random base: the benchmark runs alone on loopback.
    int base = 20000 + static_cast<int>(getpid() % 20000);
    for (int r = 0; r < np; ++r) peers.push_back(kungfu::PeerID{"127.0.0.1", static_cast<uint16_t>(base + r)});
  }
  std::vector<pid_t> children;
  for (int r = 0; r < np; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    pid_t pid = only_rank >= 0 ? 0 : fork();
    if (pid == 0) {
      kungfu::RuntimeOptions opt;
      opt.cluster = kungfu::Cluster(0, peers);
      opt.self_rank = r;
      opt.secret = "benchmark";
      opt.timeout_seconds = 60;
      opt.topology = topo;
      // Frame authentication as the workers of a job would read it.
      const char *auth = std::getenv("KUNGFU_AUTHENTICATE_FRAMES");
      opt.frame_auth = auth == nullptr || *auth == '\0' ? kungfu::FrameAuthPolicy::kAcrossHosts
                       : std::string(auth) == "1"       ? kungfu::FrameAuthPolicy::kAlways
                                                        : kungfu::FrameAuthPolicy::kNever;
      // AUTO's probe as the workers of a job read it (runtime_options.h).
      for (const char *var : {"KUNGFU_AUTO_PROBES", "KUNGFU_AUTO_PRUNE"}) {
        const char *text = std::getenv(var);
        double v = 0;
        if (text == nullptr || *text == '\0') continue;
        if (!kungfu::parse_decimal(text, &v) || v < 0) {
          std::fprintf(stderr, "%s='%s': expected a number >= 0\n", var, text);
          std::_Exit(2);
        }
        if (std::string(var) == "KUNGFU_AUTO_PROBES") opt.auto_probes = static_cast<int>(v);
        else opt.auto_prune = v;
      }
      const char *auto_log = std::getenv("KUNGFU_AUTO_LOG");
      opt.auto_log = auto_log != nullptr && std::string(auto_log) == "1";
      const char *shm = std::getenv("KUNGFU_SHM");
      if (shm != nullptr && *shm != '\0' && std::string(shm) != "0" && std::string(shm) != "1") {
        std::fprintf(stderr, "KUNGFU_SHM='%s': expected 0 or 1\n", shm);
        std::_Exit(2);
      }
      opt.same_host_shm = shm == nullptr || std::string(shm) != "0";
      int rc = run_worker(opt, bytes / 4, iters, repeats, argv[2], names != "unique", names == "settled");
      if (only_rank >= 0) return rc;
      std::_Exit(rc);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}
