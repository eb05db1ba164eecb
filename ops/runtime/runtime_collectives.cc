// The collectives (all-reduce, broadcast, reduce, all-gather, barrier): each
// resolves its topology, plans its pieces (plan.h) and runs a CollectiveOp.
#include "runtime.h"

#include <cstring>

namespace kungfu {

CollectiveContext Runtime::context(Generation &g) {
  return CollectiveContext{g.mailbox, *g.transport, g.registry, g.cluster, g.self_rank};
}

TopologyKind Runtime::resolve(const Generation &g, TopologyKind kind, size_t bytes) const {
  return kind == TopologyKind::kAuto ? choose_auto(bytes, g.cluster) : kind;
}

void Runtime::run(Generation &g, const std::string &kind, const std::string &name, Buffer &buf, ReduceOp op, Plan plan,
                  bool staged, DoneCallback done) {
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

void Runtime::all_reduce_on(TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op, DoneCallback done) {
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
  const int size_class = kind == TopologyKind::kAuto ? auto_size_class(bytes) : 0;
  if (kind == TopologyKind::kAuto && opt_.auto_probes > 0 && !g->auto_choices.steady(size_class, name, &kind)) {
    // Measured AUTO: run on the class's topology for this call (predicted
    // while a probe runs, measured after, auto_choices.h); the first call
    // of the class starts the agreement (runtime_auto.cc). A decided class's
    // calls past the switch (steady) run below, as a fixed topology would.
    auto run_on = [this, g, size_class, name, buf, op, done](TopologyKind decided) {
      all_reduce_in(g, decided, name, buf, op, [g, size_class, name, done](const Status &s) {
        // Paces the class's probe before the caller learns the call ended:
        // a sample that holds the class's calls has started by then, so the
        // caller's next call of the class waits for it instead of running
        // beside it.
        g->auto_choices.call_ended(size_class, name);
        done(s);
      });
    };
    if (g->auto_choices.resolve(size_class, name, std::move(run_on))) probe_auto(g, size_class);
    return;
  }
  std::shared_ptr<const Topology> graphs = g->topology(resolve(*g, kind, bytes));
  if (!graphs) {  // retired since the check above
    refused = g->registry.closed();
    return done(Status(refused.ok() ? Code::kUnavailable : refused.code(),
                       "all_reduce '" + name + "': " + (refused.ok() ? "cluster changed" : refused.message())));
  }
  Plan plan = plan_all_reduce(buf.desc.count, dtype_size(buf.desc.dtype), std::move(graphs), opt_.chunk_bytes);
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
  Plan plan = plan_rooted(resolve(*g, topology(), bytes), g->cluster, root, buf.desc.count, dtype_size(buf.desc.dtype),
                          opt_.chunk_bytes, false, true);
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
  Plan plan = plan_rooted(resolve(*g, topology(), bytes), g->cluster, root, buf.desc.count, dtype_size(buf.desc.dtype),
                          opt_.chunk_bytes, true, false);
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
  Plan plan = plan_all_gather(resolve(*g, topology(), bytes), g->cluster, buf.desc.count, dtype_size(buf.desc.dtype),
                              opt_.chunk_bytes);
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

}  // namespace kungfu
