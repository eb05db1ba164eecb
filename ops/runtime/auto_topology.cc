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

size_t auto_warmup_bytes(int size_class) { return std::min<size_t>(auto_probe_bytes(size_class), 64 << 10); }

std::vector<size_t> auto_survivors(const std::vector<double> &seconds, double ratio) {
  std::vector<size_t> order(seconds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (ratio <= 0) return order;
  // Fastest first; a tie keeps the earlier candidate first, as fastest() does.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return seconds[a] < seconds[b]; });
  std::vector<size_t> keep;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k < 2 || seconds[order[k]] <= ratio * seconds[order[0]]) keep.push_back(order[k]);
  }
  std::sort(keep.begin(), keep.end());  // back in the candidates' order, the order samples run in
  return keep;
}

std::vector<TopologyKind> auto_candidates(const Cluster &cluster) {
  std::vector<TopologyKind> out{TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree};
  if (cluster.host_count() > 1) out.push_back(TopologyKind::kBinaryTreeStar);
  out.push_back(TopologyKind::kClique);
  return out;
}

TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds) {
  std::vector<size_t> all(std::min(candidates.size(), seconds.size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return fastest(candidates, seconds, all);
}

TopologyKind fastest(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds,
                     const std::vector<size_t> &among) {
  size_t best = among.empty() ? 0 : among[0];
  for (size_t i : among) {
    if (i < candidates.size() && i < seconds.size() && seconds[i] < seconds[best]) best = i;
  }
  return candidates[best];
}

TopologyKind auto_verdict(const std::vector<TopologyKind> &candidates, const std::vector<double> &seconds,
                          const std::vector<size_t> &among, TopologyKind predicted, double keep_within) {
  const TopologyKind best = fastest(candidates, seconds, among);
  const size_t best_at = std::find(candidates.begin(), candidates.end(), best) - candidates.begin();
  if (best_at >= seconds.size()) return best;
  for (size_t i : among) {
    if (i < candidates.size() && i < seconds.size() && candidates[i] == predicted &&
        seconds[i] <= keep_within * seconds[best_at]) {
      return predicted;
    }
  }
  return best;
}

double auto_keep_prediction(int size_class) { return size_class <= kAutoNearTieMaxClass ? kAutoKeepPrediction : 1.0; }

}  // namespace kungfu
