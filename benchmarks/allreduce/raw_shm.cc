// The raw shared-memory limit: what the runtime's ring (ops/runtime/
// shm_ring.h) carries between two processes with nothing else around it,
// beside the memory bandwidth that bounds it. benchmarks/allreduce/run.py
// compiles it with the ring's sources and puts its numbers in the "Raw
// transport limit" table, next to raw_transport.c's sockets.
//
//   raw_shm memcpy SIZE SECONDS
//       One thread copies a SIZE-byte buffer into another for about SECONDS
//       (memory bandwidth: every ring byte is copied in once and out once).
//   raw_shm exchange SIZE SECONDS
//       Two processes stream SIZE-byte messages to each other through one
//       ring per direction (a sender and a receiver thread each) for about
//       SECONDS; the bytes/s of each direction, as raw_transport exchange.
//   raw_shm pingpong ITERS [any|same|split]
//       Two processes bounce a 4-byte message through the rings ITERS times
//       (the ring's wait: a bounded spin, then an eventfd); placement as
//       raw_transport pingpong.
//
// Output: one line "RESULT {json}" (transport "shm"); diagnostics on stderr.
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shm_ring.h"

namespace {

using kungfu::ShmRing;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "raw_shm: %s\n", what.c_str());
  std::exit(2);
}

// One process's ends: the ring it writes, the ring it reads, and the socket
// beside them (its end tells each side that the other is gone).
struct Ends {
  std::unique_ptr<ShmRing> out, in;
  int socket = -1;
};

// Two rings and a socketpair; the child's ends are attached from the
// descriptors as a peer process attaches them (here they are inherited by fork).
void make_ends(Ends *parent, Ends *child) {
  std::unique_ptr<ShmRing> a, b;
  if (!ShmRing::create(ShmRing::kDefaultCapacity, &a).ok() || !ShmRing::create(ShmRing::kDefaultCapacity, &b).ok()) {
    die("cannot create rings");
  }
  ShmRing::Descriptors da, db;
  if (!a->export_descriptors(&da).ok() || !b->export_descriptors(&db).ok()) die("cannot export descriptors");
  std::unique_ptr<ShmRing> ra, rb;
  if (!ShmRing::attach(std::move(da), &ra).ok() || !ShmRing::attach(std::move(db), &rb).ok()) die("cannot attach");
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
  parent->out = std::move(a);  // parent -> child through a
  child->in = std::move(ra);
  child->out = std::move(b);  // child -> parent through b
  parent->in = std::move(rb);
  parent->socket = sv[0];
  child->socket = sv[1];
}

std::atomic<bool> never_stopping{false};

void write_all(ShmRing &ring, int socket, const char *data, size_t len) {
  size_t done = 0;
  while (done < len) {
    kungfu::Status s;
    struct iovec iov = {const_cast<char *>(data), len};
    done += ring.write_some(&iov, 1, done, &s);
    if (!s.ok()) die(s.message());
    if (done < len) {
      s = ring.wait_for_space(socket, 60);
      if (!s.ok()) die(s.message());
    }
  }
}

bool read_all(ShmRing &ring, int socket, char *data, size_t len) {
  std::string err;
  return ring.read_exact(data, len, socket, never_stopping, &err);
}

int cmd_memcpy(size_t size, double seconds) {
  std::vector<char> a(size, 1), b(size, 2);
  double start = now_s(), end = start + seconds;
  uint64_t bytes = 0;
  while (now_s() < end) {
    std::memcpy(b.data(), a.data(), size);
    bytes += size;
    std::swap(a, b);
  }
  double elapsed = now_s() - start;
  std::printf(
      "RESULT {\"mode\": \"memcpy\", \"transport\": \"shm\", \"size\": %zu, \"seconds\": %.6f, "
      "\"bytes_per_s\": %.1f}\n",
      size, elapsed, bytes / elapsed);
  return 0;
}

// One peer of the exchange: a sender thread streams for `seconds` then ends
// with a zero-length marker; this thread receives until the peer's marker.
// Prints "received elapsed" on `out`.
void exchange_peer(Ends &e, size_t size, double start, double seconds, FILE *out) {
  std::thread sender([&] {
    std::vector<char> buf(size, 0x5a);
    uint64_t len = size;
    // At least one message, however late this process got the core.
    do {
      write_all(*e.out, e.socket, reinterpret_cast<const char *>(&len), sizeof(len));
      write_all(*e.out, e.socket, buf.data(), size);
    } while (now_s() < start + seconds);
    uint64_t end = 0;
    write_all(*e.out, e.socket, reinterpret_cast<const char *>(&end), sizeof(end));
  });
  std::vector<char> buf(size);
  uint64_t received = 0;
  double last = start;
  while (true) {
    uint64_t len = 0;
    if (!read_all(*e.in, e.socket, reinterpret_cast<char *>(&len), sizeof(len))) die("exchange: peer gone");
    if (len == 0) break;
    if (len != size || !read_all(*e.in, e.socket, buf.data(), size)) die("exchange: bad message");
    received += size;
    last = now_s();
  }
  sender.join();
  std::fprintf(out, "%llu %.9f\n", static_cast<unsigned long long>(received), last - start);
  std::fflush(out);
}

int cmd_exchange(size_t size, double seconds) {
  Ends parent, child;
  make_ends(&parent, &child);
  int pipefd[2];
  if (::pipe(pipefd) != 0) die("pipe");
  // Both start on one clock: the parent picks the start a little ahead.
  double start = now_s() + 0.2;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(parent.socket);
    parent = Ends();
    FILE *out = ::fdopen(pipefd[1], "w");
    while (now_s() < start) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    exchange_peer(child, size, start, seconds, out);
    std::fclose(out);
    std::_Exit(0);
  }
  ::close(pipefd[1]);
  ::close(child.socket);
  child = Ends();
  FILE *self = std::tmpfile();
  while (now_s() < start) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  exchange_peer(parent, size, start, seconds, self);
  std::rewind(self);
  unsigned long long p_recv = 0, c_recv = 0;
  double p_el = 0, c_el = 0;
  FILE *from_child = ::fdopen(pipefd[0], "r");
  if (std::fscanf(self, "%llu %lf", &p_recv, &p_el) != 2 || std::fscanf(from_child, "%llu %lf", &c_recv, &c_el) != 2) {
    die("exchange: could not read peer stats");
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("exchange: child failed");
  double rate_a = p_recv / p_el, rate_b = c_recv / c_el;
  std::printf(
      "RESULT {\"mode\": \"exchange\", \"transport\": \"shm\", \"size\": %zu, \"seconds\": %.6f, "
      "\"bytes\": [%llu, %llu], \"bytes_per_s\": [%.1f, %.1f], \"bytes_per_s_each_way\": %.1f}\n",
      size, std::max(p_el, c_el), p_recv, c_recv, rate_a, rate_b, (rate_a + rate_b) / 2);
  return 0;
}

int nth_allowed_cpu(int index) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set) && index-- == 0) return cpu;
  }
  return -1;
}

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) die("sched_setaffinity");
}

int cmd_pingpong(long iters, const std::string &placement) {
  int parent_cpu = -1, child_cpu = -1;
  if (placement == "same") {
    parent_cpu = child_cpu = nth_allowed_cpu(0);
  } else if (placement == "split") {
    parent_cpu = nth_allowed_cpu(0);
    child_cpu = nth_allowed_cpu(1);
    if (child_cpu < 0) die("pingpong: split needs two CPUs");
  } else if (placement != "any") {
    die("pingpong: placement is any, same or split");
  }
  Ends parent, child;
  make_ends(&parent, &child);
  const long warmup = iters / 10 + 100;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(parent.socket);
    parent = Ends();
    pin_to(child_cpu);
    uint32_t msg;
    // Echo until the parent ends its socket.
    while (read_all(*child.in, child.socket, reinterpret_cast<char *>(&msg), sizeof(msg))) {
      write_all(*child.out, child.socket, reinterpret_cast<const char *>(&msg), sizeof(msg));
    }
    std::_Exit(0);
  }
  ::close(child.socket);
  child = Ends();
  pin_to(parent_cpu);
  std::vector<double> rtt(iters);
  for (long i = -warmup; i < iters; ++i) {
    uint32_t msg = static_cast<uint32_t>(i);
    double t0 = now_s();
    write_all(*parent.out, parent.socket, reinterpret_cast<const char *>(&msg), sizeof(msg));
    if (!read_all(*parent.in, parent.socket, reinterpret_cast<char *>(&msg), sizeof(msg))) die("pingpong: peer gone");
    double t1 = now_s();
    if (i >= 0) rtt[i] = t1 - t0;
  }
  ::close(parent.socket);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::sort(rtt.begin(), rtt.end());
  std::printf(
      "RESULT {\"mode\": \"pingpong\", \"transport\": \"shm\", \"placement\": \"%s\", \"cpus\": [%d, %d], "
      "\"size\": 4, \"iters\": %ld, \"rtt_median_s\": %.9f, \"rtt_min_s\": %.9f, \"rtt_p90_s\": %.9f}\n",
      placement.c_str(), parent_cpu, child_cpu, iters, rtt[iters / 2], rtt[0], rtt[iters * 9 / 10]);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  ::signal(SIGPIPE, SIG_IGN);
  std::string mode = argc >= 2 ? argv[1] : "";
  if ((mode == "memcpy" || mode == "exchange") && argc == 4) {
    long long size = std::atoll(argv[2]);
    double seconds = std::atof(argv[3]);
    if (size > 0 && seconds > 0) {
      return mode == "memcpy" ? cmd_memcpy(size, seconds) : cmd_exchange(size, seconds);
    }
  }
  if (mode == "pingpong" && argc >= 3) {
    long iters = std::atol(argv[2]);
    if (iters > 0) return cmd_pingpong(iters, argc >= 4 ? argv[3] : "any");
  }
  std::fprintf(stderr,
               "usage: raw_shm memcpy SIZE SECONDS\n"
               "       raw_shm exchange SIZE SECONDS\n"
               "       raw_shm pingpong ITERS [any|same|split]\n");
  return 2;
}
