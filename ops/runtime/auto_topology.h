// AUTO as a measured choice. The first AUTO all-reduce of a size class
// (messages of (2^(c-1), 2^c] bytes) starts a short probe on every worker:
// each candidate topology all-reduces a buffer of 2^c bytes a few times,
// every worker times it, the timings are summed over the workers by one
// all-reduce on a fixed topology, and the fastest candidate wins. Every
// worker receives the same sums, so every worker picks the same topology;
// calls of the class wait for the decision and then run on it. The decision
// lives with the generation; after a cluster change the class is decided
// again on its first call, recalled without probing if the workers measured
// the new layout before (auto_memory.h), probed otherwise.
//
// The probe is named by the size class, not by the call that started it, so
// workers that issue their collectives in different orders still run the
// same probe. Probes of different classes may overlap (each worker starts
// them in its own order; serialising them locally could deadlock), so the
// first step of a job that all-reduces many sizes at once measures under
// its own load.
//
// A probe that fails (a peer died, never came within the timeout, or
// aborted it) leaves its class on the fixed size rule (choose_auto) for the
// generation; the calls that waited then run on that rule and fail or
// succeed on their own, so such a call can take up to twice the timeout to
// report a peer that never comes.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "cluster.h"
#include "status.h"
#include "topology.h"

namespace kungfu {

// The class of a message: the smallest c with bytes <= 2^c.
int auto_size_class(size_t bytes);
// What the probe of class c all-reduces: 2^c bytes (at least one float32).
size_t auto_probe_bytes(int size_class);
// Calls timed together as one sample: small messages take a few so that
// one sample is not a single scheduler wake-up.
int auto_calls_per_sample(int size_class);
// The topologies AUTO chooses from on `cluster`. BINARY_TREE_STAR is left out
// on one host, where it is the same graph as STAR.
std::vector<TopologyKind> auto_candidates(const Cluster &cluster);
// The candidate with the least total time; the earliest on a tie (the sums
// are the same bytes on every worker, so the choice is too).
TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds);

// AUTO's decisions of one generation, by size class.
class AutoChoices {
 public:
  using Ready = std::function<void(TopologyKind)>;

  // Calls `ready` (inline, outside the lock) with the class's topology if it
  // is decided; otherwise keeps it for decide(). True iff the caller must
  // start the class's probe (it is the first to ask).
  bool resolve(int size_class, Ready ready);
  // Ends the class's probe: the class keeps `kind` for this generation and
  // every waiting `ready` gets it. `measured`: the probe finished; false
  // when it failed (a peer died, timed out or aborted it) and `kind` is the
  // fixed rule's (choose_auto). A failed probe is not retried: its names
  // may hold a peer's abort, which would fail a new attempt at once.
  void decide(int size_class, TopologyKind kind, bool measured);
  // The classes whose probe finished, and the topology each measured fastest.
  std::map<int, TopologyKind> measured() const;

 private:
  struct Class {
    bool decided = false;
    bool measured = false;
    TopologyKind kind = TopologyKind::kStar;
    std::vector<Ready> waiting;
  };
  mutable std::mutex mu_;
  std::map<int, Class> classes_;
};

}  // namespace kungfu
