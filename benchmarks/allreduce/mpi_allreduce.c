/*
 * Open MPI's MPI_Allreduce (float32 sum), the second anchor of the all-reduce
 * benchmark beside TensorFlow's MWMS.  benchmarks/allreduce/mpi.py compiles this
 * with mpicc at run time and starts it with mpirun on loopback only.
 *
 * Usage (under mpirun, every rank gets the same arguments):
 *   mpi_allreduce time SIZES REPEATS TARGET_SECONDS MAX_ITERS WARMUP_CALLS
 *       SIZES is a comma-separated list of byte counts (multiples of 4).
 *       Times each size with the protocol of benchmarks/harness/timing.py's
 *       measure(): one set-up call, WARMUP_CALLS - 1 calls to estimate the
 *       per-call time, a loop length that lasts about TARGET_SECONDS (ranks
 *       agree on the mean estimate, capped at MAX_ITERS), then REPEATS timed
 *       loops, each after a barrier.  Rank 0 prints one line per size:
 *         RESULT {"impl": "mpi", "topology": "MPI", "np": N, "size": B,
 *                 "iters": I, "samples_s": [...]}
 *       (allreduce.py takes the median of samples_s, as for the others).
 *   mpi_allreduce verify IN_PREFIX OUT_PREFIX
 *       Rank r all-reduces the raw float32 file IN_PREFIX.r and writes the
 *       sum to OUT_PREFIX.r, so a test can check it against numpy.
 *
 * Exit status 0 on success; diagnostics go to stderr.  Every rank checks
 * the timed result (all ones summed = N) so a broken MPI is not timed.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sum_floats(const float *in, float *out, int count) {
  MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* Times one size; returns 0 on success. */
static int time_size(long bytes, int repeats, double target_s, int max_iters, int warmup_calls, int rank,
                     int nranks) {
  /* A 0-element tensor is not benchmarked: at least one float, as the TF
   * workers do with max(1, size // 4). */
  int count = bytes / 4 > 0 ? (int)(bytes / 4) : 1;
  float *in = malloc((size_t)count * sizeof(float));
  float *out = malloc((size_t)count * sizeof(float));
  double *samples = malloc((size_t)repeats * sizeof(double));
  if (in == NULL || out == NULL || samples == NULL) {
    fprintf(stderr, "rank %d: out of memory for %ld bytes\n", rank, bytes);
    return 1;
  }
  for (int i = 0; i < count; ++i) in[i] = 1.0f;

  sum_floats(in, out, count); /* connection / shared-memory set-up */
  if (out[0] != (float)nranks || out[count - 1] != (float)nranks) {
    fprintf(stderr, "rank %d: wrong all-reduce result %g/%g, expected %d\n", rank, out[0], out[count - 1], nranks);
    return 1;
  }
  double t0 = now_s();
  for (int i = 0; i < warmup_calls - 1; ++i) sum_floats(in, out, count);
  double per_call = (now_s() - t0) / (warmup_calls > 1 ? warmup_calls - 1 : 1);

  /* Same loop length on every rank: the mean of the ranks' estimates. */
  double wanted = target_s / (per_call > 1e-9 ? per_call : 1e-9);
  if (wanted < 1.0) wanted = 1.0;
  if (wanted > max_iters) wanted = max_iters;
  double total = 0.0;
  MPI_Allreduce(&wanted, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int iters = (int)(total / nranks);
  if (iters < 1) iters = 1;
  if (iters > max_iters) iters = max_iters;

  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    for (int i = 0; i < iters; ++i) sum_floats(in, out, count);
    samples[r] = (now_s() - t0) / iters;
  }
  if (rank == 0) {
    printf("RESULT {\"impl\": \"mpi\", \"topology\": \"MPI\", \"np\": %d, \"size\": %ld, \"iters\": %d, \"samples_s\": [",
           nranks, bytes, iters);
    for (int r = 0; r < repeats; ++r) printf("%s%.9g", r ? ", " : "", samples[r]);
    printf("]}\n");
    fflush(stdout);
  }
  free(in);
  free(out);
  free(samples);
  return 0;
}

static int run_time(char **argv, int rank, int nranks) {
  int repeats = atoi(argv[1]);
  double target_s = atof(argv[2]);
  int max_iters = atoi(argv[3]);
  int warmup_calls = atoi(argv[4]);
  if (repeats < 1 || !(target_s > 0.0) || max_iters < 1 || warmup_calls < 1) {
    fprintf(stderr, "bad REPEATS/TARGET_SECONDS/MAX_ITERS/WARMUP_CALLS: %s %s %s %s\n", argv[1], argv[2], argv[3],
            argv[4]);
    return 2;
  }
  char *sizes = strdup(argv[0]);
  int status = 0;
  for (char *tok = strtok(sizes, ","); tok != NULL && status == 0; tok = strtok(NULL, ",")) {
    char *end = NULL;
    long bytes = strtol(tok, &end, 10);
    if (*end != '\0' || bytes < 4 || bytes % 4 != 0 || bytes / 4 > 0x7fffffffL) {
      fprintf(stderr, "bad size %s: a positive multiple of 4 bytes expected\n", tok);
      status = 2;
      break;
    }
    status = time_size(bytes, repeats, target_s, max_iters, warmup_calls, rank, nranks);
  }
  free(sizes);
  return status;
}

static int run_verify(const char *in_prefix, const char *out_prefix, int rank) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", in_prefix, rank);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "rank %d: cannot open %s: %s\n", rank, path, strerror(errno));
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  int count = (int)(bytes / 4);
  float *in = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
  float *out = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
  size_t got = fread(in, sizeof(float), (size_t)count, f);
  fclose(f);
  if (bytes % 4 != 0 || got != (size_t)count) {
    fprintf(stderr, "rank %d: %s holds %ld bytes, not whole float32s\n", rank, path, bytes);
    return 1;
  }
  sum_floats(in, out, count);
  snprintf(path, sizeof path, "%s.%d", out_prefix, rank);
  f = fopen(path, "wb");
  if (f == NULL || fwrite(out, sizeof(float), (size_t)count, f) != (size_t)count || fclose(f) != 0) {
    fprintf(stderr, "rank %d: cannot write %s\n", rank, path);
    return 1;
  }
  free(in);
  free(out);
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int status;
  if (argc == 7 && strcmp(argv[1], "time") == 0) {
    status = run_time(argv + 2, rank, nranks);
  } else if (argc == 4 && strcmp(argv[1], "verify") == 0) {
    status = run_verify(argv[2], argv[3], rank);
  } else {
    if (rank == 0) {
      fprintf(stderr,
              "usage: mpi_allreduce time SIZES REPEATS TARGET_SECONDS MAX_ITERS WARMUP_CALLS\n"
              "       mpi_allreduce verify IN_PREFIX OUT_PREFIX\n");
    }
    status = 2;
  }
  /* A rank that failed alone would leave the others blocked in a
   * collective: abort the whole job instead of finalizing. */
  if (status != 0) MPI_Abort(MPI_COMM_WORLD, status);
  MPI_Finalize();
  return 0;
}
