// Frames order memory between the runtimes of one process, and
// ThreadSanitizer must be told so (ops/runtime/socket_order.h): a rank's
// sender thread reads its tensor inside sendmsg(), and after the peer's
// reply a receiving thread of the same rank writes that tensor. Under
// `make tsan` (which suppresses nothing) this program fails with a data
// race report if the ordering is not annotated; with the reports merely
// suppressed it stalls, because TSAN spends a linear scan of a growing
// global list on every racing 8-byte word, and the all-reduces fail on
// their timeout. In every build it checks the results against sums
// computed here.
#include <thread>

#include "test_util.h"

using namespace kungfu;
using kftest::make_cluster;

namespace {

// Rounds of an in-place all-reduce of a 1 MiB tensor between two runtimes:
// rank 1 sends its tensor to rank 0 (the STAR root) and receives the sum
// straight into the same memory, on another thread. Each round writes new
// values, so every round races if the frames do not order the threads.
void test_large_tensors_round_trip() {
  const int n = 2;
  const size_t count = (1 << 20) / sizeof(float);
  auto rts = make_cluster(n, TopologyKind::kStar, 20);
  std::vector<std::vector<float>> v(n, std::vector<float>(count));
  for (int round = 1; round <= 3; ++round) {
    std::vector<Status> st(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        for (size_t i = 0; i < count; ++i) v[r][i] = static_cast<float>(round * (r + 1) + static_cast<int>(i % 7));
        Buffer b{v[r].data(), v[r].data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(count)}, count}, nullptr};
        st[r] = kftest::wait_for([&](DoneCallback d) { rts[r]->all_reduce("big", b, ReduceOp::kSum, d); });
      });
    }
    for (auto &t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      CHECK_OK(st[r]);
      // Sum over ranks of round * (rank + 1) + i % 7.
      bool exact = true;
      for (size_t i = 0; i < count && exact; ++i) {
        exact = v[r][i] == static_cast<float>(round * 3 + 2 * static_cast<int>(i % 7));
      }
      CHECK(exact);
    }
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"large_tensors_round_trip", test_large_tensors_round_trip},
  });
}
