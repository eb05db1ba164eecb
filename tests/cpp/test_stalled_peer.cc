// A peer that stops reading (SIGSTOP: a hung process, a full pipe) can block
// no caller: sends from the calling thread (a TF kernel thread) never wait on
// the network, and queued sends fail after the timeout instead of forever.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "test_util.h"

using namespace kungfu;
using kftest::seconds_since;

namespace {

void test_stopped_peer_blocks_no_caller() {
  std::vector<PeerID> peers = kftest::local_peers(2);
  // A push() call that waited on the network would wait until the socket's
  // send timeout (this timeout) or forever; one that does not takes
  // microseconds. kSlowestCall lies between: generous for a loaded machine,
  // and still short of the timeout, so only a call that waited fails it.
  const double timeout = 10.0;
  const double kSlowestCall = timeout / 2;
  // The queued sends fail once the timeout passes (then at once, the link
  // being broken); kSettled only rules out "never".
  const double kSettled = 6 * timeout;
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, 1, TopologyKind::kStar, 60), &rt).ok()) std::_Exit(2);
    for (;;) ::pause();
  }
  std::unique_ptr<Runtime> rt;
  CHECK_OK(Runtime::create(kftest::options(peers, 0, TopologyKind::kStar, timeout), &rt));
  std::vector<float> block(15 * 1024, 1.0f);  // 60 KiB: under the inline-send limit
  Buffer buf{block.data(), block.data(), TensorDesc{DType::kFloat32, {int64_t(block.size())}, block.size()}, nullptr};
  CHECK_OK(kftest::wait_for([&](DoneCallback d) { rt->push(1, "acc", buf, d); }));  // connected
  ::kill(child, SIGSTOP);

  // 2,000 pushes (120 MB, far more than the socket buffers hold) from one thread.
  const int kPushes = 2000;
  std::atomic<int> completed{0}, failed{0};
  std::atomic<bool> caller_done{false};
  double slowest_call = 0;
  std::thread caller([&] {
    for (int i = 0; i < kPushes; ++i) {
      auto t = std::chrono::steady_clock::now();
      rt->push(1, "acc", buf, [&](const Status &s) {
        if (!s.ok()) ++failed;
        ++completed;
      });
      slowest_call = std::max(slowest_call, seconds_since(t));
    }
    caller_done = true;
  });
  auto start = std::chrono::steady_clock::now();
  while (!caller_done && seconds_since(start) < kSettled) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(caller_done);  // before the fix the caller blocked in write() for as long as the peer was stopped
  while (completed < kPushes && seconds_since(start) < kSettled)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  double settled = seconds_since(start);
  std::printf("  slowest push() call %.3fs; %d of %d pushes done after %.1fs, %d failed\n", slowest_call,
              completed.load(), kPushes, settled, failed.load());
  CHECK(slowest_call < kSlowestCall);
  CHECK(completed == kPushes);  // none left hanging
  CHECK(failed > 0);            // the stopped peer's sends failed...
  CHECK(settled < kSettled);    // ...after the timeout, not never
  ::kill(child, SIGKILL);
  caller.join();
  ::waitpid(child, nullptr, 0);
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"stopped_peer_blocks_no_caller", test_stopped_peer_blocks_no_caller},
  });
}
