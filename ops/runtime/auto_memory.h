// AUTO's measured choices kept across cluster versions. A membership change
// used to re-probe every candidate topology on the new version (0.3-0.8 s at
// 32-64 workers, added straight to the resize), although a job that shrinks
// and grows back, or replaces a crashed worker on the same host, returns to
// layouts it has measured before.
//
// A choice is remembered by (size class, the host of every rank in rank
// order): the same number of workers laid out on the same hosts the same
// way. When a class is first used on a new version, every worker all-reduces
// (MAX, on STAR) what it remembers for that key, as two numbers: the largest
// topology it knows and 255 minus the smallest. If somebody knows one and
// everybody who knows agrees, that is the choice on every worker (a joiner
// that knows nothing adopts it); if nobody knows, or those who know
// disagree, the class is probed as on a first start. One tiny all-reduce
// instead of a probe, and every worker still decides from the same sums.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cluster.h"
#include "topology.h"

namespace kungfu {

// The part of a cluster a measured choice depends on: its hosts in rank
// order (and so its size).
std::string auto_layout(const Cluster &cluster);

class AutoMemory {
 public:
  // What every worker contributes to the agreement (ReduceOp::kMax over two
  // int32): {kind, 255 - kind} if it remembers `kind`, {0, 0} if not.
  using Vote = std::pair<int32_t, int32_t>;
  static Vote vote(std::optional<TopologyKind> known);
  // The agreed choice from the element-wise maxima of every worker's vote:
  // the topology if at least one worker remembered it and all who did agree.
  static std::optional<TopologyKind> agreed(const Vote &max);

  std::optional<TopologyKind> recall(int size_class, const std::string &layout) const;
  void remember(int size_class, const std::string &layout, TopologyKind kind);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<int, TopologyKind>> choices_;  // by layout, then size class
};

}  // namespace kungfu
