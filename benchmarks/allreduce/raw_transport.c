/*
 * Raw same-host transport limits, used as the yardstick for the all-reduce
 * benchmark (benchmarks/allreduce/run.py compiles and runs this at run time).
 *
 * Usage:
 *   raw_transport exchange tcp|unix SIZE SECONDS
 *       Two processes stream SIZE-byte messages to each other at full speed
 *       in both directions at once (one sender and one receiver thread per
 *       process) for about SECONDS.  Reports the bytes/s of each direction.
 *   raw_transport pingpong tcp|unix ITERS [any|same|split]
 *       Two processes bounce a 4-byte message ITERS times (TCP_NODELAY).
 *       Reports the median / minimum round-trip time.  Placement: "any"
 *       leaves it to the scheduler, "same" pins both peers to one CPU,
 *       "split" pins them to two different CPUs.  Pinning matters on VMs:
 *       waking a peer on another, idle vCPU can cost far more than the
 *       transport itself, and unpinned runs flip between the two cases.
 *
 * Output: one line "RESULT {json}" on stdout; diagnostics go to stderr.
 *
 * The two peers are this process and a fork()ed child.  TCP uses a listening
 * socket on 127.0.0.1 with an ephemeral port; "unix" uses socketpair(), which
 * goes through the same kernel AF_UNIX stream path as a named Unix socket
 * without having to manage a path on disk.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
  perror(what);
  exit(2);
}

static void usage(void);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    p += n;
    len -= (size_t)n;
  }
}

/* Returns the number of bytes read; fewer than len only at EOF. */
static size_t recv_all(int fd, void *buf, size_t len) {
  char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, p + got, len - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("recv");
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  return got;
}

static void set_nodelay(int fd) {
  int one = 1;
  /* Without this, Nagle + delayed ACK turn a 4-byte ping-pong into ~40 ms. */
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    die("setsockopt(TCP_NODELAY)");
}

/* Creates a connected pair: fds[0] for the parent, fds[1] for the child. */
static void make_pair(const char *transport, int fds[2]) {
  if (strcmp(transport, "unix") == 0) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) die("socketpair");
    return;
  }
  if (strcmp(transport, "tcp") != 0) {
    fprintf(stderr, "unknown transport %s (want tcp|unix)\n", transport);
    exit(2);
  }
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0; /* kernel picks a free port */
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0) die("bind");
  if (listen(lfd, 1) != 0) die("listen");
  socklen_t alen = sizeof addr;
  if (getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0) die("getsockname");
  /* connect() completes against the listen backlog, so no second thread is
   * needed before accept(). */
  int cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (cfd < 0) die("socket");
  if (connect(cfd, (struct sockaddr *)&addr, sizeof addr) != 0) die("connect");
  int afd = accept(lfd, NULL, NULL);
  if (afd < 0) die("accept");
  close(lfd);
  set_nodelay(afd);
  set_nodelay(cfd);
  fds[0] = afd;
  fds[1] = cfd;
}

/* ---------------------------------------------------------------- exchange */

struct sender_args {
  int fd;
  size_t size;
  double deadline;
  uint64_t bytes;
};

static void *sender_main(void *p) {
  struct sender_args *a = p;
  char *buf = malloc(a->size);
  if (buf == NULL) die("malloc");
  memset(buf, 0x5a, a->size); /* touch the pages so they are not counted */
  /* Whole messages only: stop at the first message boundary after the
   * deadline, then half-close so the peer's receiver sees EOF. */
  while (now_s() < a->deadline) {
    send_all(a->fd, buf, a->size);
    a->bytes += a->size;
  }
  if (shutdown(a->fd, SHUT_WR) != 0) die("shutdown");
  free(buf);
  return NULL;
}

/* One peer: streams to and from the other; writes its receive stats to out. */
static void exchange_peer(int fd, size_t size, double seconds, FILE *out) {
  char *buf = malloc(size);
  if (buf == NULL) die("malloc");
  memset(buf, 0, size);

  /* Start barrier: both peers are set up before either clock starts. */
  char token = 'g';
  send_all(fd, &token, 1);
  if (recv_all(fd, &token, 1) != 1) die("start barrier");

  double start = now_s();
  struct sender_args sa = {fd, size, start + seconds, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, sender_main, &sa) != 0) die("pthread_create");

  uint64_t received = 0;
  double last = start;
  for (;;) {
    size_t n = recv_all(fd, buf, size);
    if (n == 0) break;
    received += n;
    last = now_s();
  }
  pthread_join(th, NULL);
  double elapsed = last - start;
  fprintf(out, "%llu %.9f %llu\n", (unsigned long long)received, elapsed,
          (unsigned long long)sa.bytes);
  fflush(out);
  free(buf);
}

static int cmd_exchange(const char *transport, size_t size, double seconds) {
  int fds[2];
  make_pair(transport, fds);
  /* The child reports its receive stats to the parent over a pipe so that a
   * single JSON line covers both directions. */
  int pipefd[2];
  if (pipe(pipefd) != 0) die("pipe");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    close(fds[0]);
    close(pipefd[0]);
    FILE *out = fdopen(pipefd[1], "w");
    exchange_peer(fds[1], size, seconds, out);
    fclose(out);
    _exit(0);
  }
  close(fds[1]);
  close(pipefd[1]);
  FILE *self = tmpfile();
  if (self == NULL) die("tmpfile");
  exchange_peer(fds[0], size, seconds, self);
  rewind(self);

  unsigned long long p_recv, p_sent, c_recv, c_sent;
  double p_el, c_el;
  FILE *child = fdopen(pipefd[0], "r");
  if (fscanf(self, "%llu %lf %llu", &p_recv, &p_el, &p_sent) != 3 ||
      fscanf(child, "%llu %lf %llu", &c_recv, &c_el, &c_sent) != 3) {
    fprintf(stderr, "exchange: could not read peer stats\n");
    return 1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "exchange: child failed\n");
    return 1;
  }
  double rate_a = (double)p_recv / p_el; /* child -> parent */
  double rate_b = (double)c_recv / c_el; /* parent -> child */
  printf("RESULT {\"mode\": \"exchange\", \"transport\": \"%s\", "
         "\"size\": %zu, \"seconds\": %.6f, \"bytes\": [%llu, %llu], "
         "\"bytes_per_s\": [%.1f, %.1f], \"bytes_per_s_each_way\": %.1f}\n",
         transport, size, p_el > c_el ? p_el : c_el, p_recv, c_recv, rate_a,
         rate_b, (rate_a + rate_b) / 2.0);
  return 0;
}

/* ---------------------------------------------------------------- pingpong */

/* The index-th CPU (0-based) of this process's affinity mask, or -1. */
static int nth_allowed_cpu(int index) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set) && index-- == 0) return cpu;
  return -1;
}

static void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cmd_pingpong(const char *transport, long iters,
                        const char *placement) {
  int parent_cpu = -1, child_cpu = -1;
  if (strcmp(placement, "same") == 0) {
    parent_cpu = child_cpu = nth_allowed_cpu(0);
  } else if (strcmp(placement, "split") == 0) {
    parent_cpu = nth_allowed_cpu(0);
    child_cpu = nth_allowed_cpu(1);
    if (child_cpu < 0) {
      fprintf(stderr, "pingpong: split needs two CPUs\n");
      return 2;
    }
  } else if (strcmp(placement, "any") != 0) {
    usage();
  }
  int fds[2];
  make_pair(transport, fds);
  const long warmup = iters / 10 + 100;
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    pin_to(child_cpu);
    close(fds[0]);
    uint32_t msg;
    /* Echo until the parent closes the connection. */
    while (recv_all(fds[1], &msg, sizeof msg) == sizeof msg)
      send_all(fds[1], &msg, sizeof msg);
    _exit(0);
  }
  pin_to(parent_cpu);
  close(fds[1]);
  int fd = fds[0];
  double *rtt = malloc(sizeof(double) * (size_t)iters);
  if (rtt == NULL) die("malloc");
  for (long i = -warmup; i < iters; i++) {
    uint32_t msg = (uint32_t)i;
    double t0 = now_s();
    send_all(fd, &msg, sizeof msg);
    if (recv_all(fd, &msg, sizeof msg) != sizeof msg) die("pingpong: EOF");
    double t1 = now_s();
    if (i >= 0) rtt[i] = t1 - t0;
  }
  close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  qsort(rtt, (size_t)iters, sizeof(double), cmp_double);
  printf("RESULT {\"mode\": \"pingpong\", \"transport\": \"%s\", "
         "\"placement\": \"%s\", \"cpus\": [%d, %d], "
         "\"size\": 4, \"iters\": %ld, \"rtt_median_s\": %.9f, "
         "\"rtt_min_s\": %.9f, \"rtt_p90_s\": %.9f}\n",
         transport, placement, parent_cpu, child_cpu, iters, rtt[iters / 2],
         rtt[0], rtt[iters * 9 / 10]);
  free(rtt);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: raw_transport exchange tcp|unix SIZE SECONDS\n"
          "       raw_transport pingpong tcp|unix ITERS [any|same|split]\n");
  exit(2);
}

int main(int argc, char **argv) {
  /* A dying peer must surface as an error message, not a silent SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 5 && strcmp(argv[1], "exchange") == 0) {
    long long size = atoll(argv[3]);
    double seconds = atof(argv[4]);
    if (size <= 0 || seconds <= 0) usage();
    return cmd_exchange(argv[2], (size_t)size, seconds);
  }
  if (argc >= 3 && strcmp(argv[1], "pingpong") == 0) {
    long iters = argc >= 4 ? atol(argv[3]) : 20000;
    if (iters <= 0) usage();
    return cmd_pingpong(argv[2], iters, argc >= 5 ? argv[4] : "any");
  }
  usage();
  return 2;
}
