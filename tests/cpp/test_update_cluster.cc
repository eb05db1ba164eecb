// Runtime::update_cluster: an atomic, in-process cluster change (elastic
// training). Runtimes of one process over real sockets shrink, grow and
// reorder; every all-reduce right after a change must give the new cluster's
// sum, an op in flight at the change must fail at once with a clear error,
// old-version frames must never reach the new version, and twenty quick
// changes must keep the ports bound and leak neither sockets nor threads.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "handshake.h"
#include "test_util.h"

using namespace kungfu;
using kftest::contains;
using kftest::wait_for;

namespace {

using Runtimes = std::vector<std::unique_ptr<Runtime>>;

// Cluster `version` of the peers of `members` (indices into `peers`), in that order.
Cluster cluster_of(const std::vector<PeerID> &peers, const std::vector<int> &members, uint32_t version) {
  std::vector<PeerID> list;
  for (int m : members) list.push_back(peers[m]);
  return Cluster(version, list);
}

// update_cluster on every runtime of `members` at once (peers switch a few
// ms apart in real jobs, and here in any order); the statuses in that order.
std::vector<Status> update_all(Runtimes &rts, const std::vector<int> &members, const Cluster &c) {
  std::vector<Status> out(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = rts[members[i]]->update_cluster(c); });
  }
  for (auto &t : threads) t.join();
  return out;
}

// An all-reduce (sum) over `members`, each contributing (its index in
// `peers` + 1) * (j + 1) at element j; true if every result is the expected sum.
bool all_reduce_is_right(Runtimes &rts, const std::vector<int> &members, const std::string &name, size_t n = 1000) {
  std::vector<std::vector<float>> in(members.size());
  std::vector<std::future<Status>> fs;
  for (size_t i = 0; i < members.size(); ++i) {
    in[i].resize(n);
    for (size_t j = 0; j < n; ++j) in[i][j] = static_cast<float>((members[i] + 1) * (j + 1));
    auto p = std::make_shared<std::promise<Status>>();
    fs.push_back(p->get_future());
    Buffer b{in[i].data(), in[i].data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(n)}, n}, nullptr};
    rts[members[i]]->all_reduce(name, b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  }
  float weight = 0;
  for (int m : members) weight += static_cast<float>(m + 1);
  bool right = true;
  for (size_t i = 0; i < members.size(); ++i) {
    Status s = fs[i].get();
    if (!s.ok()) {
      std::fprintf(stderr, "all_reduce '%s' on member %d: %s\n", name.c_str(), members[i], s.ToString().c_str());
      right = false;
      continue;
    }
    for (size_t j = 0; j < n; ++j) {
      if (in[i][j] != weight * static_cast<float>(j + 1)) {
        std::fprintf(stderr, "all_reduce '%s' on member %d: element %zu is %g, expected %g\n", name.c_str(), members[i],
                     j, in[i][j], weight * static_cast<float>(j + 1));
        right = false;
        break;
      }
    }
  }
  return right;
}

Runtimes make_runtimes(const std::vector<PeerID> &peers, double timeout = 20) {
  Runtimes rts(peers.size());
  for (size_t r = 0; r < peers.size(); ++r) {
    CHECK_OK(Runtime::create(kftest::options(peers, static_cast<int>(r), TopologyKind::kAuto, timeout), &rts[r]));
  }
  return rts;
}

// A one-worker runtime at version 0 on `self`'s port (a joiner before it is admitted).
std::unique_ptr<Runtime> make_joiner(const PeerID &self) {
  std::unique_ptr<Runtime> rt;
  CHECK_OK(Runtime::create(kftest::options({self}, 0), &rt));
  return rt;
}

size_t count_entries(const char *dir) {
  size_t n = 0;
  if (DIR *d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

void test_shrink_four_to_two() {
  auto peers = kftest::local_peers(4);
  Runtimes rts = make_runtimes(peers);
  CHECK(all_reduce_is_right(rts, {0, 1, 2, 3}, "before"));
  // Ranks 1 and 3 leave in order while 0 and 2 switch.
  Cluster two = cluster_of(peers, {0, 2}, 1);
  std::thread leave1([&] { rts[1]->shutdown(); });
  std::thread leave3([&] { rts[3]->shutdown(); });
  auto statuses = update_all(rts, {0, 2}, two);
  leave1.join();
  leave3.join();
  for (const Status &s : statuses) CHECK_OK(s);
  CHECK(rts[0]->size() == 2 && rts[0]->rank() == 0 && rts[0]->cluster_version() == 1);
  CHECK(rts[2]->size() == 2 && rts[2]->rank() == 1 && rts[2]->cluster_version() == 1);
  CHECK(all_reduce_is_right(rts, {0, 2}, "after"));
  // The same name again: per-name counters restarted with the version.
  CHECK(all_reduce_is_right(rts, {0, 2}, "before"));
  // Leavers said goodbye: nobody was lost.
  CHECK(rts[0]->lost_peers().empty() && rts[2]->lost_peers().empty());
  CHECK(rts[0]->rejected_connections() == 0 && rts[2]->rejected_connections() == 0);
}

void test_grow_with_a_joiner() {
  auto peers = kftest::local_peers(3);
  Runtimes rts(3);
  std::vector<PeerID> first_two = {peers[0], peers[1]};
  for (int r = 0; r < 2; ++r) CHECK_OK(Runtime::create(kftest::options(first_two, r), &rts[r]));
  rts[2] = make_joiner(peers[2]);
  CHECK(rts[2]->size() == 1 && rts[2]->cluster_version() == 0);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  CHECK(all_reduce_is_right(rts, {2}, "joiner alone"));
  // The survivors keep state in the p2p store across the change; the joiner fetches it.
  float state = 42.5f;
  rts[0]->save("model", 7, &state, sizeof(state));
  Cluster three = cluster_of(peers, {0, 1, 2}, 1);
  for (const Status &s : update_all(rts, {0, 1, 2}, three)) CHECK_OK(s);
  CHECK(rts[2]->size() == 3 && rts[2]->rank() == 2 && rts[2]->cluster_version() == 1);
  CHECK(all_reduce_is_right(rts, {0, 1, 2}, "grown"));
  float got = 0;
  CHECK_OK(wait_for([&](DoneCallback done) { rts[2]->request(0, "model", 7, &got, sizeof(got), nullptr, done); }));
  CHECK(got == 42.5f);
}

// Down to one worker and back: the lone survivor keeps its port bound (the
// listeners pass on even to a one-worker version) and a joiner reaches it.
void test_shrink_to_one_and_grow_again() {
  auto peers = kftest::local_peers(3);
  Runtimes rts(3);
  std::vector<PeerID> first_two = {peers[0], peers[1]};
  for (int r = 0; r < 2; ++r) CHECK_OK(Runtime::create(kftest::options(first_two, r), &rts[r]));
  CHECK(all_reduce_is_right(rts, {0, 1}, "two"));
  std::thread leave([&] { rts[1]->shutdown(); });
  CHECK_OK(rts[0]->update_cluster(cluster_of(peers, {0}, 1)));
  leave.join();
  CHECK(rts[0]->size() == 1 && all_reduce_is_right(rts, {0}, "alone"));
  rts[2] = make_joiner(peers[2]);
  for (const Status &s : update_all(rts, {2, 0}, cluster_of(peers, {2, 0}, 2))) CHECK_OK(s);
  CHECK(rts[2]->rank() == 0 && rts[0]->rank() == 1);
  CHECK(all_reduce_is_right(rts, {2, 0}, "two again"));
}

void test_in_flight_op_fails_at_the_change() {
  auto peers = kftest::local_peers(2);
  std::vector<float> x(10, 1.0f), y(10, 100.0f);  // outlive the runtimes (failed ops' sends)
  // An op failed by the change is told apart from one that timed out by its
  // status (Unavailable naming the change, not DeadlineExceeded), not by
  // the clock: a timed-out one would still end, at 60 s, and fail the checks.
  const double timeout = 60;
  Runtimes rts = make_runtimes(peers, timeout);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  // Rank 0 waits for rank 1, which never joins this all-reduce: it must fail
  // when the cluster changes, not after the timeout.
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[0]->all_reduce("stranded", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  // Rank 1 starts one the other way round: its piece reaches rank 0's old
  // version, and must never be mixed into the new version's op of that name.
  auto q = std::make_shared<std::promise<Status>>();
  auto g = q->get_future();
  Buffer c{y.data(), y.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[1]->all_reduce("stale", c, ReduceOp::kSum, [q](const Status &s) { q->set_value(s); });
  // Rank 0 (the root) holds that piece before the change (milliseconds).
  CHECK(kftest::eventually([&] { return rts[0]->pending_messages() > 0; }));
  for (const Status &s : update_all(rts, {0, 1}, cluster_of(peers, {1, 0}, 5))) CHECK_OK(s);
  Status s = f.get();
  CHECK(s.code() == Code::kUnavailable && contains(s.message(), "cluster changed to version 5") &&
        contains(s.message(), "stranded"));
  CHECK(g.get().code() == Code::kUnavailable);
  // Reordered: rank 1 is now rank 0. "stale" of the new version sums only new contributions.
  CHECK(rts[1]->rank() == 0 && rts[0]->rank() == 1);
  CHECK(all_reduce_is_right(rts, {1, 0}, "stale", 10));
  CHECK(rts[0]->pending_messages() == 0 && rts[1]->pending_messages() == 0);
}

void test_peer_that_switches_late_is_waited_for() {
  auto peers = kftest::local_peers(2);
  std::vector<float> x(100, 1.0f), y(100, 2.0f);
  Runtimes rts = make_runtimes(peers);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  Cluster next = cluster_of(peers, {0, 1}, 1);
  CHECK_OK(rts[0]->update_cluster(next));
  // Rank 0 is at version 1 and starts at once; rank 1 switches 300 ms later.
  // Rank 0's connection attempts meet version 0 and retry; nothing counts
  // as a crash or a stranger on either side.
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {100}, 100}, nullptr};
  rts[0]->all_reduce("early", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(rts[1]->lost_peers().empty());  // still at version 0: rank 0 said goodbye there
  CHECK_OK(rts[1]->update_cluster(next));
  CHECK_OK(wait_for([&](DoneCallback done) {
    Buffer c{y.data(), y.data(), TensorDesc{DType::kFloat32, {100}, 100}, nullptr};
    rts[1]->all_reduce("early", c, ReduceOp::kSum, done);
  }));
  CHECK_OK(f.get());
  CHECK(x[0] == 3.0f && y[99] == 3.0f);
  CHECK(rts[0]->lost_peers().empty() && rts[1]->lost_peers().empty());
  CHECK(rts[0]->rejected_connections() == 0 && rts[1]->rejected_connections() == 0);
}

void test_bad_updates_are_refused() {
  auto peers = kftest::local_peers(2);
  Runtimes rts = make_runtimes(peers);
  CHECK_OK(rts[0]->update_cluster(cluster_of(peers, {0, 1}, 3)));
  Status older = rts[0]->update_cluster(cluster_of(peers, {0, 1}, 3));
  CHECK(older.code() == Code::kInvalidArgument &&
        contains(older.message(), "greater than the current cluster version 3"));
  Status without_self = rts[0]->update_cluster(cluster_of(peers, {1}, 4));
  CHECK(without_self.code() == Code::kInvalidArgument && contains(without_self.message(), peers[0].str()) &&
        contains(without_self.message(), "[" + peers[1].str() + "]") && contains(without_self.message(), "not in"));
  Status twice = rts[0]->update_cluster(cluster_of(peers, {0, 1, 1}, 4));
  CHECK(twice.code() == Code::kInvalidArgument && contains(twice.message(), "listed twice"));
  CHECK(rts[0]->cluster_version() == 3 && rts[0]->size() == 2);
  rts[0]->shutdown();
  Status after_leave = rts[0]->update_cluster(cluster_of(peers, {0, 1}, 4));
  CHECK(after_leave.code() == Code::kFailedPrecondition && contains(after_leave.message(), "left the cluster"));
}

void test_interrupt_fails_pending_and_new_ops() {
  auto peers = kftest::local_peers(2);
  std::vector<float> x(10, 1.0f);  // outlives the runtimes (a failed op's sends)
  Runtimes rts = make_runtimes(peers, 30);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[0]->all_reduce("blocked", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread watcher([&] { rts[0]->interrupt("peer lost: recovering"); });
  watcher.join();
  // At once, not after the 30 s timeout: the status says which (the
  // interrupt's reason, not DeadlineExceeded), not the clock.
  Status s = f.get();
  CHECK(s.code() == Code::kUnavailable && contains(s.message(), "peer lost: recovering"));
  // New ops fail too, one-worker fast paths and p2p included, until the next version.
  Status again = wait_for([&](DoneCallback done) { rts[0]->barrier("later", done); });
  CHECK(again.code() == Code::kUnavailable && contains(again.message(), "peer lost: recovering"));
  float v = 0;
  Status fetch = wait_for([&](DoneCallback done) { rts[0]->request(1, "x", 0, &v, sizeof(v), nullptr, done); });
  CHECK(fetch.code() == Code::kUnavailable);
  for (const Status &u : update_all(rts, {0, 1}, cluster_of(peers, {0, 1}, 1))) CHECK_OK(u);
  CHECK(all_reduce_is_right(rts, {0, 1}, "blocked", 10));
}

void test_twenty_quick_changes() {
  auto peers = kftest::local_peers(4);
  Runtimes rts = make_runtimes(peers);
  CHECK(all_reduce_is_right(rts, {0, 1, 2, 3}, "x"));
  const size_t fds = count_entries("/proc/self/fd");
  const size_t threads = count_entries("/proc/self/task");
  const std::vector<std::vector<int>> orders = {{3, 0, 1, 2}, {1, 2, 3, 0}, {0, 1, 2, 3}, {2, 1, 0, 3}};
  std::vector<double> ms;
  for (uint32_t v = 1; v <= 20; ++v) {
    const std::vector<int> &order = orders[v % orders.size()];
    auto start = std::chrono::steady_clock::now();
    for (const Status &s : update_all(rts, {0, 1, 2, 3}, cluster_of(peers, order, v))) CHECK_OK(s);
    CHECK(all_reduce_is_right(rts, order, "x", 10));
    ms.push_back(kftest::seconds_since(start) * 1e3);
    CHECK(rts[order[0]]->rank() == 0 && rts[order[3]]->rank() == 3);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("  update_cluster + first all-reduce, np=4 in one process: median %.1f ms, max %.1f ms\n", ms[10],
              ms.back());
  // Old connections are closed, old threads joined: nothing grows with the
  // number of versions (a little slack for connections still closing; a
  // loaded machine may take a while to close the last ones, a leak never
  // does: 30 s rules out "never").
  CHECK(kftest::eventually(
      [&] { return count_entries("/proc/self/fd") <= fds + 2 && count_entries("/proc/self/task") <= threads + 2; }));
  for (auto &rt : rts) CHECK(rt->lost_peers().empty() && rt->rejected_connections() == 0);
}

// Rank 2 runs in a child process that is SIGKILLed: the survivors name it
// in lost_peers() (a crash, not a goodbye) and carry on without it.
void test_crashed_peer_is_lost_then_dropped() {
  auto peers = kftest::local_peers(3);
  const std::vector<float> mine(4, 3.0f);
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, 2, TopologyKind::kClique, 60), &rt).ok()) std::_Exit(2);
    std::vector<float> x = mine;
    Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {4}, 4}, nullptr};
    if (!wait_for([&](DoneCallback done) { rt->all_reduce("before", b, ReduceOp::kSum, done); }).ok()) std::_Exit(3);
    for (;;) ::pause();
  }
  // Declared before the runtimes, which outlive no buffer of theirs: a
  // failed op's sends may still be queued (kernels pass a keepalive instead).
  std::vector<std::vector<float>> in = {std::vector<float>(4, 1.0f), std::vector<float>(4, 2.0f)};
  std::vector<float> fetched(4);
  Runtimes rts(2);
  for (int r = 0; r < 2; ++r) CHECK_OK(Runtime::create(kftest::options(peers, r, TopologyKind::kClique, 30), &rts[r]));
  for (const Status &s : kftest::all_reduce_everywhere(rts, "before", in)) CHECK_OK(s);
  CHECK(in[0][0] == 6.0f && in[1][3] == 6.0f);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // Noticed, not timed out (30 s): Unavailable naming rank 2, where a
  // timeout ends DeadlineExceeded (the status tells, not the clock).
  for (const Status &s : kftest::all_reduce_everywhere(rts, "during", in)) {
    CHECK(s.code() == Code::kUnavailable && contains(s.message(), "rank 2"));
  }
  for (auto &rt : rts) {
    // A rank's op may fail from its peer's abort a moment before its own
    // connection from rank 2 reports the end of the stream.
    CHECK(kftest::eventually([&] { return !rt->lost_peers().empty(); }));
    std::vector<PeerID> lost = rt->lost_peers();
    CHECK(lost.size() == 1 && lost[0] == peers[2]);
  }
  Cluster two = cluster_of(peers, {0, 1}, 1);
  for (const Status &s : update_all(rts, {0, 1}, two)) CHECK_OK(s);
  CHECK(all_reduce_is_right(rts, {0, 1}, "during"));
  CHECK(rts[0]->lost_peers().empty() && rts[1]->lost_peers().empty());
}

// A member of the previous version that died before the change is in the
// new cluster: its port, bound since then, refuses the connection, which is
// reported as lost at once instead of retried until the (30 s) timeout.
void test_dead_member_refuses_fast() {
  auto peers = kftest::local_peers(3);
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, 2, TopologyKind::kClique, 60), &rt).ok()) std::_Exit(2);
    if (!wait_for([&](DoneCallback done) { rt->barrier("up", done); }).ok()) std::_Exit(3);
    for (;;) ::pause();
  }
  // Before the runtimes, which must not outlive a buffer of a failed op.
  std::vector<std::vector<float>> in = {std::vector<float>(4, 1.0f), std::vector<float>(4, 2.0f)};
  std::vector<float> fetched(4);
  // A dial retried until the timeout also ends Unavailable: the timeout is
  // far above the hang bound below, so only a refusal ends it in time.
  constexpr double kTimeout = 600, kHangBound = 120;
  Runtimes rts(2);
  for (int r = 0; r < 2; ++r) {
    CHECK_OK(Runtime::create(kftest::options(peers, r, TopologyKind::kClique, kTimeout), &rts[r]));
  }
  std::vector<std::future<Status>> up;
  for (auto &rt : rts) {
    auto p = std::make_shared<std::promise<Status>>();
    up.push_back(p->get_future());
    rt->barrier("up", [p](const Status &s) { p->set_value(s); });
  }
  for (auto &f : up) CHECK_OK(f.get());  // rank 2 is up: its port is bound
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (const Status &s : update_all(rts, {0, 1}, cluster_of(peers, {0, 1, 2}, 1))) CHECK_OK(s);
  auto start = std::chrono::steady_clock::now();
  for (const Status &s : kftest::all_reduce_everywhere(rts, "with the dead", in)) {
    CHECK(s.code() == Code::kUnavailable && contains(s.message(), "rank 2"));
  }
  // At once, not retried until the timeout (a hang bound, not a race).
  CHECK(kftest::seconds_since(start) < kHangBound);
  // A fetch from rank 2 alone fails as fast, naming it. lost_peers() lists
  // what a worker saw itself (runtime.h): under load both ranks' ops may be
  // failed by aborts and a broken link before either sees the refusal (seen
  // in 1 of 6 runs at load), so it may be empty, but never names anyone else.
  start = std::chrono::steady_clock::now();
  Status fetch = wait_for([&](DoneCallback done) {
    rts[0]->request(2, "nothing", P2PStore::kLatest, fetched.data(), fetched.size() * sizeof(float), nullptr, done);
  });
  CHECK(fetch.code() == Code::kUnavailable && contains(fetch.message(), "rank 2"));
  CHECK(kftest::seconds_since(start) < kHangBound);
  std::vector<PeerID> lost0 = rts[0]->lost_peers(), lost1 = rts[1]->lost_peers();
  for (const auto &lost : {lost0, lost1}) CHECK(lost.empty() || (lost.size() == 1 && lost[0] == peers[2]));
}

// Peers switch at staggered times and each starts the new version's first
// all-reduce right after its own switch, so its connections reach peers
// that are in the middle of their swap: accepted by the old transport and
// closed when it stops, or answered at the old version. Every such
// handshake must be retried, never fail the op (KUNGFU_SWAP_ROUNDS: rounds).
void test_staggered_swaps_never_fail_the_first_op() {
  auto peers = kftest::local_peers(3);
  Runtimes rts = make_runtimes(peers, 10);  // a failed round's peers wait this long
  CHECK(all_reduce_is_right(rts, {0, 1, 2}, "warm-up", 10));
  const char *env_rounds = std::getenv("KUNGFU_SWAP_ROUNDS");
  const int rounds = env_rounds ? std::atoi(env_rounds) : 60;
  int failed_rounds = 0;
  std::string first_error;
  for (int v = 1; v <= rounds; ++v) {
    const Cluster c = cluster_of(peers, {0, 1, 2}, static_cast<uint32_t>(v));
    std::vector<Status> results(3);
    std::vector<std::vector<float>> in(3, std::vector<float>(16));
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] {
        // 0..1.5 ms apart, a different member first in each round.
        std::this_thread::sleep_for(std::chrono::microseconds(((v + i) % 3) * 500 + (v * 37 + i * 101) % 300));
        Status s = rts[i]->update_cluster(c);
        if (s.ok()) {
          for (auto &x : in[i]) x = static_cast<float>(i + 1);
          Buffer b{in[i].data(), in[i].data(), TensorDesc{DType::kFloat32, {16}, 16}, nullptr};
          s = wait_for([&](DoneCallback done) { rts[i]->all_reduce("first", b, ReduceOp::kSum, done); });
        }
        results[i] = s;
      });
    }
    for (auto &t : threads) t.join();
    bool ok = true;
    for (int i = 0; i < 3; ++i) {
      if (!results[i].ok()) {
        ok = false;
        if (first_error.empty()) first_error = results[i].ToString();
      } else if (in[i][0] != 6.0f || in[i][15] != 6.0f) {
        ok = false;
        if (first_error.empty()) first_error = "wrong sum " + std::to_string(in[i][0]);
      }
    }
    if (!ok) {
      ++failed_rounds;
      // A failed round leaves peers with broken links at this version; the
      // next version starts clean, so the loop goes on and counts.
    }
  }
  std::printf("  staggered swaps: %d of %d rounds failed%s%s\n", failed_rounds, rounds,
              first_error.empty() ? "" : "; first error: ", first_error.c_str());
  CHECK(failed_rounds == 0);
  for (auto &rt : rts) CHECK(rt->rejected_connections() == 0);
}

// How a worker whose transport is being replaced (update_cluster) treats a
// connection its old transport accepted just before: stopped before its
// hello (the client reads EOF), or right after a hello at the old version
// (the client's own hello meets a closed socket: EPIPE).
enum class SwappingServer { kClosesBeforeHello, kClosesAfterOldHello };

// Plays `peer` while it swaps: answers same-host connections to its port
// like a transport that is being stopped until it has answered `cuts` of
// them (or 30 s passed: a client that gave up), then frees the port (the
// real runtime takes it). Sets *bound once the port is bound. The same-host
// socket name is the transport's (socket_setup.cc: unix_address).
void play_swapping_peer(const PeerID &peer, SwappingServer how, int cuts, std::atomic<bool> *bound,
                        std::atomic<int> *answered) {
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  const std::string name = "kungfu-tf-" + std::to_string(peer.port);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
  CHECK(::bind(listener.get(), reinterpret_cast<struct sockaddr *>(&addr), len) == 0);
  CHECK(::listen(listener.get(), 16) == 0);
  *bound = true;
  HandshakeIdentity old_version;
  old_version.job_id = kftest::kTestJobId;
  old_version.cluster_version = 0;
  auto start = std::chrono::steady_clock::now();
  while (*answered < cuts && kftest::seconds_since(start) < 30) {
    struct pollfd p = {listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 5) <= 0) continue;
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    ++*answered;
    if (how == SwappingServer::kClosesAfterOldHello) {
      // The client's hello can no longer arrive (EPIPE on its side), as
      // when the old transport shuts the connection down right after its hello.
      ::shutdown(conn.get(), SHUT_RD);
      std::string err;
      server_handshake(conn.get(), "test-secret", old_version, nullptr, nullptr, &err, 1.0);
    }
  }
}

// A connection that a peer in the middle of its swap closes during the
// handshake (either way above) is retried like one to a peer that has not
// switched yet: the op waits for the peer instead of failing, and nothing
// counts as lost or rejected.
void test_handshake_cut_by_a_swapping_peer_is_retried() {
  for (SwappingServer how : {SwappingServer::kClosesBeforeHello, SwappingServer::kClosesAfterOldHello}) {
    auto peers = kftest::local_peers(2);
    std::vector<std::vector<float>> in = {std::vector<float>(8, 1.0f), std::vector<float>(8, 2.0f)};
    std::atomic<int> answered{0};
    std::atomic<bool> bound{false};
    // Rank 0 is the swapping peer: rank 1 sends to it first (the root of AUTO's
    // tree). It cuts two connections: a client that gave up at the first cut
    // never makes a second one (then the swapping peer stops after 30 s).
    const int kCuts = 2;
    std::thread swapping([&] { play_swapping_peer(peers[0], how, kCuts, &bound, &answered); });
    CHECK(kftest::eventually([&] { return bound.load(); }));
    Runtimes rts(2);
    // Rank 1 retries until its timeout: far above the milliseconds the swap takes.
    RuntimeOptions o = kftest::options(peers, 1, TopologyKind::kAuto, 60);
    o.cluster = Cluster(1, peers);  // version 1: the swapping peer answers at version 0
    CHECK_OK(Runtime::create(o, &rts[1]));
    auto p = std::make_shared<std::promise<Status>>();
    auto f = p->get_future();
    Buffer b{in[1].data(), in[1].data(), TensorDesc{DType::kFloat32, {8}, 8}, nullptr};
    rts[1]->all_reduce("first", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
    swapping.join();
    CHECK(answered.load() >= kCuts);  // retried, not given up at the first cut
    o.self_rank = 0;
    CHECK_OK(Runtime::create(o, &rts[0]));
    Buffer c{in[0].data(), in[0].data(), TensorDesc{DType::kFloat32, {8}, 8}, nullptr};
    Status s0 = wait_for([&](DoneCallback done) { rts[0]->all_reduce("first", c, ReduceOp::kSum, done); });
    Status s = f.get();
    if (!s.ok()) std::fprintf(stderr, "  first op of rank 1: %s\n", s.ToString().c_str());
    CHECK_OK(s);
    CHECK(s0.ok() || !s.ok());  // rank 0 fails only with rank 1
    CHECK(in[0][0] == 3.0f && in[1][7] == 3.0f);
    CHECK(rts[1]->lost_peers().empty() && rts[1]->rejected_connections() == 0);
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"crashed peer is lost, then dropped", test_crashed_peer_is_lost_then_dropped},
      {"dead member refuses fast", test_dead_member_refuses_fast},
      {"shrink 4 -> 2", test_shrink_four_to_two},
      {"grow 2 -> 3 with a joiner", test_grow_with_a_joiner},
      {"shrink to one, grow again", test_shrink_to_one_and_grow_again},
      {"in-flight op fails at the change", test_in_flight_op_fails_at_the_change},
      {"late peer is waited for", test_peer_that_switches_late_is_waited_for},
      {"bad updates are refused", test_bad_updates_are_refused},
      {"interrupt", test_interrupt_fails_pending_and_new_ops},
      {"twenty quick changes", test_twenty_quick_changes},
      {"staggered swaps never fail the first op", test_staggered_swaps_never_fail_the_first_op},
      {"handshake cut by a swapping peer is retried", test_handshake_cut_by_a_swapping_peer_is_retried},
  });
}
