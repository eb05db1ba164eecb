// A failed collective leaves nothing behind: pieces of it that arrive after
// the failure are dropped, never consumed by the next operation under the
// same name (a traced graph reuses its keys every step).
#include <chrono>

#include "test_util.h"

using namespace kungfu;
using kftest::all_reduce_everywhere;
using kftest::contains;
using kftest::make_cluster;

namespace {

using Cluster_ = std::vector<std::unique_ptr<Runtime>>;

// The measurement: at np=3, after an all-reduce failed on a shape
// mismatch, the retry under the same name with consistent shapes must give
// numpy's sum on every rank (it gave 145 where the sum is 66).
void test_retry_after_mismatch_is_exact() {
  for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree}) {
    Cluster_ rts = make_cluster(3, topo, 30);
    for (int attempt = 0; attempt < 5; ++attempt) {
      // Rank 1 disagrees on the shape: every rank fails.
      std::vector<std::vector<float>> bad = {std::vector<float>(4, 1.0f), std::vector<float>(5, 100.0f),
                                             std::vector<float>(4, 1000.0f)};
      for (const Status &s : all_reduce_everywhere(rts, "step", bad)) CHECK(!s.ok());
      // Same name, consistent shapes: exactly the sum of this attempt's inputs.
      std::vector<std::vector<float>> good = {std::vector<float>(4, 11.0f), std::vector<float>(4, 22.0f),
                                              std::vector<float>(4, 33.0f)};
      std::vector<Status> st = all_reduce_everywhere(rts, "step", good);
      for (size_t r = 0; r < st.size(); ++r) {
        CHECK_OK(st[r]);
        for (float x : good[r]) {
          if (x != 66.0f)
            std::fprintf(stderr, "  %s rank %zu attempt %d: got %g, numpy says 66\n", topology_name(topo), r, attempt,
                         x);
          CHECK(x == 66.0f);
        }
      }
    }
    // Late pieces of the failed attempts were dropped, not queued forever
    // (they arrive within milliseconds; 30 s only rules out "never").
    CHECK(kftest::eventually([&] {
      size_t pending = 0;
      for (auto &rt : rts) pending += rt->pending_messages();
      return pending == 0;
    }));
  }
}

// Every worker numbers the operations of one name in call order, and pieces
// match by that number. A worker that joins an instance after a peer already
// failed it (here: rank 1 is later than rank 0's timeout) fails its call at
// once with the peer's reason, instead of pairing with the peer's next
// instance; the next call on both is exact again.
void test_late_joiner_fails_its_instance_only() {
  // Rank 0's timeout is what its lone op costs. Rank 1's is far longer than
  // this test, so its call can only fail through rank 0's abort, never
  // through a timeout of its own, however slow the machine.
  constexpr double kRank0Timeout = 1.0, kRank1Timeout = 120;
  Cluster_ rts = make_cluster({kRank0Timeout, kRank1Timeout}, TopologyKind::kStar);
  const TensorDesc desc3{DType::kFloat32, {3}, 3};
  std::vector<float> a(3, 1.0f);
  Status s = kftest::wait_for([&](DoneCallback d) {
    rts[0]->all_reduce("solo", Buffer{a.data(), a.data(), desc3, nullptr}, ReduceOp::kSum, d);  // rank 1 is late
  });
  CHECK(s.code() == Code::kDeadlineExceeded);
  // Wait until rank 0's abort has reached rank 1. Rank 0 queued it before it
  // reported the failure, frames to a peer travel in call order, and a peer
  // handles each frame before it reads the next: once rank 1 has added a
  // push that rank 0 sends now, it has recorded the abort.
  float one = 1.0f;
  const TensorDesc desc1{DType::kFloat32, {1}, 1};
  CHECK_OK(kftest::wait_for([&](DoneCallback d) {
    rts[0]->push(1, "after-abort", Buffer{&one, nullptr, desc1, nullptr}, d);
  }));
  int64_t pushed = 0;
  Status taken;
  CHECK(kftest::eventually([&] {
    float sum = 0;
    int64_t n = 0;
    taken = rts[1]->take("after-abort", &sum, desc1, &n);
    pushed += n;
    return !taken.ok() || pushed > 0;
  }));
  CHECK_OK(taken);
  CHECK(pushed == 1);
  std::vector<float> late(3, 2.0f);
  Status l = kftest::wait_for([&](DoneCallback d) {
    rts[1]->all_reduce("solo", Buffer{late.data(), late.data(), desc3, nullptr}, ReduceOp::kSum, d);
  });
  CHECK(l.code() == Code::kDeadlineExceeded);
  CHECK(contains(l.message(), "timed out"));
  // The peer's reason, not a timeout of rank 1's own (120 s, longer than
  // this test): rank 0's message, named as reported by it. The message
  // tells, not the clock.
  CHECK(contains(l.message(), "reported by"));
  CHECK(late[0] == 2.0f);  // nothing landed in the output
  for (int step = 0; step < 3; ++step) {
    // Rank 0 (root of the star) waits for rank 1's piece, and its timeout
    // is short: rank 1 starts first, and rank 0 only once it holds that
    // piece, so rank 0 waits on nothing and the short timeout never decides.
    std::vector<float> in0(3, 5.0f), in1(3, 7.0f);
    const size_t held = rts[0]->pending_messages();
    auto p1 = std::make_shared<std::promise<Status>>();
    auto f1 = p1->get_future();
    rts[1]->all_reduce("solo", Buffer{in1.data(), in1.data(), desc3, nullptr}, ReduceOp::kSum,
                       [p1](const Status &st) { p1->set_value(st); });
    CHECK(kftest::eventually([&] { return rts[0]->pending_messages() > held; }));
    Status s0 = kftest::wait_for([&](DoneCallback d) {
      rts[0]->all_reduce("solo", Buffer{in0.data(), in0.data(), desc3, nullptr}, ReduceOp::kSum, d);
    });
    CHECK_OK(s0);
    CHECK_OK(f1.get());
    CHECK(in0[0] == 12.0f && in1[2] == 12.0f);
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"retry_after_mismatch_is_exact", test_retry_after_mismatch_is_exact},
      {"late_joiner_fails_its_instance_only", test_late_joiner_fails_its_instance_only},
  });
}
