#include "auto_memory.h"

namespace kungfu {

namespace {
// Above every TopologyKind value, so that 255 - kind is positive for every kind.
constexpr int32_t kVoteCeiling = 255;
}  // namespace

std::string auto_layout(const Cluster &cluster) {
  // Runs of ranks on one host, "host*count" each: ranks usually come host by
  // host, so a job's layout is a few runs, not one entry per worker.
  std::string out;
  for (int r = 0; r < cluster.size();) {
    int run = 1;
    while (r + run < cluster.size() && cluster.peer(r + run).host == cluster.peer(r).host) ++run;
    out += cluster.peer(r).host + "*" + std::to_string(run) + "\n";  // '\n' is never part of a host name
    r += run;
  }
  return out;
}

AutoMemory::Vote AutoMemory::vote(std::optional<TopologyKind> known) {
  if (!known) return {0, 0};
  const int32_t k = static_cast<int32_t>(*known);
  return {k, kVoteCeiling - k};
}

std::optional<TopologyKind> AutoMemory::agreed(const Vote &max) {
  const int32_t largest = max.first, smallest = kVoteCeiling - max.second;
  if (largest <= 0 || largest != smallest) return std::nullopt;
  TopologyKind kind = static_cast<TopologyKind>(largest);
  switch (kind) {  // a value no worker could have sent is no agreement
    case TopologyKind::kStar:
    case TopologyKind::kRing:
    case TopologyKind::kBinaryTree:
    case TopologyKind::kBinaryTreeStar:
    case TopologyKind::kClique: return kind;
    default: return std::nullopt;
  }
}

std::optional<TopologyKind> AutoMemory::recall(int size_class, const std::string &layout) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto layout_it = choices_.find(layout);
  if (layout_it == choices_.end()) return std::nullopt;
  auto it = layout_it->second.find(size_class);
  if (it == layout_it->second.end()) return std::nullopt;
  return it->second;
}

void AutoMemory::remember(int size_class, const std::string &layout, TopologyKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[layout][size_class] = kind;
}

}  // namespace kungfu
