// Structure of the topology graphs: every rank reaches the root exactly once,
// every rank receives the broadcast exactly once, host-aware graphs cross
// hosts only between host leaders, and AUTO's choices.
#include <functional>
#include <set>

#include "generation.h"
#include "plan.h"
#include "test_util.h"
#include "topology.h"

using namespace kungfu;

namespace {

Cluster hosts_cluster(const std::vector<int> &ranks_per_host) {
  std::vector<PeerID> peers;
  for (size_t h = 0; h < ranks_per_host.size(); ++h) {
    for (int i = 0; i < ranks_per_host[h]; ++i) {
      peers.push_back(PeerID{"10.0.0." + std::to_string(h + 1), static_cast<uint16_t>(10000 + i)});
    }
  }
  return Cluster(0, peers);
}

// A valid pair is a spanning tree: reduce edges point towards the root (each
// non-root has exactly one next), broadcast edges away from it (each non-root
// exactly one prev), and following nexts from any rank ends at the root.
bool valid_tree_pair(const GraphPair &gp, int n) {
  if (gp.reduce.size() != n || gp.broadcast.size() != n) return false;
  for (int r = 0; r < n; ++r) {
    if (r == gp.root) {
      if (!gp.reduce.nexts(r).empty() || !gp.broadcast.prevs(r).empty()) return false;
      continue;
    }
    if (gp.reduce.nexts(r).size() != 1 || gp.broadcast.prevs(r).size() != 1) return false;
    int at = r, hops = 0;
    while (at != gp.root && hops <= n) {
      at = gp.reduce.nexts(at)[0];
      ++hops;
    }
    if (at != gp.root) return false;
    at = r;
    hops = 0;
    while (at != gp.root && hops <= n) {
      at = gp.broadcast.prevs(at)[0];
      ++hops;
    }
    if (at != gp.root) return false;
  }
  return true;
}

void test_every_topology_is_a_set_of_spanning_trees() {
  for (int n = 1; n <= 9; ++n) {
    Cluster c = hosts_cluster({n});
    for (TopologyKind k : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree,
                           TopologyKind::kBinaryTreeStar, TopologyKind::kClique}) {
      auto t = build_topology(k, c);
      CHECK(t != nullptr);
      size_t expected_pairs = (k == TopologyKind::kRing || k == TopologyKind::kClique) ? n : 1;
      CHECK(t->pairs.size() == expected_pairs);
      std::set<int> roots;
      for (const GraphPair &gp : t->pairs) {
        CHECK(valid_tree_pair(gp, n));
        roots.insert(gp.root);
      }
      CHECK(roots.size() == expected_pairs);  // multi-pair topologies root at every rank
    }
    for (int root = 0; root < n; ++root) {
      CHECK(valid_tree_pair(make_chain(n, root), n));
      CHECK(valid_tree_pair(make_binary_tree(n, root), n));
      CHECK(valid_tree_pair(make_star(n, root), n));
    }
  }
}

void test_chain_is_a_ring() {
  GraphPair gp = make_chain(4, 2);
  // reduce: 3 -> 0 -> 1 -> 2; broadcast: 2 -> 3 -> 0 -> 1
  CHECK(gp.reduce.nexts(3) == std::vector<int>{0});
  CHECK(gp.reduce.nexts(0) == std::vector<int>{1});
  CHECK(gp.reduce.nexts(1) == std::vector<int>{2});
  CHECK(gp.broadcast.nexts(2) == std::vector<int>{3});
  CHECK(gp.broadcast.nexts(3) == std::vector<int>{0});
  CHECK(gp.broadcast.nexts(0) == std::vector<int>{1});
  CHECK(gp.broadcast.nexts(1).empty());
}

void test_tree_star_crosses_hosts_only_between_leaders() {
  Cluster c = hosts_cluster({3, 2, 4});  // ranks 0-2 | 3-4 | 5-8
  std::vector<std::string> host(c.size());
  for (int r = 0; r < c.size(); ++r) host[r] = c.peer(r).host;
  for (int root = 0; root < c.size(); ++root) {
    GraphPair gp = make_binary_tree_star(c, root);
    CHECK(valid_tree_pair(gp, c.size()));
    CHECK(gp.root == root);
    // Leaders: the root on its host, the first rank elsewhere.
    std::set<int> leaders = {root};
    for (const auto &ranks : c.ranks_by_host()) {
      if (host[ranks[0]] != host[root]) leaders.insert(ranks[0]);
    }
    int cross = 0;
    for (int r = 0; r < c.size(); ++r) {
      for (int next : gp.reduce.nexts(r)) {
        if (host[r] != host[next]) {
          ++cross;
          CHECK(leaders.count(r) && leaders.count(next));
        } else {
          CHECK(leaders.count(next));  // inside a host: a star on the leader
        }
      }
    }
    CHECK(cross == 2);  // three hosts: two tree edges between leaders
  }
}

void test_auto_choice() {
  Cluster one_host = hosts_cluster({4});
  Cluster two_hosts = hosts_cluster({2, 2});
  CHECK(choose_auto(4, one_host) == TopologyKind::kStar);
  CHECK(choose_auto(64 * 1024, one_host) == TopologyKind::kStar);
  CHECK(choose_auto(64 * 1024 + 1, one_host) == TopologyKind::kClique);
  CHECK(choose_auto(4, two_hosts) == TopologyKind::kBinaryTreeStar);
  CHECK(choose_auto(1 << 26, two_hosts) == TopologyKind::kRing);
  CHECK(choose_auto(4, hosts_cluster({16})) == TopologyKind::kBinaryTree);
}

void test_plans_cover_the_buffer() {
  Cluster c = hosts_cluster({4});
  for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(1000003)}) {
    Plan p = plan_all_reduce(count, 4, build_topology(TopologyKind::kRing, c), 1 << 16);
    size_t next = 0;
    for (const PieceTask &t : p.tasks) {
      CHECK(t.offset == next);
      next += t.count;
    }
    CHECK(next == count);
    CHECK(!p.tasks.empty());
    if (count >= 4) CHECK(p.tasks.size() % 4 == 0);  // every root gets a share
  }
  Plan g = plan_all_gather(TopologyKind::kStar, c, 10, 8, 16);
  std::vector<size_t> covered(40, 0);
  for (const PieceTask &t : g.tasks) {
    for (size_t i = t.offset; i < t.offset + t.count; ++i) ++covered[i];
    CHECK(t.graph->root == static_cast<int>(t.offset / 10));  // region r comes from rank r
    CHECK(!t.reduce && t.broadcast);
  }
  for (size_t v : covered) CHECK(v == 1);
}

void test_parse() {
  TopologyKind k;
  CHECK(parse_topology("binary_tree_star", &k).ok() && k == TopologyKind::kBinaryTreeStar);
  Status s = parse_topology("HYPERCUBE", &k);
  CHECK(s.code() == Code::kInvalidArgument && s.message().find("HYPERCUBE") != std::string::npos);
  std::vector<PeerID> peers;
  CHECK(parse_peer_list("a:1,b:2", &peers).ok() && peers.size() == 2);
  CHECK(parse_peer_list("a:1,a:1", &peers).code() == Code::kInvalidArgument);
  CHECK(parse_peer_list("a:0", &peers).code() == Code::kInvalidArgument);
  CHECK(parse_peer_list("nocolon", &peers).code() == Code::kInvalidArgument);
}

}  // namespace

// A generation builds a topology's graphs on first use only (RING and CLIQUE
// are O(n^2)), keeps one copy while it is current, and lets go of them when
// retired: retired generations live as long as the runtime.
void test_generation_builds_graphs_on_demand() {
  std::vector<PeerID> peers;
  for (int i = 0; i < 64; ++i) peers.push_back(PeerID{"127.0.0.1", static_cast<uint16_t>(10000 + i)});
  Generation g(Cluster(0, peers), 0, 10);
  std::weak_ptr<const Topology> ring = g.topology(TopologyKind::kRing);
  CHECK(!ring.expired() && ring.lock() == g.topology(TopologyKind::kRing));
  CHECK(ring.lock()->pairs.size() == 64);
  CHECK(g.topology(TopologyKind::kAuto) == nullptr);
  g.retire(Unavailable("test"), std::chrono::steady_clock::now(), 1);
  CHECK(ring.expired());
  CHECK(g.topology(TopologyKind::kStar) == nullptr);
}

int main() {
  test_generation_builds_graphs_on_demand();
  test_every_topology_is_a_set_of_spanning_trees();
  test_chain_is_a_ring();
  test_tree_star_crosses_hosts_only_between_leaders();
  test_auto_choice();
  test_plans_cover_the_buffer();
  test_parse();
  return kftest::report();
}
