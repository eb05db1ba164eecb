// A worker holds threads (and connections) only for the peers its topology
// talks to: a link's sender thread starts with its first frame, and a
// receiving thread exists per accepted connection. At 1,024 workers a
// sender per peer per worker was what ran out first (make bench-scaling).
// Here eight runtimes in one process all-reduce on STAR and RING; the
// threads each one serves must be exactly its peers in the topology's
// graphs, the whole process must hold no other new threads, a resize
// afterwards must work (peers never talked to must not hold it up), and
// once every runtime is gone no thread or descriptor may be left. A peer
// SIGKILLed in a RING is one that most workers never talked to: telling it
// of the failure must not hold up the next cluster change.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "test_util.h"
#include "topology.h"

using namespace kungfu;

namespace {

using Runtimes = std::vector<std::unique_ptr<Runtime>>;

// Entries of a /proc directory (threads of /proc/self/task, descriptors of /proc/self/fd).
int count_entries(const char *dir) {
  int n = 0;
  DIR *d = ::opendir(dir);
  if (d == nullptr) return -1;
  while (dirent *e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}
int threads_now() { return count_entries("/proc/self/task"); }
int fds_now() { return count_entries("/proc/self/fd") - 1; }  // less the directory stream itself

// The peers `rank` sends to and receives from in any graph pair of the topology.
struct Neighbours {
  std::set<int> out, in;
};
Neighbours neighbours(TopologyKind kind, const Cluster &cluster, int rank) {
  Neighbours nb;
  std::shared_ptr<const Topology> topology = build_topology(kind, cluster);
  for (const GraphPair &gp : topology->pairs) {
    for (const Graph *g : {&gp.reduce, &gp.broadcast}) {
      for (int r : g->nexts(rank)) nb.out.insert(r);
      for (int r : g->prevs(rank)) nb.in.insert(r);
    }
  }
  return nb;
}

// An all-reduce over every runtime in `rts`, cut into enough pieces
// (chunk_bytes 4) that every graph pair of the topology carries one;
// true if every worker got the sum.
bool all_reduce_everywhere_is_right(Runtimes &rts, const std::string &name) {
  const size_t n = rts.size(), count = 4 * n;
  std::vector<std::vector<float>> in(n);
  for (size_t r = 0; r < n; ++r) {
    in[r].resize(count);
    for (size_t j = 0; j < count; ++j) in[r][j] = static_cast<float>((r + 1) * (j + 1));
  }
  bool right = true;
  for (const Status &s : kftest::all_reduce_everywhere(rts, name, in)) {
    CHECK_OK(s);
    right = right && s.ok();
  }
  const float weight = static_cast<float>(n * (n + 1) / 2);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < count; ++j) right = right && in[r][j] == weight * static_cast<float>(j + 1);
  }
  return right;
}

// Every runtime serves exactly its topology neighbours, and the process
// holds `baseline` threads plus `per_runtime` each plus those links' threads.
void check_threads_follow_topology(Runtimes &rts, TopologyKind kind, int baseline, int per_runtime) {
  const Cluster cluster = rts[0]->cluster();
  size_t link_threads = 0;
  for (size_t r = 0; r < rts.size(); ++r) {
    Neighbours nb = neighbours(kind, cluster, static_cast<int>(r));
    CHECK(rts[r]->sender_threads() == nb.out.size());
    // A receiving thread is reaped by the acceptor once its connection
    // ends; all of them stay up here, since no connection ends.
    CHECK(kftest::eventually([&] { return rts[r]->receiver_threads() == nb.in.size(); }));
    if (rts[r]->sender_threads() != nb.out.size() || rts[r]->receiver_threads() != nb.in.size()) {
      std::fprintf(stderr, "%s rank %zu: %zu senders, %zu receivers; its graphs have %zu out, %zu in\n",
                   topology_name(kind), r, rts[r]->sender_threads(), rts[r]->receiver_threads(), nb.out.size(),
                   nb.in.size());
    }
    link_threads += nb.out.size() + nb.in.size();
  }
  // The test means something: the topology leaves most pairs unused.
  CHECK(link_threads < rts.size() * (rts.size() - 1));
  const int expected = baseline + per_runtime * static_cast<int>(rts.size()) + static_cast<int>(link_threads);
  CHECK(kftest::eventually([&] { return threads_now() == expected; }));
  if (threads_now() != expected)
    std::fprintf(stderr, "%d threads in the process, expected %d\n", threads_now(), expected);
}

// A cluster of two that all-reduces once and is gone: what a process starts
// once and keeps (a sanitizer's background thread) is there before a test
// takes its baseline.
void warm_up_process() {
  Runtimes rts = kftest::make_cluster(2, TopologyKind::kStar);
  std::vector<std::vector<float>> in(2, std::vector<float>(1, 1.0f));
  for (const Status &s : kftest::all_reduce_everywhere(rts, "warm-up", in)) CHECK_OK(s);
}

void threads_only_for_topology_peers(TopologyKind kind) {
  constexpr int n = 8;
  warm_up_process();
  const int threads_before = threads_now(), fds_before = fds_now();
  {
    Runtimes rts = kftest::make_cluster(n, kind, 20, /*chunk=*/4);
    // Before any traffic: the same few threads per runtime (its acceptor
    // and its op watchdog) whatever the cluster size, none per peer.
    const int idle = threads_now() - threads_before;
    CHECK(idle % n == 0 && idle / n <= 3);
    const int per_runtime = idle / n;
    if (idle / n > 3) std::fprintf(stderr, "%d threads per idle runtime at np=%d\n", idle / n, n);
    for (auto &rt : rts) CHECK(rt->sender_threads() == 0 && rt->receiver_threads() == 0);

    CHECK(all_reduce_everywhere_is_right(rts, "first"));
    check_threads_follow_topology(rts, kind, threads_before, per_runtime);

    // Shrink by one (the last rank leaves in order), then all-reduce on the
    // new version: the retired version's threads are all joined, the new
    // one's follow its topology.
    std::vector<PeerID> peers;
    for (int r = 0; r + 1 < n; ++r) peers.push_back(rts[r]->self());
    Cluster smaller(1, peers);
    std::thread leave([&] { rts[n - 1]->shutdown(); });
    std::vector<Status> switched(n - 1);
    std::vector<std::thread> updates;
    for (int r = 0; r + 1 < n; ++r) updates.emplace_back([&, r] { switched[r] = rts[r]->update_cluster(smaller); });
    for (auto &t : updates) t.join();
    leave.join();
    for (const Status &s : switched) CHECK_OK(s);
    rts.pop_back();
    CHECK(all_reduce_everywhere_is_right(rts, "after-shrink"));
    check_threads_follow_topology(rts, kind, threads_before, per_runtime);
    for (auto &rt : rts) rt->shutdown();
  }
  // Every thread joined, every socket and ring closed.
  CHECK(kftest::eventually([&] { return threads_now() == threads_before; }));
  CHECK(fds_now() == fds_before);
  if (threads_now() != threads_before || fds_now() != fds_before) {
    std::fprintf(stderr, "left behind: %d threads, %d descriptors\n", threads_now() - threads_before,
                 fds_now() - fds_before);
  }
}

// Ranks 0..n-2 in this process, rank n-1 in a child that is SIGKILLed after
// one all-reduce on RING (4 bytes: one rooted chain, so each rank talks to
// its two neighbours only). The survivors' next all-reduce fails; the
// workers that notice tell every peer, the dead one included, which most
// of them never dialed. The shrink that follows must not wait for those
// dials (it waited for the leave deadline, 10 s).
void test_crash_of_a_peer_never_talked_to() {
  constexpr int n = 6;
  const int victim = n - 1;
  std::vector<PeerID> peers = kftest::local_peers(n);
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, victim, TopologyKind::kRing, 60), &rt).ok()) std::_Exit(2);
    float x = 1;
    Buffer b{&x, &x, TensorDesc{DType::kFloat32, {1}, 1}, nullptr};
    if (!kftest::wait_for([&](DoneCallback d) { rt->all_reduce("before", b, ReduceOp::kSum, d); }).ok()) std::_Exit(3);
    for (;;) ::pause();
  }
  std::vector<std::vector<float>> in(n - 1, std::vector<float>(1, 1.0f));
  Runtimes rts(n - 1);
  for (int r = 0; r < n - 1; ++r) {
    CHECK_OK(Runtime::create(kftest::options(peers, r, TopologyKind::kRing, 60), &rts[r]));
    if (!rts[r]) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
      return;
    }
  }
  for (const Status &s : kftest::all_reduce_everywhere(rts, "before", in)) CHECK_OK(s);
  CHECK(in[0][0] == static_cast<float>(n));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (const Status &s : kftest::all_reduce_everywhere(rts, "doomed", in)) CHECK(!s.ok());

  Cluster survivors(1, std::vector<PeerID>(peers.begin(), peers.end() - 1));
  std::vector<Status> switched(n - 1);
  std::vector<std::thread> updates;
  for (int r = 0; r < n - 1; ++r) updates.emplace_back([&, r] { switched[r] = rts[r]->update_cluster(survivors); });
  for (auto &t : updates) t.join();
  for (const Status &s : switched) CHECK_OK(s);
  in.assign(n - 1, std::vector<float>(1, 1.0f));
  for (const Status &s : kftest::all_reduce_everywhere(rts, "after", in)) CHECK_OK(s);
  for (const auto &v : in) CHECK(v[0] == static_cast<float>(n - 1));
  // A dial to the dead rank used to hold the old version's leave until the
  // leave deadline (kMaxLeaveSeconds). The runtime counts the links a leave
  // gave up on at that deadline: none here, however slow the machine (a
  // wall-clock bound would tell the two apart only on a fast one).
  for (int r = 0; r < n - 1; ++r) {
    CHECK(rts[r]->leaves_cut_by_deadline() == 0);
    if (rts[r]->leaves_cut_by_deadline() != 0) {
      std::fprintf(stderr, "rank %d: %llu links left at the deadline\n", r,
                   static_cast<unsigned long long>(rts[r]->leaves_cut_by_deadline()));
    }
  }
}

void test_star() { threads_only_for_topology_peers(TopologyKind::kStar); }
void test_ring() { threads_only_for_topology_peers(TopologyKind::kRing); }
void test_binary_tree() { threads_only_for_topology_peers(TopologyKind::kBinaryTree); }

}  // namespace

int main() {
  return kftest::run_tests({
      {"star", test_star},
      {"ring", test_ring},
      {"binary_tree", test_binary_tree},
      {"crash_of_a_peer_never_talked_to", test_crash_of_a_peer_never_talked_to},
  });
}
