// The shared-memory transport between same-host peers: the ring itself
// (bytes in order across wrap-around, a full ring, a corrupt peer, what
// attach() refuses), all-reduce over it between threads and between
// processes checked against the sum computed here, a peer killed while we
// wait for it (an error, not a hang) and the forced socket fallback.
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "shm_ring.h"
#include "socket_order.h"
#include "test_util.h"

using kftest::seconds_since;
using kungfu::Buffer;
using kungfu::DoneCallback;
using kungfu::DType;
using kungfu::Runtime;
using kungfu::ShmRing;
using kungfu::Status;
using kungfu::TensorDesc;
using kungfu::TopologyKind;

namespace {

// A writer and a reader of one ring in this process, the reader attached
// through exported descriptors as a peer process would be.
struct RingPair {
  std::unique_ptr<ShmRing> writer, reader;
};

RingPair make_pair(size_t capacity) {
  RingPair p;
  CHECK_OK(ShmRing::create(capacity, &p.writer));
  ShmRing::Descriptors d;
  CHECK_OK(p.writer->export_descriptors(&d));
  CHECK_OK(ShmRing::attach(std::move(d), &p.reader));
  return p;
}

std::atomic<bool> never_stopping{false};

void test_ring_bytes_in_order_across_wraparound() {
  RingPair p = make_pair(ShmRing::kMinCapacity);
  if (!p.reader) return;
  // Sizes that are not divisors of the capacity, so writes straddle its end.
  std::mt19937 rng(7);
  std::vector<char> sent, got;
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  std::thread reader([&] {
    std::vector<char> chunk(777);
    std::string err;
    size_t total = 0;
    while (total < 300000) {
      size_t n = std::min<size_t>(chunk.size(), 300000 - total);
      if (!p.reader->read_exact(chunk.data(), n, sv[1], never_stopping, &err)) break;
      got.insert(got.end(), chunk.begin(), chunk.begin() + n);
      total += n;
    }
  });
  size_t total = 0;
  while (total < 300000) {
    size_t n = std::min<size_t>(1 + rng() % 3000, 300000 - total);
    std::vector<char> piece(n);
    for (char &c : piece) c = static_cast<char>(rng());
    sent.insert(sent.end(), piece.begin(), piece.end());
    size_t done = 0;
    while (done < n) {
      Status s;
      struct iovec iov = {piece.data(), n};
      done += p.writer->write_some(&iov, 1, done, &s);
      CHECK_OK(s);
      if (done < n) CHECK_OK(p.writer->wait_for_space(sv[0], 30));
    }
    total += n;
  }
  reader.join();
  CHECK(got.size() == sent.size());
  CHECK(got == sent);
  ::close(sv[0]);
  ::close(sv[1]);
}

void test_full_ring_takes_what_fits() {
  RingPair p = make_pair(ShmRing::kMinCapacity);
  if (!p.reader) return;
  std::vector<char> big(ShmRing::kMinCapacity + 100, 'x');
  struct iovec iov = {big.data(), big.size()};
  Status s;
  CHECK(p.writer->write_some(&iov, 1, 0, &s) == ShmRing::kMinCapacity);
  CHECK(p.writer->write_some(&iov, 1, ShmRing::kMinCapacity, &s) == 0);  // full: nothing, no error
  CHECK_OK(s);
  std::vector<char> out(100);
  CHECK(p.reader->read_some(out.data(), out.size(), &s) == 100);
  CHECK(p.writer->write_some(&iov, 1, ShmRing::kMinCapacity, &s) == 100);
  CHECK(p.reader->readable(&s) == ShmRing::kMinCapacity);
  CHECK_OK(s);
}

// The ring is written by another process: positions it publishes that would
// take a read or write outside the ring are errors, never used.
void test_corrupt_positions_are_errors() {
  RingPair p = make_pair(ShmRing::kMinCapacity);
  if (!p.reader) return;
  // Reach the shared control block the way a hostile peer would: map the memfd itself.
  ShmRing::Descriptors d;
  CHECK_OK(p.writer->export_descriptors(&d));
  void *m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, d.memory.get(), 0);
  CHECK(m != MAP_FAILED);
  auto *words = static_cast<uint64_t *>(m);
  // Control block: magic, capacity, then tail at byte 64 and head at byte 128.
  words[64 / 8] = ShmRing::kMinCapacity + 1;  // tail: more than the ring holds
  Status s;
  char buf[16];
  CHECK(p.reader->read_some(buf, sizeof(buf), &s) == 0);
  CHECK(!s.ok() && kftest::contains(s.message(), "corrupt"));
  std::atomic<bool> stop{false};
  std::string err;
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  CHECK(!p.reader->read_exact(buf, sizeof(buf), sv[1], stop, &err));
  CHECK(kftest::contains(err, "corrupt"));
  words[128 / 8] = 12345;  // head ahead of what the writer wrote
  Status w;
  struct iovec iov = {buf, sizeof(buf)};
  CHECK(p.writer->write_some(&iov, 1, 0, &w) == 0);
  CHECK(!w.ok() && kftest::contains(w.message(), "corrupt"));
  ::munmap(m, 4096);
  ::close(sv[0]);
  ::close(sv[1]);
}

// Many same-host peers: smaller rings, within the budget of one worker.
void test_ring_capacity_fits_the_budget() {
  CHECK(ShmRing::capacity_for(1) == ShmRing::kDefaultCapacity);
  CHECK(ShmRing::capacity_for(3) == ShmRing::kDefaultCapacity);
  for (int peers : {1, 7, 8, 9, 31, 127, 1023}) {
    size_t c = ShmRing::capacity_for(peers);
    CHECK((c & (c - 1)) == 0);
    CHECK(c >= ShmRing::kSmallestLinkCapacity);
    CHECK(c == ShmRing::kSmallestLinkCapacity || c * peers <= ShmRing::kRingBudget);
    CHECK(c == ShmRing::kDefaultCapacity || 2 * c * peers > ShmRing::kRingBudget);  // no smaller than needed
  }
}

void test_attach_refuses_what_is_not_a_ring() {
  auto attach = [](int mem, int a, int b) {
    ShmRing::Descriptors d;
    d.memory.reset(mem);
    d.data_ready.reset(a);
    d.space_ready.reset(b);
    std::unique_ptr<ShmRing> r;
    return ShmRing::attach(std::move(d), &r);
  };
  auto efd = [] { return ::eventfd(0, EFD_CLOEXEC); };
  // Not sealed: its owner could shrink it and make our reads fault.
  int unsealed = ::memfd_create("t", MFD_CLOEXEC);
  CHECK(::ftruncate(unsealed, 4096 + ShmRing::kMinCapacity) == 0);
  Status s = attach(unsealed, efd(), efd());
  CHECK(!s.ok() && kftest::contains(s.message(), "not sealed"));
  // Sealed, but the wrong size.
  int odd = ::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(::ftruncate(odd, 4096 + 5000) == 0);
  CHECK(::fcntl(odd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
  s = attach(odd, efd(), efd());
  CHECK(!s.ok() && kftest::contains(s.message(), "power-of-two"));
  // Right size, no ring in it (magic 0).
  int blank = ::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(::ftruncate(blank, 4096 + ShmRing::kMinCapacity) == 0);
  CHECK(::fcntl(blank, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
  s = attach(blank, efd(), efd());
  CHECK(!s.ok() && kftest::contains(s.message(), "bad magic"));
  // A pipe where an eventfd should be.
  RingPair p = make_pair(ShmRing::kMinCapacity);
  ShmRing::Descriptors d;
  CHECK_OK(p.writer->export_descriptors(&d));
  int pipefd[2];
  CHECK(::pipe2(pipefd, O_CLOEXEC) == 0);
  ::close(pipefd[1]);
  s = attach(d.memory.release(), pipefd[0], efd());
  CHECK(!s.ok() && kftest::contains(s.message(), "not eventfds"));
  // Not even a memfd.
  s = attach(efd(), efd(), efd());
  CHECK(!s.ok() && kftest::contains(s.message(), "not a memfd"));
}

// The reference: what every rank's input sums to, computed here.
std::vector<float> rank_input(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * 0.5 + (i % 97));
  return v;
}

std::vector<float> expected_sum(int n, size_t count) {
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> v = rank_input(r, count);
    for (size_t i = 0; i < count; ++i) sum[i] += v[i];
  }
  return sum;
}

// Threads of one process, each with its own runtime: sizes from one float to
// several times the ring, so large pieces wait for space and wrap.
void test_all_reduce_between_threads() {
  for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kClique}) {
    auto rts = kftest::make_cluster(3, topo);
    for (size_t count : {size_t(1), size_t(1000), size_t(3) << 20}) {
      std::vector<std::vector<float>> in;
      for (int r = 0; r < 3; ++r) in.push_back(rank_input(r, count));
      auto st = kftest::all_reduce_everywhere(rts, "ar" + std::to_string(count), in);
      std::vector<float> want = expected_sum(3, count);
      for (int r = 0; r < 3; ++r) {
        CHECK_OK(st[r]);
        CHECK(in[r] == want);
      }
    }
    for (auto &rt : rts) CHECK(rt->shm_connections() >= 2);  // every peer's frames came through rings
  }
}

Buffer buffer_of(std::vector<float> &v) {
  return Buffer{v.data(), v.data(), TensorDesc{DType::kFloat32, {int64_t(v.size())}, v.size()}, nullptr};
}

// Ranks in separate processes (the real setting: the ring crosses an
// address space). Each child checks its result and reports by exit status.
void test_all_reduce_between_processes() {
#ifdef KUNGFU_TSAN
  const int n = 2;  // TSAN sees causality between processes of a pair only (below)
#else
  const int n = 3;
#endif
  const size_t count = (size_t(5) << 20) / 4 + 3;  // 5 MiB and a bit: more than two rings' worth
  auto peers = kftest::local_peers(n);
  auto run_rank = [&](int rank) -> int {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, rank, TopologyKind::kRing, 30), &rt).ok()) return 2;
    std::vector<float> want = expected_sum(n, count);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> v = rank_input(rank, count);
      Status s = kftest::wait_for([&](DoneCallback d) {
        rt->all_reduce("big" + std::to_string(round), buffer_of(v), kungfu::ReduceOp::kSum, d);
      });
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return 3;
      }
      if (v != want) return 4;
    }
    return rt->shm_connections() >= 2 ? 0 : 5;
  };
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    pid_t c = ::fork();
    if (c == 0) std::_Exit(run_rank(r));
    children.push_back(c);
  }
  CHECK(run_rank(0) == 0);
  for (pid_t c : children) {
    int status = 0;
    CHECK(::waitpid(c, &status, 0) == c);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

// A peer killed (SIGKILL) while we wait for its piece of an all-reduce over
// the ring: the op fails with Unavailable naming the lost connection, long
// before the 60 s timeout would turn it into DeadlineExceeded.
void test_peer_killed_while_waiting() {
  auto peers = kftest::local_peers(2);
  int ready[2];
  CHECK(::pipe(ready) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, 1, TopologyKind::kStar, 60), &rt).ok()) std::_Exit(2);
    std::vector<float> v(4, 1.0f);
    Status s = kftest::wait_for(
        [&](DoneCallback d) { rt->all_reduce("warm", buffer_of(v), kungfu::ReduceOp::kSum, d); });
    char c = s.ok() ? 1 : 0;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  std::unique_ptr<Runtime> rt;
  CHECK_OK(Runtime::create(kftest::options(peers, 0, TopologyKind::kStar, 60), &rt));
  std::vector<float> v(4, 1.0f);
  CHECK_OK(kftest::wait_for([&](DoneCallback d) { rt->all_reduce("warm", buffer_of(v), kungfu::ReduceOp::kSum, d); }));
  char c = 0;
  CHECK(::read(ready[0], &c, 1) == 1 && c == 1);
  CHECK(rt->shm_connections() == 2);  // both directions through rings
  auto result = std::make_shared<std::promise<Status>>();
  auto f = result->get_future();
  std::vector<float> w(4, 1.0f);
  // Rank 1 never joins this one: we wait in the ring's reader for it.
  rt->all_reduce("never", buffer_of(w), kungfu::ReduceOp::kSum, [result](const Status &s) { result->set_value(s); });
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // Generous: only turns a hang into a failure; the timeout is 60 s.
  CHECK(f.wait_for(std::chrono::seconds(45)) == std::future_status::ready);
  if (f.valid()) {
    Status s = f.get();
    CHECK(s.code() == kungfu::Code::kUnavailable);
    CHECK(kftest::contains(s.message(), "lost connection") || kftest::contains(s.message(), "broke"));
  }
  ::close(ready[0]);
  ::close(ready[1]);
}

// Waits for an op the way a waiting caller does on the fast path: reading
// the rings itself (Runtime::poll_until, budget long enough to never give
// up in a test), then through the receiving threads if it did not finish.
Status poll_for(Runtime &rt, const std::function<void(DoneCallback)> &start,
                std::chrono::nanoseconds budget = std::chrono::seconds(30)) {
  struct Result {
    std::atomic<bool> done{false};
    Status status;
  };
  auto r = std::make_shared<Result>();
  std::promise<void> finished;
  auto f = finished.get_future();
  auto p = std::make_shared<std::promise<void>>(std::move(finished));
  start([r, p](const Status &s) {
    r->status = s;
    r->done.store(true, std::memory_order_release);
    p->set_value();
  });
  if (!rt.poll_until([&r] { return r->done.load(std::memory_order_acquire); }, budget)) f.wait();
  f.wait();
  return r->status;
}

// Processes that wait by polling the rings (the small-message fast path:
// the waiting caller reads its peers' frames and reduces them itself) while
// the receiving threads also run: every size class (one float, a few, one
// 4 KiB page, one piece over the ring's capacity so it must leave frames to
// the receiving thread), each all-reduce bitwise equal to the sum computed
// here, and the polled path really taken.
void test_polled_all_reduce_between_processes() {
#ifdef KUNGFU_TSAN
  // TSAN sees causality between processes only through the pair's own
  // connection (socket_order.h): at np=4 a reply reaches us through a third
  // process, and our send's read of a buffer looks unordered with the
  // reply's write into it. The pairs of np=2 are fully visible.
  const std::vector<int> sizes{2};
#else
  const std::vector<int> sizes{2, 4};
#endif
  for (int n : sizes) {
    for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kClique}) {
      auto peers = kftest::local_peers(n);
      auto run_rank = [&](int rank) -> int {
        std::unique_ptr<Runtime> rt;
        if (!Runtime::create(kftest::options(peers, rank, topo, 30), &rt).ok()) return 2;
        int op = 0;
        for (size_t count : {size_t(1), size_t(3), size_t(1024), (size_t(3) << 20) / 4 + 1}) {
          std::vector<float> want = expected_sum(n, count);
          const int rounds = count > 4096 ? 3 : 40;
          for (int round = 0; round < rounds; ++round) {
            std::vector<float> v = rank_input(rank, count);
            Status s = poll_for(
                *rt,
                [&](DoneCallback d) {
                  rt->all_reduce("p" + std::to_string(op++), buffer_of(v), kungfu::ReduceOp::kSum, d);
                },
                std::chrono::milliseconds(200));
            if (!s.ok()) {
              std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
              return 3;
            }
            if (std::memcmp(v.data(), want.data(), count * sizeof(float)) != 0) return 4;
          }
        }
        if (rt->polled_frames() == 0) return 5;
        return rt->shm_connections() >= 2 ? 0 : 6;
      };
      std::vector<pid_t> children;
      for (int r = 1; r < n; ++r) {
        pid_t c = ::fork();
        if (c == 0) std::_Exit(run_rank(r));
        children.push_back(c);
      }
      int mine = run_rank(0);
      if (mine != 0) std::fprintf(stderr, "np=%d %s: rank 0 exited %d\n", n, kungfu::topology_name(topo), mine);
      CHECK(mine == 0);
      for (pid_t c : children) {
        int status = 0;
        CHECK(::waitpid(c, &status, 0) == c);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
          std::fprintf(stderr, "np=%d %s: a rank exited %d\n", n, kungfu::topology_name(topo), WEXITSTATUS(status));
        }
      }
    }
  }
}

// A peer killed (SIGKILL) while we poll its ring for our piece: the poll
// gives up when its budget ends and the op fails, through the receiving
// thread that sees the socket end, as fast as without polling.
void test_peer_killed_while_polling() {
  auto peers = kftest::local_peers(2);
  int ready[2];
  CHECK(::pipe(ready) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    std::unique_ptr<Runtime> rt;
    if (!Runtime::create(kftest::options(peers, 1, TopologyKind::kStar, 60), &rt).ok()) std::_Exit(2);
    std::vector<float> v(4, 1.0f);
    Status s = poll_for(*rt, [&](DoneCallback d) { rt->all_reduce("warm", buffer_of(v), kungfu::ReduceOp::kSum, d); });
    char c = s.ok() ? 1 : 0;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  std::unique_ptr<Runtime> rt;
  CHECK_OK(Runtime::create(kftest::options(peers, 0, TopologyKind::kStar, 60), &rt));
  std::vector<float> v(4, 1.0f);
  CHECK_OK(poll_for(*rt, [&](DoneCallback d) { rt->all_reduce("warm", buffer_of(v), kungfu::ReduceOp::kSum, d); }));
  char c = 0;
  CHECK(::read(ready[0], &c, 1) == 1 && c == 1);
  std::thread killer([child] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(child, SIGKILL);
  });
  std::vector<float> w(4, 1.0f);
  // Rank 1 never joins this one; we poll its ring for 1 s (the kill comes
  // at 0.2 s), then wait as any caller does. Only a hang fails here.
  Status s = poll_for(
      *rt, [&](DoneCallback d) { rt->all_reduce("never", buffer_of(w), kungfu::ReduceOp::kSum, d); },
      std::chrono::seconds(1));
  killer.join();
  ::waitpid(child, nullptr, 0);
  CHECK(s.code() == kungfu::Code::kUnavailable);
  CHECK(kftest::contains(s.message(), "lost connection") || kftest::contains(s.message(), "broke"));
  ::close(ready[0]);
  ::close(ready[1]);
}

// KUNGFU_SHM=0 (same_host_shm = false): the same all-reduces, over Unix
// sockets only, with no ring anywhere.
void test_forced_socket_fallback() {
  auto peers = kftest::local_peers(2);
  std::vector<std::unique_ptr<Runtime>> rts(2);
  for (int r = 0; r < 2; ++r) {
    kungfu::RuntimeOptions o = kftest::options(peers, r, TopologyKind::kStar);
    o.same_host_shm = false;
    CHECK_OK(Runtime::create(o, &rts[r]));
  }
  std::vector<std::vector<float>> in{rank_input(0, 100000), rank_input(1, 100000)};
  auto st = kftest::all_reduce_everywhere(rts, "sock", in);
  std::vector<float> want = expected_sum(2, 100000);
  for (int r = 0; r < 2; ++r) {
    CHECK_OK(st[r]);
    CHECK(in[r] == want);
    CHECK(rts[r]->shm_connections() == 0);
  }
}

void test_env_value_is_checked() {
  const char *keep_peers = std::getenv("KUNGFU_PEERS");
  ::setenv("KUNGFU_PEERS", "127.0.0.1:10001,127.0.0.1:10002", 1);
  ::setenv("KUNGFU_SELF", "127.0.0.1:10001", 1);
  ::setenv("KUNGFU_JOB_SECRET", std::string(64, 'a').c_str(), 1);
  ::setenv("KUNGFU_JOB_ID", "job", 1);
  kungfu::RuntimeOptions o;
  for (const char *bad : {"yes", "2", " 1", "true"}) {
    ::setenv("KUNGFU_SHM", bad, 1);
    Status s = kungfu::RuntimeOptions::from_env(&o);
    CHECK(!s.ok() && s.code() == kungfu::Code::kInvalidArgument);
    CHECK(kftest::contains(s.message(), "KUNGFU_SHM='" + std::string(bad) + "'"));
  }
  ::setenv("KUNGFU_SHM", "0", 1);
  CHECK_OK(kungfu::RuntimeOptions::from_env(&o));
  CHECK(!o.same_host_shm);
  ::setenv("KUNGFU_SHM", "1", 1);
  CHECK_OK(kungfu::RuntimeOptions::from_env(&o));
  CHECK(o.same_host_shm);
  ::unsetenv("KUNGFU_SHM");
  CHECK_OK(kungfu::RuntimeOptions::from_env(&o));
  CHECK(o.same_host_shm);
  for (const char *v : {"KUNGFU_SELF", "KUNGFU_JOB_SECRET", "KUNGFU_JOB_ID"}) ::unsetenv(v);
  if (keep_peers) {
    ::setenv("KUNGFU_PEERS", keep_peers, 1);
  } else {
    ::unsetenv("KUNGFU_PEERS");
  }
}

}  // namespace

int main() {
  ::signal(SIGPIPE, SIG_IGN);
  return kftest::run_tests({
      {"ring_bytes_in_order_across_wraparound", test_ring_bytes_in_order_across_wraparound},
      {"full_ring_takes_what_fits", test_full_ring_takes_what_fits},
      {"corrupt_positions_are_errors", test_corrupt_positions_are_errors},
      {"attach_refuses_what_is_not_a_ring", test_attach_refuses_what_is_not_a_ring},
      {"ring_capacity_fits_the_budget", test_ring_capacity_fits_the_budget},
      {"env_value_is_checked", test_env_value_is_checked},
      {"forced_socket_fallback", test_forced_socket_fallback},
      {"all_reduce_between_threads", test_all_reduce_between_threads},
      {"all_reduce_between_processes", test_all_reduce_between_processes},
      {"peer_killed_while_waiting", test_peer_killed_while_waiting},
      {"polled_all_reduce_between_processes", test_polled_all_reduce_between_processes},
      {"peer_killed_while_polling", test_peer_killed_while_polling},
  });
}
