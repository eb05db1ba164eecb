// The runtime object and its generations: creation, shutdown, the
// transport of each generation and the routing of what it reads, and the
// read-only views of the current generation. The operations live beside it:
// runtime_membership.cc (cluster changes), runtime_collectives.cc,
// runtime_consensus.cc, runtime_p2p.cc (blob store requests), runtime_push.cc
// (accumulators) and runtime_rows.cc (row store).
#include "runtime.h"

#include <algorithm>
#include <cstdint>

namespace kungfu {

// Forwards what one generation's transport reads to the runtime, with that
// generation: a frame is always handled in the version it arrived in.
class Runtime::Handler : public FrameHandler {
 public:
  Handler(Runtime *rt, Generation *g) : rt_(rt), g_(g) {}
  bool on_frame(int src, const FrameHeader &header, std::string key, const PartialReader &read) override {
    return rt_->on_frame(*g_, src, header, std::move(key), read);
  }
  void on_peer_lost(int peer, const Status &why) override { rt_->on_peer_lost(*g_, peer, why); }
  void on_peer_left(int peer, const Status &why) override { rt_->on_peer_left(*g_, peer, why); }

 private:
  Runtime *const rt_;
  Generation *const g_;
};

Runtime::Runtime(RuntimeOptions options) : opt_(std::move(options)), topology_(opt_.topology) {}

Runtime::~Runtime() {
  shutdown();
  // Generations first: their transport threads call into the stores.
  std::lock_guard<std::mutex> lock(update_mu_);
  GenPtr last = gen();
  last->retire(Unavailable("the kungfu runtime of " + last->cluster.describe(last->self_rank) + " was destroyed"),
               std::chrono::steady_clock::now(), 0);
  retired_.clear();
  std::lock_guard<std::mutex> g(gen_mu_);
  current_.reset();
}

Runtime::GenPtr Runtime::gen() const {
  std::lock_guard<std::mutex> lock(gen_mu_);
  return current_;
}

Runtime::GenPtr Runtime::make_generation(const Cluster &cluster, int self_rank) {
  auto g = std::make_shared<Generation>(cluster, self_rank, opt_.timeout_seconds);
  g->handler = std::make_unique<Handler>(this, g.get());
  return g;
}

Status Runtime::start_transport(Generation &g, Listeners listeners, const Generation *previous) {
  TransportOptions t;
  t.listening.assign(g.size(), false);
  if (previous != nullptr && previous->transport) {
    for (int r = 0; r < g.size(); ++r) t.listening[r] = previous->cluster.rank_of(g.cluster.peer(r)) >= 0;
  }
  t.cluster = g.cluster;
  t.self_rank = g.self_rank;
  t.secret = opt_.secret;
  t.job_id = opt_.job_id;
  t.frame_auth = opt_.frame_auth;
  t.timeout_seconds = opt_.timeout_seconds;
  t.same_host_unix_sockets = opt_.same_host_unix_sockets;
  t.same_host_shm = opt_.same_host_shm;
  g.transport = std::make_unique<Transport>(t, g.handler.get());
  Status s = g.transport->start(std::move(listeners));
  if (!s.ok()) g.transport.reset();
  return s;
}

void Runtime::shutdown() {
  std::call_once(shutdown_once_, [this] {
    std::lock_guard<std::mutex> lock(update_mu_);
    left_ = true;
    GenPtr g = gen();
    if (g->transport) {
      auto deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::min(opt_.timeout_seconds, kMaxLeaveSeconds)));
      leaves_cut_by_deadline_ += g->transport->leave(deadline);
    }
    g->registry.close(Unavailable("the kungfu runtime of " + g->cluster.describe(g->self_rank) + " has shut down"));
  });
}

Status Runtime::create(RuntimeOptions options, std::unique_ptr<Runtime> *out) {
  if (options.self_rank < 0 || options.self_rank >= options.cluster.size()) {
    return InvalidArgument("self rank " + std::to_string(options.self_rank) + " outside the cluster");
  }
  std::unique_ptr<Runtime> rt(new Runtime(std::move(options)));
  // In force before the transport starts: a runtime that fails here is
  // still destroyed like any other.
  rt->current_ = rt->make_generation(rt->opt_.cluster, rt->opt_.self_rank);
  if (rt->size() > 1) {
    Status s = rt->start_transport(*rt->current_, Listeners(), nullptr);
    if (!s.ok()) return s;
  }
  *out = std::move(rt);
  return Status::OK();
}

PeerID Runtime::self() const {
  GenPtr g = gen();
  return g->cluster.peer(g->self_rank);
}

int Runtime::local_rank() const {
  GenPtr g = gen();
  std::vector<int> local = g->cluster.local_ranks(g->self_rank);
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i] == g->self_rank) return static_cast<int>(i);
  }
  return 0;
}

int Runtime::local_size() const {
  GenPtr g = gen();
  return static_cast<int>(g->cluster.local_ranks(g->self_rank).size());
}

std::vector<Runtime::PeerTraffic> Runtime::traffic() const {
  GenPtr g = gen();
  std::vector<PeerTraffic> out(g->size());
  if (!g->transport) return out;
  for (int r = 0; r < g->size(); ++r) {
    out[r].sent = g->transport->counters().sent(r);
    out[r].received = g->transport->counters().received(r);
  }
  return out;
}

uint64_t Runtime::rejected_connections() const {
  GenPtr g = gen();
  return g->transport ? g->transport->rejected_connections() : 0;
}

size_t Runtime::handshakes_in_progress() const {
  GenPtr g = gen();
  return g->transport ? g->transport->handshakes_in_progress() : 0;
}

uint64_t Runtime::evicted_handshakes() const {
  GenPtr g = gen();
  return g->transport ? g->transport->evicted_handshakes() : 0;
}

uint64_t Runtime::authenticated_connections() const {
  GenPtr g = gen();
  return g->transport ? g->transport->authenticated_connections() : 0;
}

uint64_t Runtime::shm_connections() const {
  GenPtr g = gen();
  return g->transport ? g->transport->shm_connections() : 0;
}

size_t Runtime::sender_threads() const {
  GenPtr g = gen();
  return g->transport ? g->transport->sender_threads() : 0;
}

uint64_t Runtime::sender_idle_wakeups() const {
  GenPtr g = gen();
  return g->transport ? g->transport->sender_idle_wakeups() : 0;
}

size_t Runtime::receiver_threads() const {
  GenPtr g = gen();
  return g->transport ? g->transport->receiver_threads() : 0;
}

bool Runtime::on_frame(Generation &g, int src, const FrameHeader &header, std::string key, const PartialReader &read) {
  switch (static_cast<FrameType>(header.type)) {
    case FrameType::kCollective:
    case FrameType::kP2PResponse: return g.mailbox.deliver(src, header, std::move(key), read);
    case FrameType::kAbort: {
      std::string reason(std::min<uint64_t>(header.payload_len, 64 * 1024), '\0');
      if (!read(reason.data(), reason.size())) return false;
      Code code = header.flags >= 1 && header.flags <= static_cast<uint8_t>(Code::kInternal)
                      ? static_cast<Code>(header.flags)
                      : Code::kInternal;
      g.registry.abort(key, header.seq, Status(code, reason + " (reported by " + g.cluster.describe(src) + ")"));
      return true;
    }
    case FrameType::kP2PRequest: serve_request(g, src, header, key, read); return true;
    case FrameType::kPush: return receive_push(g, src, header, key, read);
    case FrameType::kPushRows: return receive_push_rows(g, src, header, key, read);
    default: return true;  // unknown frames are skipped: newer peers may send more kinds
  }
}

void Runtime::on_peer_lost(Generation &g, int peer, const Status &why) {
  g.note_lost(peer);
  g.mailbox.fail_peer(peer, why);
  g.registry.peer_lost(peer, why);
}

void Runtime::on_peer_left(Generation &g, int peer, const Status &why) {
  // What it sent before leaving stays deliverable; only waits for more fail.
  g.mailbox.fail_peer(peer, why);
  g.registry.peer_left(peer, why);
}

}  // namespace kungfu
