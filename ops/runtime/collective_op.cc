#include "collective_op.h"

#include <cstring>
#include <sstream>

namespace kungfu {

namespace {

std::string shape_text(DType dt, const int64_t *dims, size_t ndims) {
  std::ostringstream os;
  os << dtype_name(dt) << "[";
  for (size_t i = 0; i < ndims; ++i) os << (i ? "," : "") << dims[i];
  os << "]";
  return os.str();
}

}  // namespace

CollectiveOp::CollectiveOp(CollectiveContext ctx, std::string kind, std::string name, TensorDesc desc, ReduceOp op,
                           TopologyKind topology, std::shared_ptr<const Topology> graphs, std::vector<PieceTask> tasks,
                           const void *in, void *out, std::shared_ptr<const void> keepalive, DoneCallback done)
    : ctx_(ctx),
      kind_(std::move(kind)),
      name_(std::move(name)),
      desc_(std::move(desc)),
      op_(op),
      topology_(topology),
      graphs_(std::move(graphs)),
      tasks_(std::move(tasks)),
      out_(static_cast<char *>(out)),
      in_(in ? static_cast<const char *>(in) : static_cast<const char *>(out)),
      elem_size_(dtype_size(desc_.dtype)),
      keepalive_(std::move(keepalive)),
      done_(std::move(done)),
      piece_mu_(new std::mutex[tasks_.size()]),
      reduce_left_(tasks_.size(), 0) {
  if (in_ != out_) {
    staged_.resize(tasks_.size());
    for (size_t p = 0; p < tasks_.size(); ++p) {
      if (tasks_[p].reduce) staged_[p].assign((piece_bytes(p) + kStreamBlock - 1) / kStreamBlock, false);
    }
  }
}

std::string CollectiveOp::piece_key(size_t piece, char phase) const {
  std::string k = name_;
  k.push_back('#');
  k += std::to_string(piece);
  k.push_back(phase);
  k.push_back('@');
  k += std::to_string(instance_);
  return k;
}

void CollectiveOp::retire_instance() { ctx_.mailbox.retire(name_, instance_); }

char *CollectiveOp::piece_data(size_t piece) const { return out_ + tasks_[piece].offset * elem_size_; }
const char *CollectiveOp::piece_input(size_t piece) const { return in_ + tasks_[piece].offset * elem_size_; }

void CollectiveOp::reduce_block(size_t piece, size_t offset, const char *data, size_t len) {
  char *out = piece_data(piece) + offset;
  size_t count = len / elem_size_;
  if (in_ != out_) {
    std::vector<bool> &staged = staged_[piece];
    size_t b = offset / kStreamBlock;
    if (!staged[b]) {
      staged[b] = true;
      reduce_to(out, piece_input(piece) + offset, data, count, desc_.dtype, op_);
      return;
    }
  }
  reduce_inplace(out, data, count, desc_.dtype, op_);
}
size_t CollectiveOp::piece_bytes(size_t piece) const { return tasks_[piece].count * elem_size_; }

void CollectiveOp::start() {
  Status s = ctx_.registry.add_collective(name_, shared_from_this(), &instance_);
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    if (instance_ != 0) retire_instance();  // peers may have sent pieces of it already
    done_(s);
    return;
  }
  // Every piece counts until it is finished; sends are added as they are issued.
  outstanding_ = static_cast<int64_t>(tasks_.size()) + 1;
  for (size_t p = 0; p < tasks_.size(); ++p) {
    const PieceTask &t = tasks_[p];
    const int self = ctx_.self;
    if (t.reduce) {
      const std::vector<int> &prevs = t.graph->reduce.prevs(self);
      reduce_left_[p] = static_cast<int>(prevs.size());
      if (prevs.empty()) {
        reduce_complete(p);
      } else {
        for (int src : prevs) expect_from(src, p, 'r', false);
      }
    } else if (t.broadcast) {
      if (t.graph->root == self) {
        broadcast_from_here(p);
      } else {
        expect_from(t.graph->broadcast.prevs(self).at(0), p, 'b', true);
      }
    }
  }
  finish_one();  // the +1 above: no piece can complete the op while we are still starting
}

void CollectiveOp::expect_from(int src, size_t piece, char phase, bool direct) {
  std::string key = piece_key(piece, phase);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    waiting_.push_back(Waiting{src, key, 0});
  }
  auto self = shared_from_this();
  // The callback may run before expect() returns (message already here), so the
  // token is filled in afterwards and on_message matches entries by (src, key).
  MessageCallback cb = [self, piece, phase](const Status &s, Message &msg) {
    self->on_message(piece, phase, 0, s, msg);
  };
  uint64_t token;
  if (direct) {
    token = ctx_.mailbox.expect(src, key, piece_data(piece), piece_bytes(piece), std::move(cb));
  } else {
    // Reduce each block as it comes off the socket, while it is still in cache.
    BlockSink sink = [self, piece](const char *block, size_t offset, size_t len) {
      std::lock_guard<std::mutex> lock(self->piece_mu_[piece]);
      self->reduce_block(piece, offset, block, len);
    };
    token = ctx_.mailbox.expect_stream(src, key, piece_bytes(piece), std::move(sink), std::move(cb));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Waiting &w : waiting_) {
    if (w.src == src && w.key == key) w.token = token;
  }
}

Status CollectiveOp::check(const Message &msg, size_t piece) const {
  const FrameHeader &h = msg.header;
  if (h.type != static_cast<uint8_t>(FrameType::kCollective)) {
    return Internal("unexpected frame type for '" + msg.key + "'");
  }
  // Topology first: another topology cuts the buffer into other pieces, so
  // a size check would blame the tensors for what is a topology mismatch.
  if (h.topology != static_cast<uint8_t>(topology_)) {
    return FailedPrecondition(kind_ + " '" + name_ + "': " + ctx_.cluster.describe(ctx_.self) + " used topology " +
                              topology_name(topology_) + " but " + ctx_.cluster.describe(msg.src) + " used " +
                              topology_name(static_cast<TopologyKind>(h.topology)) +
                              "; every worker must use the same topology for a collective (a per-call topology "
                              "must agree, and set_topology must not race with collectives of the same name)");
  }
  bool same_shape = h.dtype == static_cast<uint8_t>(desc_.dtype) && h.ndims == desc_.shape.size() &&
                    std::equal(desc_.shape.begin(), desc_.shape.end(), h.dims);
  if (!same_shape || h.payload_len != piece_bytes(piece)) {
    std::string theirs = dtype_valid(h.dtype) ? shape_text(static_cast<DType>(h.dtype), h.dims, h.ndims)
                                              : std::string("<bad dtype>");
    return InvalidArgument(kind_ + " '" + name_ +
                           "': tensors differ across workers: " + ctx_.cluster.describe(ctx_.self) + " has " +
                           shape_text(desc_.dtype, desc_.shape.data(), desc_.shape.size()) + ", " +
                           ctx_.cluster.describe(msg.src) + " has " + theirs);
  }
  return Status::OK();
}

void CollectiveOp::on_message(size_t piece, char phase, uint64_t, const Status &s, Message &msg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->src == msg.src && it->key == msg.key) {
        waiting_.erase(it);
        break;
      }
    }
  }
  if (!s.ok()) {
    // Tell everyone: ranks that never talk to the lost peer would otherwise
    // wait for the whole timeout.
    fail(Status(s.code(), describe() + ": " + s.message()), true);
    return;
  }
  Status valid = check(msg, piece);
  if (!valid.ok()) {
    fail(valid, true);
    return;
  }
  if (phase == 'r') {
    bool complete;
    {
      std::lock_guard<std::mutex> lock(piece_mu_[piece]);
      if (!msg.streamed) {
        size_t bytes = piece_bytes(piece);
        for (size_t off = 0; off < bytes; off += kStreamBlock) {
          reduce_block(piece, off, msg.data() + off, std::min(kStreamBlock, bytes - off));
        }
      }
      complete = --reduce_left_[piece] == 0;
    }
    if (complete) reduce_complete(piece);
  } else {
    if (msg.direct == nullptr && piece_bytes(piece) > 0) std::memcpy(piece_data(piece), msg.data(), piece_bytes(piece));
    broadcast_from_here(piece);
  }
}

void CollectiveOp::reduce_complete(size_t piece) {
  const PieceTask &t = tasks_[piece];
  const std::vector<int> &nexts = t.graph->reduce.nexts(ctx_.self);
  if (!nexts.empty()) {
    // A leaf of the reduce graph forwards its own input; others their partial result.
    bool leaf = t.graph->reduce.prevs(ctx_.self).empty();
    send_to(nexts[0], piece, 'r', leaf ? piece_input(piece) : piece_data(piece));
    if (t.broadcast) {
      expect_from(t.graph->broadcast.prevs(ctx_.self).at(0), piece, 'b', true);
    } else {
      finish_one();
    }
    return;
  }
  // We are the root of this piece: the reduction is complete here.
  if (t.broadcast) {
    broadcast_from_here(piece);
  } else {
    finish_one();
  }
}

void CollectiveOp::broadcast_from_here(size_t piece) {
  for (int dst : tasks_[piece].graph->broadcast.nexts(ctx_.self)) send_to(dst, piece, 'b', piece_data(piece));
  finish_one();
}

void CollectiveOp::send_to(int dst, size_t piece, char phase, const char *src) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kCollective);
  h.dtype = static_cast<uint8_t>(desc_.dtype);
  h.topology = static_cast<uint8_t>(topology_);
  h.ndims = static_cast<uint32_t>(std::min<size_t>(desc_.shape.size(), kMaxDims));
  for (uint32_t i = 0; i < h.ndims; ++i) h.dims[i] = desc_.shape[i];
  h.seq = instance_;
  outstanding_.fetch_add(1);
  auto self = shared_from_this();
  ctx_.transport.send(dst, h, piece_key(piece, phase), src, piece_bytes(piece), self, [self](const Status &s) {
    if (!s.ok()) {
      self->fail(Status(s.code(), self->describe() + ": " + s.message()), true);
    }
    self->finish_one();
  });
}

void CollectiveOp::finish_one() {
  if (outstanding_.fetch_sub(1) != 1) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  ctx_.registry.remove(name_, instance_);
  done_(Status::OK());
}

void CollectiveOp::fail(const Status &why, bool tell_peers) {
  std::vector<Waiting> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    waiting.swap(waiting_);
  }
  for (const Waiting &w : waiting) ctx_.mailbox.cancel(w.src, w.key, w.token);
  ctx_.registry.remove(name_, instance_);
  retire_instance();
  if (tell_peers) {
    auto reason = std::make_shared<std::string>(why.message());
    FrameHeader h;
    h.type = static_cast<uint8_t>(FrameType::kAbort);
    h.flags = static_cast<uint8_t>(why.code());
    h.seq = instance_;
    for (int r = 0; r < ctx_.cluster.size(); ++r) {
      if (r != ctx_.self) {
        ctx_.transport.send(r, h, name_, reason->data(), reason->size(), reason, [](const Status &) {});
      }
    }
  }
  done_(why);
}

std::string CollectiveOp::waiting_for() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> seen(ctx_.cluster.size(), false);
  std::string out;
  for (const Waiting &w : waiting_) {
    if (seen[w.src]) continue;
    seen[w.src] = true;
    out += (out.empty() ? "" : ", ") + ctx_.cluster.describe(w.src);
  }
  return out.empty() ? std::string("while sending") : "waiting for " + out;
}

bool CollectiveOp::needs(int) const {
  // Every piece's result depends on every rank's contribution, so losing any
  // peer dooms the op even if we never talk to that peer directly.
  return true;
}

}  // namespace kungfu
