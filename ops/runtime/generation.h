// One cluster version as this worker lives it: the membership, our rank in
// it, and everything whose meaning depends on them (topology graphs, the
// transport whose connections are bound to the version by their handshake,
// the mailbox and the op registry whose keys and instance counters are per
// rank). A cluster change builds the next generation and swaps it in whole,
// so no operation ever mixes two memberships (Runtime::update_cluster).
//
// A generation that was swapped out is *retired*: its ops failed, its
// transport left in order and stopped (no threads remain), but the object
// lives on with the runtime, because callbacks of ops that started on it
// (sends, timeouts) still hold plain pointers into it.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "auto_choices.h"
#include "cluster.h"
#include "mailbox.h"
#include "op_registry.h"
#include "topology.h"
#include "transport.h"

namespace kungfu {

class Generation {
 public:
  Generation(Cluster cluster, int self_rank, double timeout_seconds);
  ~Generation();
  Generation(const Generation &) = delete;
  Generation &operator=(const Generation &) = delete;

  const Cluster cluster;
  const int self_rank;
  int size() const { return cluster.size(); }
  // The graphs of a (non-AUTO) topology at this membership, built on first
  // use: RING and CLIQUE hold n graph pairs of n ranks each, O(n^2) memory
  // and time per cluster change, which a job that never uses them should not
  // pay. Null after retire() (in-flight plans own what they point into).
  std::shared_ptr<const Topology> topology(TopologyKind kind);
  // AUTO's topology per size class at this membership, and from which call
  // on each (auto_choices.h).
  AutoChoices auto_choices;
  Mailbox mailbox;
  OpRegistry registry;

  // The handler the transport calls (it forwards to the runtime with this
  // generation), then the transport: null when this worker is alone and
  // holds no port. Declared last, so the transport, whose threads call the
  // handler, goes first.
  std::unique_ptr<FrameHandler> handler;
  std::unique_ptr<Transport> transport;

  // The version of each (peer, table) we last received whole or in rows
  // (Runtime::request_rows); per generation because it is keyed by rank.
  std::mutex rows_held_mu;
  std::map<std::pair<int, std::string>, uint64_t> rows_held;

  // Members whose connection broke without a goodbye at this version.
  void note_lost(int rank);
  std::vector<int> lost() const;

  // Ends this generation (its listening sockets were handed over before):
  // fails every op in flight and every later one with `why`, leaves in order
  // (queued frames written, then goodbyes) until `deadline`, and stops every
  // thread. Waiters still in the mailbox are released.
  // `next_version`: the version we move on to (0: none, we leave the job).
  // Returns the links the deadline cut short (Transport::leave).
  int retire(const Status &why, std::chrono::steady_clock::time_point deadline, uint32_t next_version);

 private:
  mutable std::mutex lost_mu_;
  std::set<int> lost_;
  std::mutex topologies_mu_;
  bool retired_ = false;                                     // topologies_mu_
  std::vector<std::shared_ptr<const Topology>> topologies_;  // by TopologyKind; topologies_mu_
};

}  // namespace kungfu
