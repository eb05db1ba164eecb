// Cluster changes: switching to a newer version, interrupting the current
// one, and the peers it lost.
#include "runtime.h"

#include <algorithm>

namespace kungfu {

namespace {

std::string peer_list_text(const std::vector<PeerID> &peers) {
  std::string out;
  for (const PeerID &p : peers) out += (out.empty() ? "" : ",") + p.str();
  return out;
}

}  // namespace

Status Runtime::update_cluster(const Cluster &cluster) {
  std::lock_guard<std::mutex> lock(update_mu_);
  GenPtr old = gen();
  const PeerID me = old->cluster.peer(old->self_rank);
  const std::string what = "update_cluster to version " + std::to_string(cluster.version()) + " [" +
                           peer_list_text(cluster.peers()) + "]";
  if (left_) return FailedPrecondition(what + ": " + me.str() + " has left the cluster (shutdown)");
  if (cluster.version() <= old->cluster.version()) {
    return InvalidArgument(what + ": the version must be greater than the current cluster version " +
                           std::to_string(old->cluster.version()));
  }
  if (cluster.size() == 0) return InvalidArgument(what + ": the cluster lists no peer");
  for (int i = 0; i < cluster.size(); ++i) {
    if (cluster.rank_of(cluster.peer(i)) != i) {
      return InvalidArgument(what + ": " + cluster.peer(i).str() + " is listed twice");
    }
  }
  const int self_rank = cluster.rank_of(me);
  if (self_rank < 0) {
    return InvalidArgument(what + ": this worker (" + me.str() + ", KUNGFU_SELF) is not in the new peer list");
  }
  if (cluster.size() > 1) {
    if (opt_.secret.empty()) {
      return PermissionDenied(what + ": KUNGFU_JOB_SECRET is not set: start the workers with kungfu-run");
    }
    Status s = check_job_id(opt_.job_id, cluster.size());
    if (!s.ok()) return Status(s.code(), what + ": " + s.message());
  }
  GenPtr next = make_generation(cluster, self_rank);
  // The port passes from the old transport to the new one without ever
  // closing: peers that switched first wait in the backlog, not refused.
  Listeners listeners = old->transport ? old->transport->release_listeners() : Listeners();
  const bool inherited = listeners.valid();
  if (next->size() > 1 || inherited) {
    Status s = start_transport(*next, std::move(listeners), old.get());
    if (!s.ok()) {
      Status failed(s.code(), what + ": " + s.message());
      // Only a thread or a pipe can fail with listeners in hand, and they
      // went with the failed transport: the old version takes no new
      // connections either, so it must not go on as if nothing happened.
      if (inherited) old->registry.close(failed);
      return failed;
    }
  }
  {
    std::lock_guard<std::mutex> g(gen_mu_);
    current_ = next;
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(std::min(opt_.timeout_seconds, kMaxLeaveSeconds)));
  const Status changed = Unavailable(me.str() + ": cluster changed to version " + std::to_string(cluster.version()));
  leaves_cut_by_deadline_ += old->retire(changed, deadline, cluster.version());
  retired_.push_back(std::move(old));
  return Status::OK();
}

void Runtime::interrupt(const std::string &reason) { gen()->registry.close(Unavailable(reason), true); }

std::vector<PeerID> Runtime::lost_peers() const {
  GenPtr g = gen();
  std::vector<PeerID> out;
  for (int r : g->lost()) out.push_back(g->cluster.peer(r));
  return out;
}

}  // namespace kungfu
