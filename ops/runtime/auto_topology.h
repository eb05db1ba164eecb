// AUTO as a measured choice. The first AUTO all-reduce of a size class
// (messages of (2^(c-1), 2^c] bytes) on a cluster version starts a short
// probe on every worker: each candidate topology all-reduces a buffer of 2^c
// bytes a few times, every worker times it, the timings are summed over the
// workers by one all-reduce on a fixed topology, and the fastest candidate
// wins, unless, up to 64 KiB, the fixed rule's prediction measured within
// 1.5 times its time (auto_verdict). Every worker receives the same sums, so every worker picks the same
// topology. The calls of the class do not wait for it: they run on the
// fixed rule's prediction until the workers agree from which call on the
// measured choice takes over (auto_choices.h), and the probe takes one
// timed sample (a few all-reduces on one candidate) after each call of the
// class ends, the first call of each name excepted, so its cost spreads over
// the steps after the first (the one a cluster change waits for); the
// untimed warm-ups of all candidates run together after the first such
// call. The decision
// lives with the generation; after a cluster change the class is decided
// again, recalled without probing if the workers measured the new layout
// before (auto_memory.h), predicted and probed otherwise.
//
// The probe is named by the size class, not by the call that started it, so
// workers that issue their collectives in different orders still run the
// same probe. Probes of different classes may overlap (each worker starts
// them in its own order; serialising them locally could deadlock), and run
// beside the job's own collectives, so they measure under the job's load.
// A class whose calls stop before its probe has its samples, or whose
// names are each used once, keeps the prediction for the generation.
//
// A probe of a large class drops the clearly slower candidates after their
// first timed sample (auto_survivors): on a slow link one sample of a bad
// topology can take seconds, and the probe used to take four of each. The
// warm-up samples are small (auto_warmup_bytes): they only have to open the
// candidates' connections.
//
// A probe that fails (a peer died, never came within the timeout, or
// aborted it) leaves its class on the fixed rule (choose_auto) for the
// generation, the prediction its calls already ran on; a call that waited
// for the agreement then runs on that rule and fails or succeeds on its
// own, so such a call can take up to twice the timeout to report a peer
// that never comes.
#pragma once

#include <cstddef>
#include <vector>

#include "cluster.h"
#include "topology.h"

namespace kungfu {

// The class of a message: the smallest c with bytes <= 2^c.
int auto_size_class(size_t bytes);
// What the probe of class c all-reduces: 2^c bytes (at least one float32).
size_t auto_probe_bytes(int size_class);
// Calls timed together as one sample: small messages take a few so that
// one sample is not a single scheduler wake-up.
int auto_calls_per_sample(int size_class);
// What a probe's untimed warm-up sample all-reduces: enough to open every
// connection of the candidate, no more than 64 KiB.
size_t auto_warmup_bytes(int size_class);
// The smallest class whose probe is pruned (1 MiB): there a sample is a
// transfer, steady from one sample to the next; below it a sample is a few
// wake-ups, whose time can double from one to the next, and costs little.
constexpr int kAutoPruneMinClass = 20;
// Which candidates (indices) a probe keeps after their first timed sample,
// given each one's time summed over the workers: those within `ratio` times
// the fastest, and always the two fastest; every one if ratio <= 0 (pruning
// off). The same sums give the same survivors on every worker.
std::vector<size_t> auto_survivors(const std::vector<double> &seconds, double ratio);
// The topologies AUTO chooses from on `cluster`. BINARY_TREE_STAR is left out
// on one host, where it is the same graph as STAR.
std::vector<TopologyKind> auto_candidates(const Cluster &cluster);
// The candidate with the least total time; the earliest on a tie (the sums
// are the same bytes on every worker, so the choice is too).
// With `among`, only those indices are considered (the survivors of a pruned probe).
TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds);
TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds,
                     const std::vector<size_t> &among);
// How much slower than the fastest the prediction (choose_auto) may measure
// and still be kept, in classes up to kAutoNearTieMaxClass (64 KiB, the
// messages a waiting caller polls for). There a probe's sample is a chain of
// the receiving threads' wake-ups, not what a polling caller sees: on one
// idle host (np=2, a tf.function, three runs) it timed STAR at 4 B at 14,
// 44 and 31 us and the fastest candidate differed in each run, while called
// from a tf.function STAR took 90-110 us and RING and CLIQUE up to 1.9x and
// 2.3x that. So only a clear win, by as much as KUNGFU_AUTO_PRUNE's default
// calls a candidate clearly slower, overrides the size rule there. Larger
// samples are transfers, timed well: the fastest wins (CLIQUE kept as a
// near-tie ran 1 MiB at np=4 1.4x slower than STAR).
constexpr double kAutoKeepPrediction = 1.5;
constexpr int kAutoNearTieMaxClass = 16;
// The probe's verdict: the fastest among `among`, unless `predicted` is
// among them and within `keep_within` times its time (1: never).
TopologyKind auto_verdict(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds,
                          const std::vector<size_t> &among, TopologyKind predicted, double keep_within);
// kAutoKeepPrediction for the classes where near-ties keep the prediction, else 1.
double auto_keep_prediction(int size_class);

}  // namespace kungfu
