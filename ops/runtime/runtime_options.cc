#include "runtime_options.h"

#include <cstdlib>

#include "env_values.h"
#include "handshake.h"

namespace kungfu {

namespace {

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

// The launcher's per-run id (hex); the handshake binds connections to it and
// it ends up in logs, hence printable ASCII only.
Status check_job_id(const std::string &id, int cluster_size) {
  if (id.empty() && cluster_size > 1) {
    return InvalidArgument("KUNGFU_JOB_ID is not set: start the workers with kungfu-run, which generates it");
  }
  if (id.size() > kHandshakeMaxJobIdLen) {
    return InvalidArgument("KUNGFU_JOB_ID must be at most " + std::to_string(kHandshakeMaxJobIdLen) + " bytes, got " +
                           std::to_string(id.size()));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] < 0x20 || id[i] > 0x7e) {
      return InvalidArgument("KUNGFU_JOB_ID must be printable ASCII, got byte " +
                             std::to_string(static_cast<unsigned char>(id[i])) + " at offset " + std::to_string(i));
    }
  }
  return Status::OK();
}

Status RuntimeOptions::from_env(RuntimeOptions *out) {
  RuntimeOptions o;
  std::string peers = env("KUNGFU_PEERS");
  if (peers.empty()) {
    o.cluster = Cluster(0, {PeerID{"127.0.0.1", 0}});
    o.self_rank = 0;
    *out = o;
    return Status::OK();
  }
  std::vector<PeerID> list;
  Status s = parse_peer_list(peers, &list);
  if (!s.ok()) return InvalidArgument("KUNGFU_PEERS: " + s.message());
  if (list.empty()) return InvalidArgument("KUNGFU_PEERS is set but lists no peer");
  std::string self_text = env("KUNGFU_SELF");
  PeerID self;
  s = parse_peer(self_text, &self);
  if (!s.ok()) return InvalidArgument("KUNGFU_SELF: " + s.message());
  uint32_t version = 0;
  std::string version_text = env("KUNGFU_CLUSTER_VERSION");
  if (!version_text.empty()) {
    s = parse_uint32("KUNGFU_CLUSTER_VERSION", version_text, &version);
    if (!s.ok()) return s;
  }
  o.cluster = Cluster(version, list);
  o.self_rank = o.cluster.rank_of(self);
  if (o.self_rank < 0) {
    return InvalidArgument("KUNGFU_SELF=" + self_text + " is not in KUNGFU_PEERS=" + peers);
  }
  std::string topo = env("KUNGFU_TOPOLOGY");
  if (!topo.empty()) {
    s = parse_topology(topo, &o.topology);
    if (!s.ok()) return InvalidArgument("KUNGFU_TOPOLOGY: " + s.message());
  }
  std::string timeout = env("KUNGFU_TIMEOUT");
  if (!timeout.empty()) {
    s = parse_timeout_seconds("KUNGFU_TIMEOUT", timeout, &o.timeout_seconds);
    if (!s.ok()) return s;
  }
  o.secret = secret_from_env("KUNGFU_JOB_SECRET");
  if (o.secret.empty() && o.cluster.size() > 1) {
    return PermissionDenied("KUNGFU_JOB_SECRET is not set: start the workers with kungfu-run, which generates it");
  }
  if (!o.secret.empty()) {
    s = check_job_secret("KUNGFU_JOB_SECRET", o.secret.data(), o.secret.size());
    if (!s.ok()) return s;
  }
  std::string authenticate = env("KUNGFU_AUTHENTICATE_FRAMES");
  if (!authenticate.empty() && authenticate != "0" && authenticate != "1") {
    return InvalidArgument("KUNGFU_AUTHENTICATE_FRAMES='" + authenticate + "': expected 0 or 1");
  }
  o.frame_auth = authenticate.empty()  ? FrameAuthPolicy::kAcrossHosts
                 : authenticate == "1" ? FrameAuthPolicy::kAlways
                                       : FrameAuthPolicy::kNever;
  std::string probes = env("KUNGFU_AUTO_PROBES");
  if (!probes.empty()) {
    uint32_t v = 0;
    s = parse_uint32("KUNGFU_AUTO_PROBES", probes, &v);
    if (!s.ok() || v > kMaxAutoProbes) {
      return InvalidArgument("KUNGFU_AUTO_PROBES='" + probes +
                             "': expected the number of timed samples per candidate topology when AUTO measures, "
                             "from 0 to " +
                             std::to_string(kMaxAutoProbes) + " (0: AUTO picks by message size without measuring)");
    }
    o.auto_probes = static_cast<int>(v);
  }
  std::string prune = env("KUNGFU_AUTO_PRUNE");
  if (!prune.empty()) {
    double v = 0;
    if (!parse_decimal(prune, &v) || !(v == 0 || (v >= 1 && v <= kMaxAutoPrune))) {
      return InvalidArgument("KUNGFU_AUTO_PRUNE='" + prune +
                             "': expected how many times the fastest candidate's first sample a topology may take "
                             "and still be probed further, from 1 to " +
                             std::to_string(static_cast<int>(kMaxAutoPrune)) + ", or 0 to probe every candidate fully");
    }
    o.auto_prune = v;
  }
  std::string auto_log = env("KUNGFU_AUTO_LOG");
  if (!auto_log.empty() && auto_log != "0" && auto_log != "1") {
    return InvalidArgument("KUNGFU_AUTO_LOG='" + auto_log +
                           "': expected 1 (rank 0 prints what AUTO's probes measured and chose) or 0");
  }
  o.auto_log = auto_log == "1";
  std::string shm = env("KUNGFU_SHM");
  if (!shm.empty() && shm != "0" && shm != "1") {
    return InvalidArgument("KUNGFU_SHM='" + shm +
                           "': expected 0 (same-host peers talk through Unix sockets) or 1 (through shared memory, "
                           "the default)");
  }
  o.same_host_shm = shm != "0";
  o.job_id = env("KUNGFU_JOB_ID");
  s = check_job_id(o.job_id, o.cluster.size());
  if (!s.ok()) return s;
  *out = o;
  return Status::OK();
}

}  // namespace kungfu
