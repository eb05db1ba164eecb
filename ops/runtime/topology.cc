#include "topology.h"

#include <algorithm>
#include <cctype>

namespace kungfu {

void Graph::add_edge(int from, int to) {
  nexts_[from].push_back(to);
  prevs_[to].push_back(from);
}

int Graph::sink() const {
  int found = -1;
  for (int i = 0; i < size(); ++i) {
    if (nexts_[i].empty() && !prevs_[i].empty()) {
      if (found >= 0) return -1;
      found = i;
    }
  }
  return found;
}

int Graph::source() const {
  int found = -1;
  for (int i = 0; i < size(); ++i) {
    if (prevs_[i].empty() && !nexts_[i].empty()) {
      if (found >= 0) return -1;
      found = i;
    }
  }
  return found;
}

const char *topology_name(TopologyKind kind) {
  switch (kind) {
    case TopologyKind::kStar: return "STAR";
    case TopologyKind::kRing: return "RING";
    case TopologyKind::kBinaryTree: return "BINARY_TREE";
    case TopologyKind::kBinaryTreeStar: return "BINARY_TREE_STAR";
    case TopologyKind::kClique: return "CLIQUE";
    case TopologyKind::kAuto: return "AUTO";
  }
  return "UNKNOWN";
}

Status parse_topology(const std::string &name, TopologyKind *kind) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (TopologyKind k : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree,
                         TopologyKind::kBinaryTreeStar, TopologyKind::kClique, TopologyKind::kAuto}) {
    if (upper == topology_name(k)) {
      *kind = k;
      return Status::OK();
    }
  }
  return InvalidArgument("unknown topology '" + name +
                         "'; valid: STAR, RING, BINARY_TREE, BINARY_TREE_STAR, CLIQUE, AUTO");
}

namespace {

// Turns a tree given as parent links into the pair (child -> parent edges for
// reduce, parent -> child for broadcast).
GraphPair from_parents(const std::vector<int> &parent, int root) {
  int n = static_cast<int>(parent.size());
  GraphPair gp{Graph(n), Graph(n), root};
  for (int i = 0; i < n; ++i) {
    if (parent[i] >= 0) {
      gp.reduce.add_edge(i, parent[i]);
      gp.broadcast.add_edge(parent[i], i);
    }
  }
  return gp;
}

// Binary tree over `members` (heap order), rooted at members[0].
void binary_tree_over(const std::vector<int> &members, std::vector<int> *parent) {
  for (size_t i = 1; i < members.size(); ++i) (*parent)[members[i]] = members[(i - 1) / 2];
}

// `members` rotated so that `root` comes first.
std::vector<int> rotated(int n, int root) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = (root + i) % n;
  return order;
}

}  // namespace

GraphPair make_star(int n, int root) {
  std::vector<int> parent(n, -1);
  for (int i = 0; i < n; ++i) {
    if (i != root) parent[i] = root;
  }
  return from_parents(parent, root);
}

GraphPair make_chain(int n, int root) {
  // Reduce flows root+1 -> root+2 -> ... -> root; broadcast flows
  // root -> root+1 -> ... -> root-1. Every rank sends one piece per phase,
  // which is what makes n rotated chains bandwidth-optimal.
  GraphPair gp{Graph(n), Graph(n), root};
  for (int k = 1; k < n; ++k) {
    int from = (root + k) % n;
    int to = (root + k + 1) % n;
    gp.reduce.add_edge(from, to);
  }
  for (int k = 0; k + 1 < n; ++k) {
    gp.broadcast.add_edge((root + k) % n, (root + k + 1) % n);
  }
  return gp;
}

GraphPair make_binary_tree(int n, int root) {
  std::vector<int> parent(n, -1);
  binary_tree_over(rotated(n, root), &parent);
  return from_parents(parent, root);
}

GraphPair make_binary_tree_star(const Cluster &cluster, int root) {
  int n = cluster.size();
  std::vector<int> parent(n, -1);
  // The host of `root` goes first and `root` leads it, so the tree is rooted there.
  std::vector<std::vector<int>> hosts = cluster.ranks_by_host();
  std::stable_partition(hosts.begin(), hosts.end(),
                        [&](const std::vector<int> &h) { return std::find(h.begin(), h.end(), root) != h.end(); });
  std::vector<int> masters;
  for (std::vector<int> &h : hosts) {
    auto it = std::find(h.begin(), h.end(), root);
    if (it != h.end()) std::iter_swap(h.begin(), it);
    masters.push_back(h[0]);
    for (size_t i = 1; i < h.size(); ++i) parent[h[i]] = h[0];
  }
  binary_tree_over(masters, &parent);
  return from_parents(parent, root);
}

std::shared_ptr<const Topology> build_topology(TopologyKind kind, const Cluster &cluster) {
  auto t = std::make_shared<Topology>();
  t->kind = kind;
  int n = cluster.size();
  switch (kind) {
    case TopologyKind::kStar: t->pairs.push_back(make_star(n, 0)); break;
    case TopologyKind::kBinaryTree: t->pairs.push_back(make_binary_tree(n, 0)); break;
    case TopologyKind::kBinaryTreeStar: t->pairs.push_back(make_binary_tree_star(cluster, 0)); break;
    case TopologyKind::kRing:
      for (int r = 0; r < n; ++r) t->pairs.push_back(make_chain(n, r));
      break;
    case TopologyKind::kClique:
      for (int r = 0; r < n; ++r) t->pairs.push_back(make_star(n, r));
      break;
    case TopologyKind::kAuto: return nullptr;  // AUTO is resolved per message size by choose_auto().
  }
  return t;
}

TopologyKind choose_auto(size_t bytes, const Cluster &cluster) {
  constexpr size_t kSmall = 64 * 1024;
  int n = cluster.size();
  if (bytes <= kSmall) {
    if (cluster.host_count() > 1) return TopologyKind::kBinaryTreeStar;
    return n <= 8 ? TopologyKind::kStar : TopologyKind::kBinaryTree;
  }
  // Large tensors: reduce-scatter + all-gather bandwidth either way. Within a
  // host, CLIQUE does it in one hop per phase, so no piece waits for a chain of
  // processes to be scheduled; across hosts, RING only uses neighbour links, so
  // far fewer bytes cross the (slower) network.
  return cluster.host_count() > 1 ? TopologyKind::kRing : TopologyKind::kClique;
}

}  // namespace kungfu
