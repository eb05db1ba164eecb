// Runtime::update_cluster: an atomic, in-process cluster change (elastic
// training). Runtimes of one process over real sockets shrink, grow and
// reorder; every all-reduce right after a change must give the new cluster's
// sum, an op in flight at the change must fail at once with a clear error,
// old-version frames must never reach the new version, and twenty quick
// changes must keep the ports bound and leak neither sockets nor threads.
#include <dirent.h>

#include <thread>

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
        std::fprintf(stderr, "all_reduce '%s' on member %d: element %zu is %g, expected %g\n", name.c_str(),
                     members[i], j, in[i][j], weight * static_cast<float>(j + 1));
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

void test_in_flight_op_fails_at_the_change() {
  auto peers = kftest::local_peers(2);
  Runtimes rts = make_runtimes(peers, 30);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  // Rank 0 waits for rank 1, which never joins this all-reduce: it must fail
  // when the cluster changes, not after the 30 s timeout.
  std::vector<float> x(10, 1.0f);
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[0]->all_reduce("stranded", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  // Rank 1 starts one the other way round: its piece reaches rank 0's old
  // version, and must never be mixed into the new version's op of that name.
  std::vector<float> y(10, 100.0f);
  auto q = std::make_shared<std::promise<Status>>();
  auto g = q->get_future();
  Buffer c{y.data(), y.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[1]->all_reduce("stale", c, ReduceOp::kSum, [q](const Status &s) { q->set_value(s); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto start = std::chrono::steady_clock::now();
  for (const Status &s : update_all(rts, {0, 1}, cluster_of(peers, {1, 0}, 5))) CHECK_OK(s);
  CHECK(f.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  Status s = f.get();
  CHECK(s.code() == Code::kUnavailable && contains(s.message(), "cluster changed to version 5") &&
        contains(s.message(), "stranded"));
  CHECK(g.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(g.get().code() == Code::kUnavailable);
  CHECK(kftest::seconds_since(start) < 5);
  // Reordered: rank 1 is now rank 0. "stale" of the new version sums only new contributions.
  CHECK(rts[1]->rank() == 0 && rts[0]->rank() == 1);
  CHECK(all_reduce_is_right(rts, {1, 0}, "stale", 10));
  CHECK(rts[0]->pending_messages() == 0 && rts[1]->pending_messages() == 0);
}

void test_peer_that_switches_late_is_waited_for() {
  auto peers = kftest::local_peers(2);
  Runtimes rts = make_runtimes(peers);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  Cluster next = cluster_of(peers, {0, 1}, 1);
  CHECK_OK(rts[0]->update_cluster(next));
  // Rank 0 is at version 1 and starts at once; rank 1 switches 300 ms later.
  // Rank 0's connection attempts meet version 0 and retry; nothing counts
  // as a crash or a stranger on either side.
  std::vector<float> x(100, 1.0f), y(100, 2.0f);
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
  CHECK(older.code() == Code::kInvalidArgument && contains(older.message(), "greater than the current cluster version 3"));
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
  Runtimes rts = make_runtimes(peers, 30);
  CHECK(all_reduce_is_right(rts, {0, 1}, "warm-up"));
  std::vector<float> x(10, 1.0f);
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Buffer b{x.data(), x.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
  rts[0]->all_reduce("blocked", b, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto start = std::chrono::steady_clock::now();
  std::thread watcher([&] { rts[0]->interrupt("peer lost: recovering"); });
  watcher.join();
  CHECK(f.wait_for(std::chrono::seconds(2)) == std::future_status::ready);
  Status s = f.get();
  CHECK(s.code() == Code::kUnavailable && contains(s.message(), "peer lost: recovering"));
  CHECK(kftest::seconds_since(start) < 2);
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
  auto peers = kftest::local_peers(3);
  Runtimes rts = make_runtimes(peers);
  CHECK(all_reduce_is_right(rts, {0, 1, 2}, "x"));
  const size_t fds = count_entries("/proc/self/fd");
  const size_t threads = count_entries("/proc/self/task");
  const std::vector<std::vector<int>> orders = {{2, 0, 1}, {1, 2, 0}, {0, 1, 2}, {2, 1, 0}};
  auto start = std::chrono::steady_clock::now();
  for (uint32_t v = 1; v <= 20; ++v) {
    const std::vector<int> &order = orders[v % orders.size()];
    for (const Status &s : update_all(rts, {0, 1, 2}, cluster_of(peers, order, v))) CHECK_OK(s);
    CHECK(rts[order[0]]->rank() == 0 && rts[order[2]]->rank() == 2);
    CHECK(all_reduce_is_right(rts, order, "x", 10));
  }
  double per_change = kftest::seconds_since(start) / 20;
  std::printf("  update_cluster + first all-reduce at np=3: %.1f ms per change\n", per_change * 1e3);
  // Old connections are closed, old threads joined: nothing grows with the
  // number of versions (a little slack for connections still closing).
  CHECK(count_entries("/proc/self/fd") <= fds + 2);
  CHECK(count_entries("/proc/self/task") <= threads + 2);
  for (auto &rt : rts) CHECK(rt->lost_peers().empty() && rt->rejected_connections() == 0);
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"shrink 4 -> 2", test_shrink_four_to_two},
      {"grow 2 -> 3 with a joiner", test_grow_with_a_joiner},
      {"in-flight op fails at the change", test_in_flight_op_fails_at_the_change},
      {"late peer is waited for", test_peer_that_switches_late_is_waited_for},
      {"bad updates are refused", test_bad_updates_are_refused},
      {"interrupt", test_interrupt_fails_pending_and_new_ops},
      {"twenty quick changes", test_twenty_quick_changes},
  });
}
