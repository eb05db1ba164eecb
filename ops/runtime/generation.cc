#include "generation.h"

namespace kungfu {

Generation::Generation(Cluster c, int rank, double timeout_seconds)
    : cluster(std::move(c)),
      self_rank(rank),
      registry(timeout_seconds),
      topologies_(static_cast<size_t>(TopologyKind::kAuto) + 1) {}

std::shared_ptr<const Topology> Generation::topology(TopologyKind kind) {
  std::lock_guard<std::mutex> lock(topologies_mu_);
  if (retired_ || kind == TopologyKind::kAuto) return nullptr;
  std::shared_ptr<const Topology> &t = topologies_[static_cast<size_t>(kind)];
  if (!t) t = build_topology(kind, cluster);
  return t;
}

Generation::~Generation() {
  // Threads first: they call the handler and use the mailbox and registry.
  if (transport) transport->stop(Unavailable("runtime shutting down"));
}

void Generation::note_lost(int rank) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  lost_.insert(rank);
}

std::vector<int> Generation::lost() const {
  std::lock_guard<std::mutex> lock(lost_mu_);
  return std::vector<int>(lost_.begin(), lost_.end());
}

int Generation::retire(const Status &why, std::chrono::steady_clock::time_point deadline, uint32_t next_version) {
  registry.close(why);
  int cut_short = 0;
  if (transport) {
    cut_short = transport->leave(deadline, next_version);
    transport->stop(why);
  }
  mailbox.close(why);
  registry.retire();
  // A retired generation lives as long as the runtime: its graphs must not.
  std::lock_guard<std::mutex> lock(topologies_mu_);
  retired_ = true;
  for (auto &t : topologies_) t.reset();
  return cut_short;
}

}  // namespace kungfu
