// The one generic executor behind every collective (KungFu's named collective
// states, §4.3). An op is a list of piece tasks over a single output buffer;
// each piece flows up its reduce graph (partial results are reduced into the
// buffer as messages arrive) and down its broadcast graph. The op is a state
// machine advanced by message arrivals on the transport threads, so no thread
// blocks per op and any number of ops can be in flight in any order.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster.h"
#include "dtype.h"
#include "mailbox.h"
#include "op_registry.h"
#include "topology.h"
#include "transport.h"

namespace kungfu {

using DoneCallback = std::function<void(const Status &)>;

// One piece of the output buffer and the path it takes.
struct PieceTask {
  size_t offset = 0;  // in elements
  size_t count = 0;
  const GraphPair *graph = nullptr;
  bool reduce = true;     // walk the reduce graph (otherwise the root's data is the value)
  bool broadcast = true;  // walk the broadcast graph
};

// What the executor needs from the runtime.
struct CollectiveContext {
  Mailbox &mailbox;
  Transport &transport;
  OpRegistry &registry;
  const Cluster &cluster;
  int self;
};

struct TensorDesc {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // informative (error messages); count drives the data
  size_t count = 0;            // elements in this worker's input
};

class CollectiveOp : public PendingOp, public std::enable_shared_from_this<CollectiveOp> {
 public:
  // `kind` names the collective in errors ("all_reduce"). This worker's
  // contribution is read from `in` (null: `out` already holds it) and the
  // result lands in `out`; the first contribution that arrives for a block is
  // combined with `in` straight into `out`, so the input is never copied.
  // `keepalive` owns the memory of both until every send is done.
  CollectiveOp(CollectiveContext ctx, std::string kind, std::string name, TensorDesc desc, ReduceOp op,
               TopologyKind topology, std::shared_ptr<const Topology> graphs, std::vector<PieceTask> tasks,
               const void *in, void *out, std::shared_ptr<const void> keepalive, DoneCallback done);

  // Registers the op and starts every piece.
  void start();

  void fail(const Status &why, bool tell_peers) override;
  std::string waiting_for() const override;
  bool needs(int rank) const override;
  std::string describe() const override { return kind_ + " '" + name_ + "'"; }

 private:
  // The message key of one piece: name, piece, phase and instance, so pieces
  // of another instance of the same name can never be taken for ours.
  std::string piece_key(size_t piece, char phase) const;
  // Drops what arrived or will arrive for this instance (it failed).
  void retire_instance();
  char *piece_data(size_t piece) const;
  const char *piece_input(size_t piece) const;
  // Reduces `len` bytes at `offset` within the piece (caller holds the piece lock).
  void reduce_block(size_t piece, size_t offset, const char *data, size_t len);
  size_t piece_bytes(size_t piece) const;
  void expect_from(int src, size_t piece, char phase, bool direct);
  void on_message(size_t piece, char phase, uint64_t token, const Status &s, Message &msg);
  Status check(const Message &msg, size_t piece) const;
  void reduce_complete(size_t piece);
  void broadcast_from_here(size_t piece);
  void send_to(int dst, size_t piece, char phase, const char *src);
  void finish_one();

  CollectiveContext ctx_;
  const std::string kind_;
  const std::string name_;
  const TensorDesc desc_;
  const ReduceOp op_;
  const TopologyKind topology_;
  const std::shared_ptr<const Topology> graphs_;  // keeps the tasks' graphs alive
  const std::vector<PieceTask> tasks_;
  char *const out_;
  const char *const in_;
  const size_t elem_size_;
  const std::shared_ptr<const void> keepalive_;
  DoneCallback done_;
  uint64_t instance_ = 0;  // which call of this name on this worker (OpRegistry::add_collective)

  std::atomic<int64_t> outstanding_{0};  // pieces not finished + sends not completed
  std::unique_ptr<std::mutex[]> piece_mu_;
  std::vector<int> reduce_left_;
  // Per piece, per kStreamBlock block: whether `out` already holds our input
  // combined with something (only tracked when in_ != out_).
  std::vector<std::vector<bool>> staged_;

  mutable std::mutex mu_;  // guards the fields below
  bool finished_ = false;
  struct Waiting {
    int src;
    std::string key;
    uint64_t token;
  };
  std::vector<Waiting> waiting_;
};

}  // namespace kungfu
