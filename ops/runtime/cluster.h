// The set of workers taking part in a job: an ordered peer list plus a version.
// Rank is the position in the list; the version changes on every resize so that
// messages from an older membership are rejected instead of mixed in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace kungfu {

struct PeerID {
  std::string host;
  uint16_t port = 0;

  std::string str() const { return host + ":" + std::to_string(port); }
  bool operator==(const PeerID &o) const { return host == o.host && port == o.port; }
  bool operator!=(const PeerID &o) const { return !(*this == o); }
};

// Parses "host:port"; the error names the offending text.
Status parse_peer(const std::string &text, PeerID *out);
// Parses a comma-separated list of "host:port".
Status parse_peer_list(const std::string &text, std::vector<PeerID> *out);

class Cluster {
 public:
  Cluster() = default;
  Cluster(uint32_t version, std::vector<PeerID> peers);

  uint32_t version() const { return version_; }
  int size() const { return static_cast<int>(peers_.size()); }
  const PeerID &peer(int rank) const { return peers_[rank]; }
  const std::vector<PeerID> &peers() const { return peers_; }
  // -1 when `p` is not a member.
  int rank_of(const PeerID &p) const;
  int rank_of(const std::string &id) const;

  // Ranks on the same host as `rank`, in rank order.
  std::vector<int> local_ranks(int rank) const;
  // Hosts in order of first appearance, each with its ranks.
  std::vector<std::vector<int>> ranks_by_host() const;
  int host_count() const { return static_cast<int>(ranks_by_host().size()); }
  // "rank 2 (10.0.0.2:10001)" for error messages.
  std::string describe(int rank) const;

 private:
  uint32_t version_ = 0;
  std::vector<PeerID> peers_;
};

}  // namespace kungfu
