#include "runtime.h"

#include "env_values.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "handshake.h"

namespace kungfu {

namespace {

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Names of the internal collectives a compound operation runs; the '\x01' keeps
// them apart from any name a user can pass.
std::string sub_name(const std::string &name, const char *part) { return name + "\x01" + part; }

// The launcher's per-run id (hex); the handshake binds connections to it and
// it ends up in logs, hence printable ASCII only.
Status check_job_id(const std::string &id, int cluster_size) {
  if (id.empty() && cluster_size > 1) {
    return InvalidArgument("KUNGFU_JOB_ID is not set: start the workers with kungfu-run, which generates it");
  }
  if (id.size() > kHandshakeMaxJobIdLen) {
    return InvalidArgument("KUNGFU_JOB_ID must be at most " + std::to_string(kHandshakeMaxJobIdLen) +
                           " bytes, got " + std::to_string(id.size()));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] < 0x20 || id[i] > 0x7e) {
      return InvalidArgument("KUNGFU_JOB_ID must be printable ASCII, got byte " +
                             std::to_string(static_cast<unsigned char>(id[i])) + " at offset " + std::to_string(i));
    }
  }
  return Status::OK();
}

}  // namespace

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
  o.job_id = env("KUNGFU_JOB_ID");
  s = check_job_id(o.job_id, o.cluster.size());
  if (!s.ok()) return s;
  *out = o;
  return Status::OK();
}

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
      g->transport->leave(deadline);
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
  old->retire(Unavailable(me.str() + ": cluster changed to version " + std::to_string(cluster.version())), deadline,
              cluster.version());
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

CollectiveContext Runtime::context(Generation &g) {
  return CollectiveContext{g.mailbox, *g.transport, g.registry, g.cluster, g.self_rank};
}

TopologyKind Runtime::resolve(const Generation &g, TopologyKind kind, size_t bytes) const {
  return kind == TopologyKind::kAuto ? choose_auto(bytes, g.cluster) : kind;
}

void Runtime::run(Generation &g, const std::string &kind, const std::string &name, Buffer &buf, ReduceOp op,
                  Plan plan, bool staged, DoneCallback done) {
  auto coll = std::make_shared<CollectiveOp>(context(g), kind, name, buf.desc, op, plan.kind, std::move(plan.graphs),
                                             std::move(plan.tasks), staged ? nullptr : buf.send, buf.recv,
                                             buf.keepalive, std::move(done));
  coll->start();
}

namespace {

// Copies the input into the output where they differ: the executor reduces in place.
void stage_input(const Buffer &buf, size_t bytes) {
  if (buf.send != buf.recv && bytes > 0) std::memcpy(buf.recv, buf.send, bytes);
}

}  // namespace

void Runtime::all_reduce(const std::string &name, Buffer buf, ReduceOp op, DoneCallback done) {
  all_reduce_in(gen(), topology(), name, std::move(buf), op, std::move(done));
}

void Runtime::all_reduce_on(TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op,
                            DoneCallback done) {
  all_reduce_in(gen(), kind, name, std::move(buf), op, std::move(done));
}

void Runtime::all_reduce_in(const GenPtr &g, TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op,
                            DoneCallback done) {
  // Refused here too when interrupted or retired, not only where the registry
  // is asked: a one-worker cluster never registers anything.
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), "all_reduce '" + name + "': " + refused.message()));
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (g->size() == 1) {
    stage_input(buf, bytes);
    return done(Status::OK());
  }
  TopologyKind k = resolve(*g, kind, bytes);
  Plan plan = plan_all_reduce(buf.desc.count, dtype_size(buf.desc.dtype), g->topologies[static_cast<size_t>(k)],
                              opt_.chunk_bytes);
  run(*g, "all_reduce", name, buf, op, std::move(plan), false, std::move(done));
}

void Runtime::broadcast(const std::string &name, Buffer buf, int root, DoneCallback done) {
  GenPtr g = gen();
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), "broadcast '" + name + "': " + refused.message()));
  if (root < 0 || root >= g->size()) {
    return done(InvalidArgument("broadcast '" + name + "': root " + std::to_string(root) + " outside a cluster of " +
                                std::to_string(g->size())));
  }
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (g->self_rank == root) stage_input(buf, bytes);
  if (g->size() == 1) return done(Status::OK());
  Plan plan = plan_rooted(resolve(*g, topology(), bytes), g->cluster, root, buf.desc.count,
                          dtype_size(buf.desc.dtype), opt_.chunk_bytes, false, true);
  run(*g, "broadcast", name, buf, ReduceOp::kSum, std::move(plan), true, std::move(done));
}

void Runtime::reduce(const std::string &name, Buffer buf, ReduceOp op, int root, DoneCallback done) {
  GenPtr g = gen();
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), "reduce '" + name + "': " + refused.message()));
  if (root < 0 || root >= g->size()) {
    return done(InvalidArgument("reduce '" + name + "': root " + std::to_string(root) + " outside a cluster of " +
                                std::to_string(g->size())));
  }
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (g->size() == 1) {
    stage_input(buf, bytes);
    return done(Status::OK());
  }
  Plan plan = plan_rooted(resolve(*g, topology(), bytes), g->cluster, root, buf.desc.count,
                          dtype_size(buf.desc.dtype), opt_.chunk_bytes, true, false);
  run(*g, "reduce", name, buf, op, std::move(plan), false, std::move(done));
}

void Runtime::all_gather(const std::string &name, Buffer buf, DoneCallback done) {
  GenPtr g = gen();
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), "all_gather '" + name + "': " + refused.message()));
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (bytes > 0) {
    std::memcpy(static_cast<char *>(buf.recv) + static_cast<size_t>(g->self_rank) * bytes, buf.send, bytes);
  }
  if (g->size() == 1) return done(Status::OK());
  Plan plan = plan_all_gather(resolve(*g, topology(), bytes), g->cluster, buf.desc.count,
                              dtype_size(buf.desc.dtype), opt_.chunk_bytes);
  run(*g, "all_gather", name, buf, ReduceOp::kSum, std::move(plan), true, std::move(done));
}

void Runtime::barrier(const std::string &name, DoneCallback done) { barrier_in(gen(), name, std::move(done)); }

void Runtime::barrier_in(const GenPtr &g, const std::string &name, DoneCallback done) {
  auto byte = std::make_shared<uint8_t>(1);
  Buffer buf;
  buf.send = byte.get();
  buf.recv = byte.get();
  buf.desc = TensorDesc{DType::kUInt8, {1}, 1};
  buf.keepalive = byte;
  all_reduce_in(g, TopologyKind::kStar, name, buf, ReduceOp::kMin, std::move(done));
}

void Runtime::consensus(const std::string &name, std::vector<char> bytes, ConsensusCallback done) {
  consensus_in(gen(), name, std::move(bytes), std::move(done));
}

void Runtime::consensus_in(const GenPtr &g, const std::string &name, std::vector<char> bytes,
                           ConsensusCallback done) {
  // Alg. 1: first agree on the length (min == max), then on the bytes
  // (byte-wise min == max), then a barrier so nobody acts before all know.
  // Every step runs on generation `g`: after a cluster change the rest fails
  // instead of continuing with another membership.
  struct State {
    std::vector<char> bytes, lo, hi;
    int64_t len_lo = 0, len_hi = 0;
    std::atomic<int> left{2};
    std::mutex mu;
    Status status;
  };
  auto st = std::make_shared<State>();
  st->bytes = std::move(bytes);
  st->len_lo = st->len_hi = static_cast<int64_t>(st->bytes.size());
  auto self = this;

  auto both = [st](const Status &s) {  // joins two concurrent all-reduces
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->status.ok()) st->status = s;
    }
    return st->left.fetch_sub(1) == 1;
  };
  auto finish_with_barrier = [self, g, name, done](bool agreed) {
    self->barrier_in(g, sub_name(name, "barrier"), [done, agreed](const Status &s) { done(s, s.ok() && agreed); });
  };
  auto compare_bytes = [self, g, st, name, done, both, finish_with_barrier]() {
    size_t n = st->bytes.size();
    st->lo = st->bytes;
    st->hi = st->bytes;
    st->left = 2;
    auto after = [st, done, both, finish_with_barrier](const Status &s) {
      if (!both(s)) return;
      if (!st->status.ok()) return done(st->status, false);
      finish_with_barrier(st->lo == st->hi);
    };
    Buffer lo{st->lo.data(), st->lo.data(), TensorDesc{DType::kUInt8, {static_cast<int64_t>(n)}, n}, st};
    Buffer hi{st->hi.data(), st->hi.data(), TensorDesc{DType::kUInt8, {static_cast<int64_t>(n)}, n}, st};
    self->all_reduce_in(g, TopologyKind::kStar, sub_name(name, "bytes_min"), lo, ReduceOp::kMin, after);
    self->all_reduce_in(g, TopologyKind::kStar, sub_name(name, "bytes_max"), hi, ReduceOp::kMax, after);
  };
  auto after_len = [st, done, both, compare_bytes, finish_with_barrier](const Status &s) {
    if (!both(s)) return;
    if (!st->status.ok()) return done(st->status, false);
    if (st->len_lo != st->len_hi) return finish_with_barrier(false);
    compare_bytes();
  };
  Buffer lo{&st->len_lo, &st->len_lo, TensorDesc{DType::kInt64, {1}, 1}, st};
  Buffer hi{&st->len_hi, &st->len_hi, TensorDesc{DType::kInt64, {1}, 1}, st};
  all_reduce_in(g, TopologyKind::kStar, sub_name(name, "len_min"), lo, ReduceOp::kMin, after_len);
  all_reduce_in(g, TopologyKind::kStar, sub_name(name, "len_max"), hi, ReduceOp::kMax, after_len);
}

void Runtime::set_topology(const std::string &name, TopologyKind kind, ConsensusCallback done) {
  std::string text = topology_name(kind);
  GenPtr g = gen();
  consensus_in(g, name, std::vector<char>(text.begin(), text.end()),
               [this, g, kind, name, done](const Status &s, bool agreed) {
                 if (!s.ok() || !agreed) return done(s, false);
                 topology_.store(kind);
                 // A second barrier: nobody starts a collective on the new
                 // topology before every worker has switched.
                 barrier_in(g, sub_name(name, "switched"), [done](const Status &b) { done(b, b.ok()); });
               });
}

void Runtime::save(const std::string &name, uint64_t version, const void *data, size_t len) {
  auto blob = std::make_shared<std::vector<char>>(static_cast<const char *>(data),
                                                  static_cast<const char *>(data) + len);
  store_.save(name, version, std::move(blob));
}

namespace {

// A point-to-point operation in flight (request, push, a request parked on
// the serving side), registered so that timeouts and dead peers fail it.
class PeerOp : public PendingOp {
 public:
  PeerOp(int rank, std::string what, std::string describe, DoneCallback done)
      : rank_(rank), what_(std::move(what)), describe_(std::move(describe)), done_(std::move(done)) {}
  void complete(const Status &s) {
    if (!finished_.exchange(true)) done_(s);
  }
  // Like complete(work()), but `work` (which writes the result) runs only if
  // the op has not finished yet: nothing lands in an output after a timeout.
  template <typename Work>
  void complete_with(Work work) {
    if (!finished_.exchange(true)) done_(work());
  }
  // Runs `cleanup` when the op fails (timeout, dead peer), or now if it
  // already has; it releases what a result would have come through.
  void on_failure(std::function<void()> cleanup) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_) {
      cleanup_ = std::move(cleanup);
      return;
    }
    lock.unlock();
    cleanup();
  }
  void fail(const Status &why, bool) override {
    std::function<void()> cleanup;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
      cleanup.swap(cleanup_);
    }
    complete(why);
    if (cleanup) cleanup();
  }
  std::string waiting_for() const override { return "waiting for " + describe_; }
  std::string describe() const override { return what_; }
  bool needs(int rank) const override { return rank == rank_; }
  bool only_with(int rank) const override { return rank == rank_; }

 private:
  const int rank_;
  const std::string what_;
  const std::string describe_;
  DoneCallback done_;
  std::atomic<bool> finished_{false};
  std::mutex mu_;  // guards the two below
  bool failed_ = false;
  std::function<void()> cleanup_;
};

// Sends request frame `h` about `name`, carrying the request id `id`; the
// answer comes through the mailbox, a failed send fails `op` at once.
void send_request(Transport &transport, OpRegistry *registry, int peer, FrameHeader h, const std::string &name,
                  const std::string &id, std::shared_ptr<PeerOp> op) {
  auto payload = std::make_shared<std::string>(id);
  transport.send(peer, h, name, payload->data(), payload->size(), payload, [op, registry, id](const Status &st) {
    if (!st.ok()) {
      registry->remove(id);
      op->complete(st);
    }
  });
}

}  // namespace

void Runtime::request(int peer, const std::string &name, uint64_t version, void *dst, size_t len,
                      std::shared_ptr<const void> keepalive, DoneCallback done) {
  fetch(peer, name, version, false, dst, len, std::move(keepalive),
        [done](const Status &s, uint64_t) { done(s); });
}

void Runtime::request_at_least(int peer, const std::string &name, uint64_t min_version, void *dst, size_t len,
                               std::shared_ptr<const void> keepalive, VersionCallback done) {
  fetch(peer, name, min_version, true, dst, len, std::move(keepalive), std::move(done));
}

void Runtime::fetch(int peer, const std::string &name, uint64_t version, bool at_least, void *dst, size_t len,
                    std::shared_ptr<const void> keepalive, VersionCallback done) {
  GenPtr g = gen();
  std::string what = "request '" + name + "'" + (at_least ? " version >= " + std::to_string(version) : "") +
                     " from " + (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) return done(InvalidArgument(what + ": no such rank"), 0);
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()), 0);
  auto check_size = [what, len](size_t got) {
    return got == len ? Status::OK()
                      : InvalidArgument(what + ": the saved blob has " + std::to_string(got) +
                                        " bytes but the request expects " + std::to_string(len));
  };
  // Both paths deliver the version through this cell: PeerOp only carries a Status.
  auto found = std::make_shared<uint64_t>(0);
  auto finish = [done, found](const Status &s) { done(s, *found); };
  if (peer == g->self_rank && !at_least) {
    Blob blob = store_.get(name, version, found.get());
    if (!blob) return finish(NotFound(what + ": nothing saved under that name and version"));
    Status s = check_size(blob->size());
    if (s.ok() && len > 0) std::memcpy(dst, blob->data(), len);
    return finish(s);
  }
  std::string id = "p2p#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), finish);
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  auto registry = &g->registry;
  if (peer == g->self_rank) {
    // Waiting for our own save: the registry's deadline bounds the wait.
    // `keepalive` owns dst until the callback is gone (run or cancelled).
    uint64_t token = store_.when_saved(name, version, [op, registry, id, found, check_size, dst, len, keepalive](uint64_t v, Blob blob) {
      registry->remove(id);
      op->complete_with([&] {
        *found = v;
        Status ok = check_size(blob->size());
        if (ok.ok() && len > 0) std::memcpy(dst, blob->data(), len);
        return ok;
      });
    });
    if (token != 0) op->on_failure([this, name, token] { store_.cancel(name, token); });
    return;
  }
  // A response may land in dst even after a timeout: `keepalive` owns it until then.
  g->mailbox.expect(peer, id, dst, len, [op, id, registry, check_size, what, dst, found, version, keepalive](const Status &st, Message &msg) {
    registry->remove(id);
    if (!st.ok()) return op->complete(Status(st.code(), what + ": " + st.message()));
    if (msg.header.flags & kFlagNotFound) {
      return op->complete(NotFound(what + ": nothing saved under that name and version"));
    }
    if (msg.header.flags & kFlagTimedOut) {
      return op->complete(DeadlineExceeded(what + ": no version >= " + std::to_string(version) +
                                           " was saved there within the timeout (KUNGFU_TIMEOUT)"));
    }
    Status size_ok = check_size(msg.size());
    // A response that did not land in place (it beat our expect()) is copied.
    if (size_ok.ok() && msg.direct == nullptr && msg.size() > 0) std::memcpy(dst, msg.data(), msg.size());
    *found = msg.header.seq;
    op->complete(size_ok);
  });
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PRequest);
  h.flags = at_least ? kFlagAtLeast : 0;
  h.seq = version;
  send_request(*g->transport, registry, peer, h, name, id, op);
}

void Runtime::push(int peer, const std::string &name, Buffer buf, DoneCallback done) {
  GenPtr g = gen();
  std::string what = "push '" + name + "' to " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) {
    return done(InvalidArgument(what + ": no such rank in a cluster of " + std::to_string(g->size())));
  }
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()));
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (peer == g->self_rank) {
    accumulators_.add(name, g->cluster.describe(peer), buf.desc.dtype, buf.desc.count, buf.send);
    return done(Status::OK());
  }
  std::string id = "push#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), std::move(done));
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kPush);
  h.dtype = static_cast<uint8_t>(buf.desc.dtype);
  h.ndims = static_cast<uint32_t>(std::min<size_t>(buf.desc.shape.size(), kMaxDims));
  for (uint32_t i = 0; i < h.ndims; ++i) h.dims[i] = buf.desc.shape[i];
  auto registry = &g->registry;
  g->transport->send(peer, h, name, buf.send, bytes, buf.keepalive, [op, registry, id, what](const Status &st) {
    registry->remove(id);
    op->complete(st.ok() ? st : Status(st.code(), what + ": " + st.message()));
  });
}

Status Runtime::take(const std::string &name, void *dst, const TensorDesc &desc, int64_t *pushes) {
  return accumulators_.take(name, desc.dtype, desc.count, dst, pushes);
}

bool Runtime::receive_push(Generation &g, int src, const FrameHeader &header, const std::string &name,
                           const PartialReader &read) {
  if (!dtype_valid(header.dtype) || header.payload_len % dtype_size(static_cast<DType>(header.dtype)) != 0) {
    // Not something a peer of this build sends; the transport skips the payload.
    fprintf(stderr, "kungfu: dropped a malformed push to '%s' from %s\n", name.c_str(),
            g.cluster.describe(src).c_str());
    return true;
  }
  DType dtype = static_cast<DType>(header.dtype);
  // The whole payload first, then one add under the accumulator's lock: a
  // take never sees half a push, and never waits on the network.
  PooledBuffer payload;
  if (!read_payload(read, header.payload_len, &payload)) return false;
  accumulators_.add(name, g.cluster.describe(src), dtype, header.payload_len / dtype_size(dtype), payload.data());
  return true;
}

void Runtime::push_rows(int peer, const std::string &name, const RowsDesc &desc, size_t n, const int64_t *rows,
                        const void *values, DoneCallback done) {
  GenPtr g = gen();
  std::string what = "push of " + std::to_string(n) + " rows into '" + name + "' to " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) {
    return done(InvalidArgument(what + ": no such rank in a cluster of " + std::to_string(g->size())));
  }
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()));
  if (peer == g->self_rank) {
    accumulators_.add_rows(name, g->cluster.describe(peer), desc.dtype, desc.num_rows, desc.row_len, n, rows,
                           values);
    return done(Status::OK());
  }
  // One frame: the indices, then the rows (a copy of only the touched rows).
  auto payload = std::make_shared<std::vector<char>>(n * (sizeof(int64_t) + desc.row_bytes()));
  if (n > 0) {
    std::memcpy(payload->data(), rows, n * sizeof(int64_t));
    std::memcpy(payload->data() + n * sizeof(int64_t), values, n * desc.row_bytes());
  }
  std::string id = "push#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), std::move(done));
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kPushRows);
  h.dtype = static_cast<uint8_t>(desc.dtype);
  h.ndims = 2;
  h.dims[0] = static_cast<int64_t>(desc.num_rows);
  h.dims[1] = static_cast<int64_t>(desc.row_len);
  h.seq = n;
  auto registry = &g->registry;
  g->transport->send(peer, h, name, payload->data(), payload->size(), payload, [op, registry, id, what](const Status &st) {
    registry->remove(id);
    op->complete(st.ok() ? st : Status(st.code(), what + ": " + st.message()));
  });
}

bool Runtime::receive_push_rows(Generation &g, int src, const FrameHeader &header, const std::string &name,
                                const PartialReader &read) {
  RowsDesc desc;
  bool valid = dtype_valid(header.dtype) && header.ndims == 2 && header.dims[0] >= 0 && header.dims[1] >= 0;
  if (valid) {
    desc = RowsDesc{static_cast<DType>(header.dtype), static_cast<size_t>(header.dims[0]),
                    static_cast<size_t>(header.dims[1])};
    // Divisions, not products: a product of claimed sizes can wrap around
    // and make a short payload claim billions of rows (or a table of a few
    // bytes claim billions of elements).
    const size_t elem = dtype_size(desc.dtype);
    valid = desc.row_len <= SIZE_MAX / elem - sizeof(int64_t) &&
            (desc.row_len == 0 || desc.num_rows <= SIZE_MAX / desc.row_bytes());
    if (valid) {
      const uint64_t per_row = sizeof(int64_t) + desc.row_bytes();
      valid = header.payload_len % per_row == 0 && header.payload_len / per_row == header.seq;
    }
  }
  if (!valid) {
    // Not something a peer of this build sends; the transport skips the payload.
    fprintf(stderr, "kungfu: dropped a malformed push of rows to '%s' from %s\n", name.c_str(),
            g.cluster.describe(src).c_str());
    return true;
  }
  // The whole payload first, then one add under the accumulator's lock.
  PooledBuffer payload;
  if (!read_payload(read, header.payload_len, &payload)) return false;
  size_t n = header.seq;
  std::vector<int64_t> rows(n);
  if (n > 0) std::memcpy(rows.data(), payload.data(), n * sizeof(int64_t));  // aligned for the adds
  accumulators_.add_rows(name, g.cluster.describe(src), desc.dtype, desc.num_rows, desc.row_len, n, rows.data(),
                         payload.data() + n * sizeof(int64_t));
  return true;
}

Status Runtime::take_rows(const std::string &name, const RowsDesc &desc, std::vector<int64_t> *rows,
                          std::vector<char> *values, int64_t *pushes) {
  return accumulators_.take_rows(name, desc.dtype, desc.num_rows, desc.row_len, rows, values, pushes);
}

Status Runtime::save_rows(const std::string &name, uint64_t version, const void *table, const RowsDesc &desc,
                          const int64_t *rows, size_t n) {
  return rows_.update(name, version, static_cast<const char *>(table), desc.num_rows, desc.row_bytes(), rows, n);
}

void Runtime::request_rows(int peer, const std::string &name, uint64_t min_version, RowsDoneCallback done) {
  GenPtr g = gen();
  std::string what = "request for rows of '" + name + "' version >= " + std::to_string(min_version) + " from " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) return done(InvalidArgument(what + ": no such rank"), RowsReply{});
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()), RowsReply{});
  auto key = std::make_pair(peer, name);
  uint64_t held;
  {
    std::lock_guard<std::mutex> lock(g->rows_held_mu);
    held = g->rows_held[key];
  }
  // Both paths deliver the reply through this cell: PeerOp only carries a Status.
  auto got = std::make_shared<RowsReply>();
  Generation *held_in = g.get();  // retired generations live on with the runtime
  auto finish = [held_in, key, got, done](const Status &s) {
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(held_in->rows_held_mu);
      held_in->rows_held[key] = got->version;
    }
    done(s, *got);
  };
  std::string id = "rows#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), finish);
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  auto registry = &g->registry;
  if (peer == g->self_rank) {
    uint64_t token = rows_.when_updated(name, peer, held, min_version, [op, registry, id, got](RowsReply r) {
      registry->remove(id);
      op->complete_with([&] {
        *got = std::move(r);
        return Status::OK();
      });
    });
    if (token != 0) op->on_failure([this, name, token] { rows_.cancel(name, token); });
    return;
  }
  g->mailbox.expect(peer, id, nullptr, 0, [op, id, registry, what, got, min_version](const Status &st, Message &msg) {
    registry->remove(id);
    if (!st.ok()) return op->complete(Status(st.code(), what + ": " + st.message()));
    if (msg.header.flags & kFlagTimedOut) {
      return op->complete(DeadlineExceeded(what + ": no version >= " + std::to_string(min_version) +
                                           " was saved there within the timeout (KUNGFU_TIMEOUT)"));
    }
    if (!(msg.header.flags & kFlagRows)) return op->complete(Internal(what + ": the answer is not a rows reply"));
    op->complete_with([&] {
      got->version = msg.header.seq;
      got->all_rows = (msg.header.flags & kFlagAllRows) != 0;
      got->num_rows = static_cast<size_t>(msg.header.dims[0]);
      got->row_bytes = static_cast<size_t>(msg.header.dims[1]);
      got->payload = std::make_shared<const std::vector<char>>(msg.data(), msg.data() + msg.size());
      return Status::OK();
    });
  });
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PRequest);
  h.flags = kFlagAtLeast | kFlagRows;
  h.seq = min_version;
  h.dims[0] = static_cast<int64_t>(held);
  send_request(*g->transport, registry, peer, h, name, id, op);
}

void Runtime::respond(Generation &g, int src, const std::string &id, uint8_t flags, uint64_t version, Blob blob,
                      const std::vector<int64_t> &dims) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PResponse);
  h.flags = flags;
  h.seq = version;
  h.ndims = static_cast<uint32_t>(std::min<size_t>(dims.size(), kMaxDims));
  for (uint32_t i = 0; i < h.ndims; ++i) h.dims[i] = dims[i];
  const void *data = blob ? blob->data() : nullptr;
  size_t len = blob ? blob->size() : 0;
  g.transport->send(src, h, id, data, len, std::move(blob), [](const Status &) {});
}

void Runtime::serve_request(Generation &g, int src, const FrameHeader &header, const std::string &name,
                            const PartialReader &read) {
  if (header.payload_len > kMaxKeyLen) return;  // not a request id we could have sent
  std::string id(header.payload_len, '\0');
  if (!read(id.data(), id.size())) return;
  if (header.flags & kFlagRows) return serve_rows(g, src, header, name, id);
  if (!(header.flags & kFlagAtLeast)) {
    uint64_t version = 0;
    Blob blob = store_.get(name, header.seq, &version);
    if (!blob) return respond(g, src, id, kFlagNotFound, 0, nullptr);
    return respond(g, src, id, 0, version, std::move(blob));
  }
  // At least a version: answer now if we hold one, else park the request
  // until a save() brings one. The answer goes out in the version the
  // request came in (generations live as long as the runtime).
  std::string what = "request '" + name + "' version >= " + std::to_string(header.seq) + " parked for " +
                     g.cluster.describe(src);
  uint64_t min_version = header.seq;
  Generation *in = &g;
  park(
      g, src, id, what,
      [this, in, src, id, name, min_version](std::function<void(Respond)> ready) {
        return store_.when_saved(name, min_version, [this, in, src, id, ready](uint64_t version, Blob blob) {
          ready([this, in, src, id, version, blob] { respond(*in, src, id, 0, version, blob); });
        });
      },
      [this, name](uint64_t token) { store_.cancel(name, token); });
}

void Runtime::serve_rows(Generation &g, int src, const FrameHeader &header, const std::string &name,
                         const std::string &id) {
  std::string what = "request for rows of '" + name + "' version >= " + std::to_string(header.seq) +
                     " parked for " + g.cluster.describe(src);
  uint64_t min_version = header.seq;
  auto held = static_cast<uint64_t>(header.dims[0]);
  Generation *in = &g;
  park(
      g, src, id, what,
      [this, in, src, id, name, min_version, held](std::function<void(Respond)> ready) {
        return rows_.when_updated(name, src, held, min_version, [this, in, src, id, ready](RowsReply r) {
          ready([this, in, src, id, r] {
            respond(*in, src, id, static_cast<uint8_t>(kFlagRows | (r.all_rows ? kFlagAllRows : 0)), r.version,
                    r.payload, {static_cast<int64_t>(r.num_rows), static_cast<int64_t>(r.row_bytes)});
          });
        });
      },
      [this, name](uint64_t token) { rows_.cancel(name, token); });
}

void Runtime::park(Generation &g, int src, const std::string &id, const std::string &what,
                   const std::function<uint64_t(std::function<void(Respond)>)> &wait,
                   std::function<void(uint64_t)> cancel) {
  // Registered like any op, so that our timeout answers it with
  // kFlagTimedOut (the requester's expectation is always consumed) and a
  // requester that dies is forgotten.
  std::string parked = "parked#" + std::to_string(src) + "#" + id;
  Generation *in = &g;
  auto timed_out = [this, in, src, id] { respond(*in, src, id, kFlagTimedOut, 0, nullptr); };
  auto op = std::make_shared<PeerOp>(src, what, g.cluster.describe(src), [timed_out](const Status &s) {
    if (s.code() == Code::kDeadlineExceeded) timed_out();
  });
  Status s = g.registry.add(parked, op);
  if (!s.ok()) return timed_out();  // closed (interrupted, retired): the requester hears at once
  auto registry = &g.registry;
  uint64_t token = wait([op, registry, parked](Respond send) {
    registry->remove(parked);
    op->complete_with([&] {
      send();
      return Status::OK();
    });
  });
  if (token != 0) op->on_failure([cancel, token] { cancel(token); });
}

bool Runtime::on_frame(Generation &g, int src, const FrameHeader &header, std::string key,
                       const PartialReader &read) {
  switch (static_cast<FrameType>(header.type)) {
    case FrameType::kCollective:
    case FrameType::kP2PResponse:
      return g.mailbox.deliver(src, header, std::move(key), read);
    case FrameType::kAbort: {
      std::string reason(std::min<uint64_t>(header.payload_len, 64 * 1024), '\0');
      if (!read(reason.data(), reason.size())) return false;
      Code code = header.flags >= 1 && header.flags <= static_cast<uint8_t>(Code::kInternal)
                      ? static_cast<Code>(header.flags)
                      : Code::kInternal;
      g.registry.abort(key, header.seq, Status(code, reason + " (reported by " + g.cluster.describe(src) + ")"));
      return true;
    }
    case FrameType::kP2PRequest:
      serve_request(g, src, header, key, read);
      return true;
    case FrameType::kPush:
      return receive_push(g, src, header, key, read);
    case FrameType::kPushRows:
      return receive_push_rows(g, src, header, key, read);
    default:
      return true;  // unknown frames are skipped: newer peers may send more kinds
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
