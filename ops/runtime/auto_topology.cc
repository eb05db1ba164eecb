#include "auto_topology.h"

#include <algorithm>

namespace kungfu {

int auto_size_class(size_t bytes) {
  int c = 0;
  while (c < 63 && (size_t{1} << c) < bytes) ++c;
  return c;
}

size_t auto_probe_bytes(int size_class) { return std::max<size_t>(4, size_t{1} << size_class); }

int auto_calls_per_sample(int size_class) {
  // About 256 KiB per sample, at most 8 calls: enough to average out one
  // wake-up of a small message, a single call for large ones.
  constexpr size_t kSampleBytes = 256 << 10;
  size_t calls = kSampleBytes / auto_probe_bytes(size_class);
  return static_cast<int>(std::clamp<size_t>(calls, 1, 8));
}

std::vector<TopologyKind> auto_candidates(const Cluster &cluster) {
  std::vector<TopologyKind> out{TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree};
  if (cluster.host_count() > 1) out.push_back(TopologyKind::kBinaryTreeStar);
  out.push_back(TopologyKind::kClique);
  return out;
}

TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds) {
  size_t best = 0;
  for (size_t i = 1; i < candidates.size() && i < seconds.size(); ++i) {
    if (seconds[i] < seconds[best]) best = i;
  }
  return candidates[best];
}

}  // namespace kungfu
