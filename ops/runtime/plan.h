// Turns a collective on a buffer into piece tasks over graph pairs. Large
// buffers are cut into pieces of at most `chunk_bytes` so that pieces pipeline
// along the graphs and, where a topology has several pairs, spread over links.
#pragma once

#include <memory>
#include <vector>

#include "collective_op.h"
#include "topology.h"

namespace kungfu {

struct Plan {
  TopologyKind kind;                       // travels in frame headers
  std::shared_ptr<const Topology> graphs;  // owns what the tasks point to
  std::vector<PieceTask> tasks;
};

// All-reduce of `count` elements with the cluster's all-reduce topology `topo`.
Plan plan_all_reduce(size_t count, size_t elem_size, std::shared_ptr<const Topology> topo, size_t chunk_bytes);

// One graph pair rooted at `root`, shaped like `kind` (STAR and CLIQUE: star;
// RING: chain; BINARY_TREE; BINARY_TREE_STAR; AUTO is resolved by the caller).
GraphPair rooted_pair(TopologyKind kind, const Cluster &cluster, int root);

// Broadcast from / reduce to `root`: the whole buffer along one rooted pair.
Plan plan_rooted(TopologyKind kind, const Cluster &cluster, int root, size_t count, size_t elem_size,
                 size_t chunk_bytes, bool reduce, bool broadcast);

// All-gather: region r of the output (count elements each) is broadcast from rank r.
Plan plan_all_gather(TopologyKind kind, const Cluster &cluster, size_t count, size_t elem_size, size_t chunk_bytes);

}  // namespace kungfu
