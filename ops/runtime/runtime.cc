#include "runtime.h"

#include <cstdlib>
#include <cstring>

namespace kungfu {

namespace {

std::string env(const char *name) {
  const char *v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Names of the internal collectives a compound operation runs; the '\x01' keeps
// them apart from any name a user can pass.
std::string sub_name(const std::string &name, const char *part) { return name + "\x01" + part; }

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
  std::string version = env("KUNGFU_CLUSTER_VERSION");
  o.cluster = Cluster(version.empty() ? 0 : static_cast<uint32_t>(std::strtoul(version.c_str(), nullptr, 10)),
                      list);
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
    char *end = nullptr;
    double t = std::strtod(timeout.c_str(), &end);
    if (*end != '\0' || t <= 0) return InvalidArgument("KUNGFU_TIMEOUT must be a positive number of seconds, got '" + timeout + "'");
    o.timeout_seconds = t;
  }
  o.secret = env("KUNGFU_JOB_SECRET");
  if (o.secret.empty() && o.cluster.size() > 1) {
    return PermissionDenied("KUNGFU_JOB_SECRET is not set: start the workers with kungfu-run, which generates it");
  }
  *out = o;
  return Status::OK();
}

Runtime::Runtime(RuntimeOptions options) : opt_(std::move(options)), topology_(opt_.topology) {
  topologies_.resize(static_cast<size_t>(TopologyKind::kAuto) + 1);
  for (TopologyKind k : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree,
                         TopologyKind::kBinaryTreeStar, TopologyKind::kClique}) {
    topologies_[static_cast<size_t>(k)] = build_topology(k, opt_.cluster);
  }
  registry_ = std::make_unique<OpRegistry>(opt_.timeout_seconds);
}

Runtime::~Runtime() { transport_.reset(); }

Status Runtime::create(RuntimeOptions options, std::unique_ptr<Runtime> *out) {
  if (options.self_rank < 0 || options.self_rank >= options.cluster.size()) {
    return InvalidArgument("self rank " + std::to_string(options.self_rank) + " outside the cluster");
  }
  std::unique_ptr<Runtime> rt(new Runtime(std::move(options)));
  if (rt->size() > 1) {
    TransportOptions t;
    t.cluster = rt->opt_.cluster;
    t.self_rank = rt->opt_.self_rank;
    t.secret = rt->opt_.secret;
    t.timeout_seconds = rt->opt_.timeout_seconds;
    t.same_host_unix_sockets = rt->opt_.same_host_unix_sockets;
    rt->transport_ = std::make_unique<Transport>(t, rt.get());
    Status s = rt->transport_->start();
    if (!s.ok()) return s;
  }
  *out = std::move(rt);
  return Status::OK();
}

int Runtime::local_rank() const {
  std::vector<int> local = opt_.cluster.local_ranks(rank());
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i] == rank()) return static_cast<int>(i);
  }
  return 0;
}

int Runtime::local_size() const { return static_cast<int>(opt_.cluster.local_ranks(rank()).size()); }

CollectiveContext Runtime::context() {
  return CollectiveContext{mailbox_, *transport_, *registry_, opt_.cluster, opt_.self_rank};
}

TopologyKind Runtime::resolve(TopologyKind kind, size_t bytes) const {
  return kind == TopologyKind::kAuto ? choose_auto(bytes, opt_.cluster) : kind;
}

void Runtime::run(const std::string &kind, const std::string &name, Buffer &buf, ReduceOp op, Plan plan, bool staged,
                  DoneCallback done) {
  auto coll = std::make_shared<CollectiveOp>(context(), kind, name, buf.desc, op, plan.kind, std::move(plan.graphs),
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
  all_reduce_on(topology(), name, std::move(buf), op, std::move(done));
}

void Runtime::all_reduce_on(TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op,
                            DoneCallback done) {
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (size() == 1) {
    stage_input(buf, bytes);
    return done(Status::OK());
  }
  TopologyKind k = resolve(kind, bytes);
  Plan plan = plan_all_reduce(buf.desc.count, dtype_size(buf.desc.dtype), topologies_[static_cast<size_t>(k)],
                              opt_.chunk_bytes);
  run("all_reduce", name, buf, op, std::move(plan), false, std::move(done));
}

void Runtime::broadcast(const std::string &name, Buffer buf, int root, DoneCallback done) {
  if (root < 0 || root >= size()) {
    return done(InvalidArgument("broadcast '" + name + "': root " + std::to_string(root) + " outside a cluster of " +
                                std::to_string(size())));
  }
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (rank() == root) stage_input(buf, bytes);
  if (size() == 1) return done(Status::OK());
  Plan plan = plan_rooted(resolve(topology(), bytes), opt_.cluster, root, buf.desc.count,
                          dtype_size(buf.desc.dtype), opt_.chunk_bytes, false, true);
  run("broadcast", name, buf, ReduceOp::kSum, std::move(plan), true, std::move(done));
}

void Runtime::reduce(const std::string &name, Buffer buf, ReduceOp op, int root, DoneCallback done) {
  if (root < 0 || root >= size()) {
    return done(InvalidArgument("reduce '" + name + "': root " + std::to_string(root) + " outside a cluster of " +
                                std::to_string(size())));
  }
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (size() == 1) {
    stage_input(buf, bytes);
    return done(Status::OK());
  }
  Plan plan = plan_rooted(resolve(topology(), bytes), opt_.cluster, root, buf.desc.count,
                          dtype_size(buf.desc.dtype), opt_.chunk_bytes, true, false);
  run("reduce", name, buf, op, std::move(plan), false, std::move(done));
}

void Runtime::all_gather(const std::string &name, Buffer buf, DoneCallback done) {
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (bytes > 0) {
    std::memcpy(static_cast<char *>(buf.recv) + static_cast<size_t>(rank()) * bytes, buf.send, bytes);
  }
  if (size() == 1) return done(Status::OK());
  Plan plan = plan_all_gather(resolve(topology(), bytes), opt_.cluster, buf.desc.count,
                              dtype_size(buf.desc.dtype), opt_.chunk_bytes);
  run("all_gather", name, buf, ReduceOp::kSum, std::move(plan), true, std::move(done));
}

void Runtime::barrier(const std::string &name, DoneCallback done) {
  auto byte = std::make_shared<uint8_t>(1);
  Buffer buf;
  buf.send = byte.get();
  buf.recv = byte.get();
  buf.desc = TensorDesc{DType::kUInt8, {1}, 1};
  buf.keepalive = byte;
  all_reduce_on(TopologyKind::kStar, name, buf, ReduceOp::kMin, std::move(done));
}

void Runtime::consensus(const std::string &name, std::vector<char> bytes, ConsensusCallback done) {
  // Alg. 1: first agree on the length (min == max), then on the bytes
  // (byte-wise min == max), then a barrier so nobody acts before all know.
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
  auto finish_with_barrier = [self, st, name, done](bool agreed) {
    self->barrier(sub_name(name, "barrier"), [done, agreed](const Status &s) { done(s, s.ok() && agreed); });
  };
  auto compare_bytes = [self, st, name, done, both, finish_with_barrier]() {
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
    self->all_reduce_on(TopologyKind::kStar, sub_name(name, "bytes_min"), lo, ReduceOp::kMin, after);
    self->all_reduce_on(TopologyKind::kStar, sub_name(name, "bytes_max"), hi, ReduceOp::kMax, after);
  };
  auto after_len = [st, done, both, compare_bytes, finish_with_barrier](const Status &s) {
    if (!both(s)) return;
    if (!st->status.ok()) return done(st->status, false);
    if (st->len_lo != st->len_hi) return finish_with_barrier(false);
    compare_bytes();
  };
  Buffer lo{&st->len_lo, &st->len_lo, TensorDesc{DType::kInt64, {1}, 1}, st};
  Buffer hi{&st->len_hi, &st->len_hi, TensorDesc{DType::kInt64, {1}, 1}, st};
  all_reduce_on(TopologyKind::kStar, sub_name(name, "len_min"), lo, ReduceOp::kMin, after_len);
  all_reduce_on(TopologyKind::kStar, sub_name(name, "len_max"), hi, ReduceOp::kMax, after_len);
}

void Runtime::set_topology(const std::string &name, TopologyKind kind, ConsensusCallback done) {
  std::string text = topology_name(kind);
  consensus(name, std::vector<char>(text.begin(), text.end()), [this, kind, name, done](const Status &s, bool agreed) {
    if (!s.ok() || !agreed) return done(s, false);
    topology_.store(kind);
    // A second barrier: nobody starts a collective on the new topology before
    // every worker has switched.
    barrier(sub_name(name, "switched"), [done](const Status &b) { done(b, b.ok()); });
  });
}

void Runtime::save(const std::string &name, uint64_t version, const void *data, size_t len) {
  auto blob = std::make_shared<std::vector<char>>(static_cast<const char *>(data),
                                                  static_cast<const char *>(data) + len);
  store_.save(name, version, std::move(blob));
}

namespace {

// A p2p request in flight, so that timeouts and dead peers fail it.
class RequestOp : public PendingOp {
 public:
  RequestOp(int rank, std::string what, std::string describe, DoneCallback done)
      : rank_(rank), what_(std::move(what)), describe_(std::move(describe)), done_(std::move(done)) {}
  void complete(const Status &s) {
    if (!finished_.exchange(true)) done_(s);
  }
  void fail(const Status &why, bool) override { complete(why); }
  std::string waiting_for() const override { return "waiting for " + describe_; }
  std::string describe() const override { return what_; }
  bool needs(int rank) const override { return rank == rank_; }
  bool finished() const { return finished_; }

 private:
  const int rank_;
  const std::string what_;
  const std::string describe_;
  DoneCallback done_;
  std::atomic<bool> finished_{false};
};

}  // namespace

void Runtime::request(int peer, const std::string &name, uint64_t version, void *dst, size_t len,
                      std::shared_ptr<const void> keepalive, DoneCallback done) {
  std::string what = "request '" + name + "' from " + opt_.cluster.describe(peer);
  if (peer < 0 || peer >= size()) return done(InvalidArgument(what + ": no such rank"));
  auto check_size = [what, len](size_t got) {
    return got == len ? Status::OK()
                      : InvalidArgument(what + ": the saved blob has " + std::to_string(got) +
                                        " bytes but the request expects " + std::to_string(len));
  };
  if (peer == rank()) {
    Blob blob = store_.get(name, version);
    if (!blob) return done(NotFound(what + ": nothing saved under that name and version"));
    Status s = check_size(blob->size());
    if (s.ok() && len > 0) std::memcpy(dst, blob->data(), len);
    return done(s);
  }
  std::string id = "p2p#" + std::to_string(rank()) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<RequestOp>(peer, what, opt_.cluster.describe(peer), std::move(done));
  Status s = registry_->add(id, op);
  if (!s.ok()) return op->complete(s);
  auto registry = registry_.get();
  mailbox_.expect(peer, id, dst, len, [op, id, registry, check_size, what, dst, keepalive](const Status &st, Message &msg) {
    registry->remove(id);
    if (!st.ok()) return op->complete(Status(st.code(), what + ": " + st.message()));
    if (msg.header.flags & kFlagNotFound) {
      return op->complete(NotFound(what + ": nothing saved under that name and version"));
    }
    Status size_ok = check_size(msg.size());
    // A response that did not land in place (it beat our expect()) is copied.
    if (size_ok.ok() && msg.direct == nullptr && msg.size() > 0) std::memcpy(dst, msg.data(), msg.size());
    op->complete(size_ok);
  });
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PRequest);
  h.seq = version;
  auto payload = std::make_shared<std::string>(id);
  transport_->send(peer, h, name, payload->data(), payload->size(), payload, [op, registry, id](const Status &st) {
    if (!st.ok()) {
      registry->remove(id);
      op->complete(st);
    }
  });
}

void Runtime::serve_request(int src, const FrameHeader &header, const std::string &name, const PartialReader &read) {
  if (header.payload_len > kMaxKeyLen) return;  // not a request id we could have sent
  std::string id(header.payload_len, '\0');
  if (!read(id.data(), id.size())) return;
  Blob blob = store_.get(name, header.seq);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kP2PResponse);
  if (!blob) {
    h.flags = kFlagNotFound;
    transport_->send(src, h, id, nullptr, 0, nullptr, [](const Status &) {});
    return;
  }
  transport_->send(src, h, id, blob->data(), blob->size(), blob, [](const Status &) {});
}

bool Runtime::on_frame(int src, const FrameHeader &header, std::string key, const PartialReader &read) {
  switch (static_cast<FrameType>(header.type)) {
    case FrameType::kCollective:
    case FrameType::kP2PResponse:
      return mailbox_.deliver(src, header, std::move(key), read);
    case FrameType::kAbort: {
      std::string reason(std::min<uint64_t>(header.payload_len, 64 * 1024), '\0');
      if (!read(reason.data(), reason.size())) return false;
      Code code = header.flags >= 1 && header.flags <= static_cast<uint8_t>(Code::kInternal)
                      ? static_cast<Code>(header.flags)
                      : Code::kInternal;
      registry_->abort(key, Status(code, reason + " (reported by " + opt_.cluster.describe(src) + ")"));
      return true;
    }
    case FrameType::kP2PRequest:
      serve_request(src, header, key, read);
      return true;
    default:
      return true;  // unknown frames are skipped: newer peers may send more kinds
  }
}

void Runtime::on_peer_lost(int peer, const Status &why) {
  mailbox_.fail_peer(peer, why);
  registry_->peer_lost(peer, why);
}

}  // namespace kungfu
