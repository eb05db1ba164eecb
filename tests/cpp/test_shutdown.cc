// Orderly exit: a worker that has its result and shuts down must not fail
// peers whose own operations are still completing, while a peer that leaves
// still fails, promptly and with a clear message, whatever needs data from it.
#include <algorithm>
#include <chrono>
#include <thread>

#include "test_util.h"

using namespace kungfu;
using kftest::contains;
using kftest::make_cluster;
using kftest::wait_for;

namespace {

using Cluster_ = std::vector<std::unique_ptr<Runtime>>;

Buffer float_buffer(std::vector<float> &v) {
  return Buffer{v.data(), v.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(v.size())}, v.size()}, nullptr};
}

// Every rank runs one all-reduce on its own thread and destroys its runtime
// the moment its result is complete, as a worker process does when its
// script ends. Some ranks start late on purpose, so that early finishers
// leave while the root or ring neighbours are still sending to the others.
// Returns the number of ranks whose all-reduce failed or came out wrong.
int last_collective_then_leave(int n, TopologyKind topo, size_t count, int delayed_every) {
  Cluster_ rts = make_cluster(n, topo, 30);
  std::vector<std::thread> threads;
  std::vector<int> bad(n, 0);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      if (r % delayed_every == delayed_every - 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::vector<float> v(count, static_cast<float>(r + 1));
      Status s = wait_for([&](DoneCallback d) { rts[r]->all_reduce("last", float_buffer(v), ReduceOp::kSum, d); });
      rts[r].reset();  // leave at once
      float expect = static_cast<float>(n * (n + 1) / 2);
      if (!s.ok()) {
        std::fprintf(stderr, "  rank %d of %d: %s\n", r, n, s.ToString().c_str());
        bad[r] = 1;
      } else if (v.front() != expect || v.back() != expect) {
        std::fprintf(stderr, "  rank %d of %d: wrong result %f\n", r, n, v.front());
        bad[r] = 1;
      }
    });
  }
  for (auto &t : threads) t.join();
  int failed = 0;
  for (int b : bad) failed += b;
  return failed;
}

void test_finishers_do_not_fail_their_peers() {
  struct Case {
    int n;
    TopologyKind topo;
    size_t bytes;
  };
  const Case cases[] = {
      {4, TopologyKind::kStar, 64 << 10},    {8, TopologyKind::kStar, 64 << 10},
      {16, TopologyKind::kStar, 64 << 10},   {8, TopologyKind::kRing, 1 << 20},
      {16, TopologyKind::kRing, 1 << 20},    {8, TopologyKind::kBinaryTree, 256 << 10},
      {16, TopologyKind::kClique, 16 << 10}, {8, TopologyKind::kRing, 8 << 20},
  };
  for (const Case &c : cases) {
    int failures = 0;
    for (int rep = 0; rep < 3; ++rep) {
      failures += last_collective_then_leave(c.n, c.topo, c.bytes / sizeof(float), rep + 2);
    }
    if (failures) {
      std::fprintf(stderr, "  np=%d %s %zu bytes: %d rank-runs failed\n", c.n, topology_name(c.topo), c.bytes,
                   failures);
    }
    CHECK(failures == 0);
  }
}

// A peer that leaves in order fails only what still needs data from it, at
// once (not after the timeout), naming it; work among the others goes on.
// "At once" is told by the failure itself, not the clock: a wait that ran
// into the 30 s timeout ends DeadlineExceeded ("timed out"), a failure from
// the goodbye Unavailable naming the leaver.
void test_leaver_fails_only_what_needs_it() {
  Cluster_ rts = make_cluster(3, TopologyKind::kStar, 30);
  {
    std::vector<float> v0(10, 1), v1(10, 1), v2(10, 1);
    std::vector<std::thread> ts;
    std::vector<Status> st(3);
    std::vector<std::vector<float> *> vs = {&v0, &v1, &v2};
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        st[r] = wait_for(
            [&](DoneCallback d) { rts[r]->all_reduce("warmup", float_buffer(*vs[r]), ReduceOp::kSum, d); });
      });
    }
    for (auto &t : ts) t.join();
    for (auto &s : st) CHECK_OK(s);
  }
  // Rank 0 waits for a message rank 2 will never send: it must fail as soon as 2 leaves.
  std::vector<float> a(10, 1);
  auto pa = std::make_shared<std::promise<Status>>();
  auto fa = pa->get_future();
  rts[0]->all_reduce("needs-rank-2", float_buffer(a), ReduceOp::kSum, [pa](const Status &s) { pa->set_value(s); });
  rts[2].reset();
  Status s = fa.get();
  CHECK(s.code() == Code::kUnavailable);
  CHECK(contains(s.message(), "rank 2"));
  CHECK(contains(s.message(), "left"));
  CHECK(!contains(s.message(), "lost connection"));
  // Rank 1 took no part in that op and must not have failed anything: a p2p
  // exchange between 0 and 1 still works.
  std::vector<float> blob(5, 7), got(5, 0);
  rts[1]->save("model", 1, blob.data(), blob.size() * sizeof(float));
  Status r = wait_for(
      [&](DoneCallback d) { rts[0]->request(1, "model", 1, got.data(), got.size() * sizeof(float), nullptr, d); });
  CHECK_OK(r);
  CHECK(got == blob);
  // A new collective that includes the leaver fails at once on every
  // remaining worker (rank 1 never talks to rank 2 in a star: it learns the
  // reason from rank 0), not after the timeout.
  std::vector<float> b0(10, 1), b1(10, 1);
  auto p0 = std::make_shared<std::promise<Status>>();
  auto f0 = p0->get_future();
  rts[0]->all_reduce("after-leave", float_buffer(b0), ReduceOp::kSum, [p0](const Status &s) { p0->set_value(s); });
  Status late = wait_for(
      [&](DoneCallback d) { rts[1]->all_reduce("after-leave", float_buffer(b1), ReduceOp::kSum, d); });
  Status late0 = f0.get();
  CHECK(late0.code() == Code::kUnavailable && late.code() == Code::kUnavailable);
  CHECK(contains(late0.message(), "rank 2") && contains(late0.message(), "left"));
  CHECK(contains(late.message(), "rank 2") && contains(late.message(), "left"));
}

// Shutdown is bounded: a worker with an op that can never complete (its
// peer never joins) still shuts down without waiting for it, and the op
// fails rather than hanging its caller. Told by events, not the clock: the
// op fails from the shutdown ("shut"), not from its 60 s timeout, and the
// leave gives up on no link at its deadline (it waits for nothing).
void test_shutdown_is_bounded() {
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 60);
  std::vector<float> a(10, 1);
  auto pa = std::make_shared<std::promise<Status>>();
  auto fa = pa->get_future();
  rts[0]->all_reduce("never", float_buffer(a), ReduceOp::kSum, [pa](const Status &s) { pa->set_value(s); });
  rts[0]->shutdown();
  CHECK(rts[0]->leaves_cut_by_deadline() == 0);
  rts[0].reset();
  // Failed by the shutdown itself (already, or within milliseconds): 30 s only rules out "never".
  CHECK(fa.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  if (fa.valid() && fa.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    Status s = fa.get();
    CHECK(!s.ok());
    CHECK(contains(s.message(), "shut"));
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"finishers_do_not_fail_their_peers", test_finishers_do_not_fail_their_peers},
      {"leaver_fails_only_what_needs_it", test_leaver_fails_only_what_needs_it},
      {"shutdown_is_bounded", test_shutdown_is_bounded},
  });
}
