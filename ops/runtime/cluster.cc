#include "cluster.h"

#include <cstdlib>

namespace kungfu {

Status parse_peer(const std::string &text, PeerID *out) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("bad peer address '" + text + "': expected host:port");
  }
  std::string port_text = text.substr(colon + 1);
  char *end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return InvalidArgument("bad port in peer address '" + text + "'");
  }
  out->host = text.substr(0, colon);
  out->port = static_cast<uint16_t>(port);
  return Status::OK();
}

Status parse_peer_list(const std::string &text, std::vector<PeerID> *out) {
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      PeerID p;
      Status s = parse_peer(item, &p);
      if (!s.ok()) return s;
      for (const PeerID &q : *out) {
        if (q == p) return InvalidArgument("peer " + p.str() + " appears twice in the peer list");
      }
      out->push_back(p);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Status::OK();
}

Cluster::Cluster(uint32_t version, std::vector<PeerID> peers) : version_(version), peers_(std::move(peers)) {}

int Cluster::rank_of(const PeerID &p) const {
  for (int i = 0; i < size(); ++i) {
    if (peers_[i] == p) return i;
  }
  return -1;
}

int Cluster::rank_of(const std::string &id) const {
  PeerID p;
  if (!parse_peer(id, &p).ok()) return -1;
  return rank_of(p);
}

std::vector<int> Cluster::local_ranks(int rank) const {
  std::vector<int> out;
  for (int i = 0; i < size(); ++i) {
    if (peers_[i].host == peers_[rank].host) out.push_back(i);
  }
  return out;
}

std::vector<std::vector<int>> Cluster::ranks_by_host() const {
  std::vector<std::string> hosts;
  std::vector<std::vector<int>> groups;
  for (int i = 0; i < size(); ++i) {
    size_t h = 0;
    while (h < hosts.size() && hosts[h] != peers_[i].host) ++h;
    if (h == hosts.size()) {
      hosts.push_back(peers_[i].host);
      groups.emplace_back();
    }
    groups[h].push_back(i);
  }
  return groups;
}

std::string Cluster::describe(int rank) const {
  if (rank < 0 || rank >= size()) return "rank " + std::to_string(rank) + " (not a member)";
  return "rank " + std::to_string(rank) + " (" + peers_[rank].str() + ")";
}

}  // namespace kungfu
