// KungFu Alg. 1 (byte consensus) and the consistent topology switch built on it.
#include "runtime.h"

#include <atomic>
#include <mutex>

namespace kungfu {

namespace {

// Names of the internal collectives a compound operation runs; the '\x01' keeps
// them apart from any name a user can pass.
std::string sub_name(const std::string &name, const char *part) { return name + "\x01" + part; }

}  // namespace

void Runtime::consensus(const std::string &name, std::vector<char> bytes, ConsensusCallback done) {
  consensus_in(gen(), name, std::move(bytes), std::move(done));
}

void Runtime::consensus_in(const GenPtr &g, const std::string &name, std::vector<char> bytes, ConsensusCallback done) {
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

}  // namespace kungfu
