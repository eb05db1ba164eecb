// Collective topologies as data. A topology is a list of graph pairs (reduce
// graph, broadcast graph) over ranks; one generic executor (collective.h) runs
// any of them. Tensors are cut into pieces and piece i travels graph pair
// i % pairs.size(), so topologies with several pairs spread load over links.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cluster.h"

namespace kungfu {

// Directed graph over ranks 0..n-1.
class Graph {
 public:
  explicit Graph(int n = 0) : prevs_(n), nexts_(n) {}
  void add_edge(int from, int to);
  int size() const { return static_cast<int>(prevs_.size()); }
  const std::vector<int> &prevs(int rank) const { return prevs_[rank]; }
  const std::vector<int> &nexts(int rank) const { return nexts_[rank]; }
  // The rank without outgoing edges in a reduce graph (and without incoming in a
  // broadcast graph); -1 if there is none or several.
  int sink() const;
  int source() const;

 private:
  std::vector<std::vector<int>> prevs_;
  std::vector<std::vector<int>> nexts_;
};

// Data flows up the reduce graph (a tree with edges child -> parent) to its root,
// then down the broadcast graph (root -> children) back to every rank.
struct GraphPair {
  Graph reduce;
  Graph broadcast;
  int root = 0;
};

// Values travel in frame headers to detect topology races; never renumber.
enum class TopologyKind : uint8_t {
  kStar = 1,
  kRing = 2,
  kBinaryTree = 3,
  kBinaryTreeStar = 4,
  kClique = 5,
  kAuto = 6,
};

const char *topology_name(TopologyKind kind);
// Case-insensitive; the error lists the valid names.
Status parse_topology(const std::string &name, TopologyKind *kind);

// Rooted graph pairs. `order` lists the ranks taking part (usually 0..n-1) and
// n is the cluster size; ranks not in `order` get no edges.
GraphPair make_star(int n, int root);
GraphPair make_chain(int n, int root);  // ring rooted at `root`: root+1 -> ... -> root
GraphPair make_binary_tree(int n, int root);
// Star inside each host to the host's first rank, binary tree across those.
GraphPair make_binary_tree_star(const Cluster &cluster, int root);

// A concrete, resolved topology: its kind and its graph pairs.
struct Topology {
  TopologyKind kind = TopologyKind::kStar;
  std::vector<GraphPair> pairs;
};

// Builds the pairs of a non-AUTO topology for a cluster. STAR, BINARY_TREE and
// BINARY_TREE_STAR have one pair rooted at rank 0; RING and CLIQUE have one pair
// rooted at every rank (reduce-scatter / all-gather bandwidth).
std::shared_ptr<const Topology> build_topology(TopologyKind kind, const Cluster &cluster);

// AUTO's fixed rule, for broadcast, reduce and all-gather, and for
// all-reduce when measuring is off (KUNGFU_AUTO_PROBES=0; otherwise AUTO
// all-reduces on the probed best, auto_topology.h): small messages go where
// latency is lowest (STAR, or BINARY_TREE_STAR / BINARY_TREE on bigger or
// multi-host clusters); large ones use CLIQUE on one host and RING across
// hosts, both bandwidth-optimal.
TopologyKind choose_auto(size_t bytes, const Cluster &cluster);

}  // namespace kungfu
