// How a worker's runtime is configured: from the launcher's environment
// variables, or by a test.
#pragma once

#include <cstddef>
#include <string>

#include "cluster.h"
#include "frame_auth.h"
#include "secret.h"
#include "status.h"
#include "topology.h"

namespace kungfu {

// The most timed samples AUTO takes per candidate: more only delays the first step.
constexpr int kMaxAutoProbes = 100;
// The largest KUNGFU_AUTO_PRUNE: beyond it nothing is ever pruned.
constexpr double kMaxAutoPrune = 100;

struct RuntimeOptions {
  Cluster cluster;
  int self_rank = 0;
  SecretString secret;
  std::string job_id;  // this run of the job (KUNGFU_JOB_ID); connections of other runs are rejected
  // Which connections tag and verify every frame (KUNGFU_AUTHENTICATE_FRAMES:
  // unset = those between two hosts, 0 = none, 1 = all); see TransportOptions.
  FrameAuthPolicy frame_auth = FrameAuthPolicy::kAcrossHosts;
  double timeout_seconds = 120;
  TopologyKind topology = TopologyKind::kAuto;
  size_t chunk_bytes = 1 << 20;
  bool same_host_unix_sockets = true;
  // Timed samples per candidate topology when AUTO probes a size class
  // (KUNGFU_AUTO_PROBES, auto_topology.h); 0: AUTO follows choose_auto's
  // fixed size rule instead of measuring. Every worker must have the same.
  int auto_probes = 3;
  // A probe of a class of 1 MiB or more keeps, after one timed sample of
  // each candidate, only those within this many times the fastest (and the
  // two fastest); 0 keeps every candidate (KUNGFU_AUTO_PRUNE, auto_topology.h).
  // Every worker must have the same, as for auto_probes (the launcher gives
  // every worker the same environment).
  double auto_prune = 1.5;
  // Rank 0 prints each probe's timings and choice to stderr (KUNGFU_AUTO_LOG=1).
  bool auto_log = false;
  // Same-host peers exchange frames through shared-memory rings
  // (KUNGFU_SHM: unset or 1 = yes, 0 = Unix sockets only); see TransportOptions.
  bool same_host_shm = true;

  // Reads KUNGFU_SELF, KUNGFU_PEERS, KUNGFU_CLUSTER_VERSION, KUNGFU_TOPOLOGY,
  // KUNGFU_TIMEOUT, KUNGFU_JOB_SECRET, KUNGFU_JOB_ID,
  // KUNGFU_AUTHENTICATE_FRAMES, KUNGFU_AUTO_PROBES, KUNGFU_AUTO_PRUNE and
  // KUNGFU_SHM. Without
  // KUNGFU_PEERS: a one-worker cluster.
  static Status from_env(RuntimeOptions *out);
};

// The launcher's per-run id (KUNGFU_JOB_ID) is set when the cluster has
// more than one worker, short enough for the handshake and printable ASCII.
Status check_job_id(const std::string &id, int cluster_size);

}  // namespace kungfu
