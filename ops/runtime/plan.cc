#include "plan.h"

#include <algorithm>

namespace kungfu {

namespace {

// Splits [offset, offset + count) into `pieces` near-equal tasks.
void split(size_t offset, size_t count, size_t pieces, std::vector<PieceTask> *out) {
  for (size_t i = 0; i < pieces; ++i) {
    size_t begin = count * i / pieces;
    size_t end = count * (i + 1) / pieces;
    PieceTask t;
    t.offset = offset + begin;
    t.count = end - begin;
    out->push_back(t);
  }
}

size_t pieces_for(size_t count, size_t elem_size, size_t chunk_bytes) {
  size_t bytes = count * elem_size;
  return std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
}

}  // namespace

Plan plan_all_reduce(size_t count, size_t elem_size, std::shared_ptr<const Topology> topo, size_t chunk_bytes) {
  Plan plan;
  plan.kind = topo->kind;
  size_t k = topo->pairs.size();
  size_t m = pieces_for(count, elem_size, chunk_bytes);
  if (k > 1 && count >= k) {
    // Give every pair (every root) the same share of the work.
    m = std::max(m, k);
    m = (m + k - 1) / k * k;
  }
  m = std::min(m, std::max<size_t>(count, 1));
  split(0, count, m, &plan.tasks);
  for (size_t i = 0; i < plan.tasks.size(); ++i) plan.tasks[i].graph = &topo->pairs[i % k];
  plan.graphs = std::move(topo);
  return plan;
}

GraphPair rooted_pair(TopologyKind kind, const Cluster &cluster, int root) {
  int n = cluster.size();
  switch (kind) {
    case TopologyKind::kRing: return make_chain(n, root);
    case TopologyKind::kBinaryTree: return make_binary_tree(n, root);
    case TopologyKind::kBinaryTreeStar: return make_binary_tree_star(cluster, root);
    default: return make_star(n, root);
  }
}

Plan plan_rooted(TopologyKind kind, const Cluster &cluster, int root, size_t count, size_t elem_size,
                 size_t chunk_bytes, bool reduce, bool broadcast) {
  Plan plan;
  plan.kind = kind;
  auto topo = std::make_shared<Topology>();
  topo->kind = kind;
  topo->pairs.push_back(rooted_pair(kind, cluster, root));
  split(0, count, std::min(pieces_for(count, elem_size, chunk_bytes), std::max<size_t>(count, 1)), &plan.tasks);
  for (PieceTask &t : plan.tasks) {
    t.graph = &topo->pairs[0];
    t.reduce = reduce;
    t.broadcast = broadcast;
  }
  plan.graphs = std::move(topo);
  return plan;
}

Plan plan_all_gather(TopologyKind kind, const Cluster &cluster, size_t count, size_t elem_size, size_t chunk_bytes) {
  Plan plan;
  plan.kind = kind;
  auto topo = std::make_shared<Topology>();
  topo->kind = kind;
  int n = cluster.size();
  for (int r = 0; r < n; ++r) topo->pairs.push_back(rooted_pair(kind, cluster, r));
  size_t m = std::min(pieces_for(count, elem_size, chunk_bytes), std::max<size_t>(count, 1));
  for (int r = 0; r < n; ++r) {
    size_t first = plan.tasks.size();
    split(static_cast<size_t>(r) * count, count, m, &plan.tasks);
    for (size_t i = first; i < plan.tasks.size(); ++i) {
      plan.tasks[i].graph = &topo->pairs[r];
      plan.tasks[i].reduce = false;
    }
  }
  plan.graphs = std::move(topo);
  return plan;
}

}  // namespace kungfu
