// A failed collective leaves nothing behind: pieces of it that arrive after
// the failure are dropped, never consumed by the next operation under the
// same name (a traced graph reuses its keys every step).
#include <chrono>
#include <thread>

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
          if (x != 66.0f) std::fprintf(stderr, "  %s rank %zu attempt %d: got %g, numpy says 66\n",
                                       topology_name(topo), r, attempt, x);
          CHECK(x == 66.0f);
        }
      }
    }
    // Late pieces of the failed attempts were dropped, not queued forever.
    for (int i = 0; i < 100; ++i) {
      size_t pending = 0;
      for (auto &rt : rts) pending += rt->pending_messages();
      if (pending == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    size_t pending = 0;
    for (auto &rt : rts) pending += rt->pending_messages();
    CHECK(pending == 0);
  }
}

// Every worker numbers the operations of one name in call order, and pieces
// match by that number. A worker that joins an instance after a peer already
// failed it (here: rank 1 is later than the timeout) fails its call at once
// with the peer's reason, instead of pairing with the peer's next instance;
// the next call on both is exact again.
void test_late_joiner_fails_its_instance_only() {
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 1.0);
  std::vector<float> a(3, 1.0f);
  Status s = kftest::wait_for([&](DoneCallback d) {
    Buffer b{a.data(), a.data(), TensorDesc{DType::kFloat32, {3}, 3}, nullptr};
    rts[0]->all_reduce("solo", b, ReduceOp::kSum, d);  // rank 1 is late
  });
  CHECK(s.code() == Code::kDeadlineExceeded);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0's abort reaches rank 1
  std::vector<float> late(3, 2.0f);
  auto start = std::chrono::steady_clock::now();
  Status l = kftest::wait_for([&](DoneCallback d) {
    Buffer b{late.data(), late.data(), TensorDesc{DType::kFloat32, {3}, 3}, nullptr};
    rts[1]->all_reduce("solo", b, ReduceOp::kSum, d);
  });
  CHECK(l.code() == Code::kDeadlineExceeded);
  CHECK(contains(l.message(), "timed out"));
  CHECK(kftest::seconds_since(start) < 0.5);  // the peer's reason, not a second timeout
  CHECK(late[0] == 2.0f);                      // nothing landed in the output
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> in = {std::vector<float>(3, 5.0f), std::vector<float>(3, 7.0f)};
    std::vector<Status> st = all_reduce_everywhere(rts, "solo", in);
    CHECK_OK(st[0]);
    CHECK_OK(st[1]);
    CHECK(in[0][0] == 12.0f && in[1][2] == 12.0f);
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"retry_after_mismatch_is_exact", test_retry_after_mismatch_is_exact},
      {"late_joiner_fails_its_instance_only", test_late_joiner_fails_its_instance_only},
  });
}
