// One worker's view of the job: the cluster, its transport, and every
// collective, consensus and point-to-point operation. TF kernels (ops/kernels)
// call this; it knows nothing of TensorFlow. All operations are asynchronous:
// they return at once and call `done` from a runtime thread (or inline when
// nothing needs to be waited for).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "accumulator.h"
#include "collective_op.h"
#include "mailbox.h"
#include "op_registry.h"
#include "p2p_store.h"
#include "plan.h"
#include "row_store.h"
#include "topology.h"
#include "transport.h"

namespace kungfu {

struct RuntimeOptions {
  Cluster cluster;
  int self_rank = 0;
  SecretString secret;
  std::string job_id;  // this run of the job (KUNGFU_JOB_ID); connections of other runs are rejected
  // Which connections tag and verify every frame (KUNGFU_AUTHENTICATE_FRAMES:
  // unset = those between two hosts, 0 = none, 1 = all); see TransportOptions.
  FrameAuthPolicy frame_auth = FrameAuthPolicy::kAcrossHosts;
  double timeout_seconds = 120;
  TopologyKind topology = TopologyKind::kAuto;
  size_t chunk_bytes = 1 << 20;
  bool same_host_unix_sockets = true;

  // Reads KUNGFU_SELF, KUNGFU_PEERS, KUNGFU_CLUSTER_VERSION, KUNGFU_TOPOLOGY,
  // KUNGFU_TIMEOUT, KUNGFU_JOB_SECRET, KUNGFU_JOB_ID and KUNGFU_AUTHENTICATE_FRAMES. Without KUNGFU_PEERS: a one-worker cluster.
  static Status from_env(RuntimeOptions *out);
};

// A contiguous tensor: `send` is this worker's input, `recv` the output (may be
// the same memory). `keepalive` owns both until the op's last send completes.
struct Buffer {
  const void *send = nullptr;
  void *recv = nullptr;
  TensorDesc desc;
  std::shared_ptr<const void> keepalive;
};

using ConsensusCallback = std::function<void(const Status &, bool agreed)>;
// A p2p fetch's status and the version it got.
using VersionCallback = std::function<void(const Status &, uint64_t version)>;
// A fetch of a table's rows: its status and what came (see RowsReply).
using RowsDoneCallback = std::function<void(const Status &, RowsReply reply)>;

// Rows of a table: `n` row indices and the rows they name, `row_len`
// elements of `dtype` each, in a table of `num_rows` rows.
struct RowsDesc {
  DType dtype = DType::kFloat32;
  size_t num_rows = 0;
  size_t row_len = 0;
  size_t row_bytes() const { return row_len * dtype_size(dtype); }
};

class Runtime : public FrameHandler {
 public:
  static Status create(RuntimeOptions options, std::unique_ptr<Runtime> *out);
  // Shuts down (see shutdown()) and closes every connection.
  ~Runtime() override;

  // Leaves the cluster in order, once: frames already queued are written,
  // peers are told goodbye (they fail only what still waits for data from
  // us, instead of treating our exit as a crash), then operations still in
  // flight here fail and new ones are refused. Waits at most
  // min(timeout, kMaxLeaveSeconds). Safe to call from any thread while
  // kernels still run; the object stays usable (every op fails).
  void shutdown();
  static constexpr double kMaxLeaveSeconds = 10;

  int rank() const { return opt_.self_rank; }
  int size() const { return opt_.cluster.size(); }
  int local_rank() const;
  int local_size() const;
  uint32_t cluster_version() const { return opt_.cluster.version(); }
  const Cluster &cluster() const { return opt_.cluster; }
  TopologyKind topology() const { return topology_.load(); }

  void all_reduce(const std::string &name, Buffer buf, ReduceOp op, DoneCallback done);
  // Same, but on a fixed topology (control messages must not depend on the switchable one).
  void all_reduce_on(TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op, DoneCallback done);
  void broadcast(const std::string &name, Buffer buf, int root, DoneCallback done);
  void reduce(const std::string &name, Buffer buf, ReduceOp op, int root, DoneCallback done);
  // buf.recv holds size() * desc.count elements: rank r's input lands at r * count.
  void all_gather(const std::string &name, Buffer buf, DoneCallback done);
  void barrier(const std::string &name, DoneCallback done);
  // KungFu Alg. 1: true iff every worker passed the same bytes.
  void consensus(const std::string &name, std::vector<char> bytes, ConsensusCallback done);
  // Consistent topology switch: consensus on the name, switch, barrier. Every
  // worker must call it; `done` gets false if the workers disagreed.
  void set_topology(const std::string &name, TopologyKind kind, ConsensusCallback done);

  void save(const std::string &name, uint64_t version, const void *data, size_t len);
  // Fetches `name` (version or P2PStore::kLatest) saved by `peer` into dst (exactly len bytes).
  void request(int peer, const std::string &name, uint64_t version, void *dst, size_t len,
               std::shared_ptr<const void> keepalive, DoneCallback done);
  // Fetches the newest version >= min_version of `name` from `peer`, waiting
  // (on the peer, no polling) until a save makes one available; `done` gets
  // the version served. After the runtime timeout: DeadlineExceeded naming
  // the peer, the blob and min_version. For stale-synchronous clocks.
  void request_at_least(int peer, const std::string &name, uint64_t min_version, void *dst, size_t len,
                        std::shared_ptr<const void> keepalive, VersionCallback done);

  // Adds buf.send element-wise into `peer`'s accumulator `name` (asynchronous
  // parameter servers). `done` runs once the bytes are written to the
  // connection (or added, when `peer` is this worker); it does not wait for
  // the peer to add them. A dead or silent peer fails it (Unavailable /
  // DeadlineExceeded), never blocks it. Frames to a peer travel in call order
  // and the peer adds a push before it reads its next frame, so anything the
  // peer receives from us later (e.g. a barrier) comes after the push is added.
  void push(int peer, const std::string &name, Buffer buf, DoneCallback done);
  // Moves the sum pushed into `name` since the last take into dst (desc.count
  // elements of desc.dtype) and the number of those pushes into *pushes; the
  // accumulator starts again from empty. Never waits: nothing pushed gives
  // zeros and 0. InvalidArgument if a push was dropped for not matching
  // (naming its sender and both sizes) or if desc does not match.
  Status take(const std::string &name, void *dst, const TensorDesc &desc, int64_t *pushes);

  // Sparse push (asynchronous PS, sparse gradients): adds `n` rows into
  // `peer`'s table accumulator `name`, row rows[i] getting values[i * row_len
  // ...]. Only these rows travel (copied: the caller may reuse its buffers
  // at once). Same ordering and completion as push().
  void push_rows(int peer, const std::string &name, const RowsDesc &desc, size_t n, const int64_t *rows,
                 const void *values, DoneCallback done);
  // The rows pushed into table accumulator `name` since the last take
  // (ascending) and their sums; see AccumulatorStore::take_rows.
  Status take_rows(const std::string &name, const RowsDesc &desc, std::vector<int64_t> *rows,
                   std::vector<char> *values, int64_t *pushes);

  // Publishes `table` (desc.num_rows rows) as `version` of table `name`,
  // changed since the previous version in `rows` only (see RowStore).
  Status save_rows(const std::string &name, uint64_t version, const void *table, const RowsDesc &desc,
                   const int64_t *rows, size_t n);
  // Fetches from `peer` what this worker needs to bring its copy of table
  // `name` to the newest version >= min_version, waiting there (no polling)
  // until one is saved: the rows changed since the version we last received
  // from it, or the whole table the first time. After the runtime timeout:
  // DeadlineExceeded naming the peer, the table and min_version.
  void request_rows(int peer, const std::string &name, uint64_t min_version, RowsDoneCallback done);

  const TrafficCounters &counters() const { return transport_->counters(); }
  uint64_t rejected_connections() const { return transport_->rejected_connections(); }
  uint64_t authenticated_connections() const { return transport_->authenticated_connections(); }
  size_t pending_messages() const { return mailbox_.pending_messages(); }
  // request_at_least()s (ours or peers') waiting here for a save (for tests and leak checks).
  size_t parked_requests() const { return store_.waiting() + rows_.waiting(); }

  // FrameHandler
  bool on_frame(int src, const FrameHeader &header, std::string key, const PartialReader &read) override;
  void on_peer_lost(int peer, const Status &why) override;
  void on_peer_left(int peer, const Status &why) override;

 private:
  explicit Runtime(RuntimeOptions options);
  CollectiveContext context();
  // `staged`: buf.recv already holds this worker's contribution.
  void run(const std::string &kind, const std::string &name, Buffer &buf, ReduceOp op, Plan plan, bool staged,
           DoneCallback done);
  TopologyKind resolve(TopologyKind kind, size_t bytes) const;
  void fetch(int peer, const std::string &name, uint64_t version, bool at_least, void *dst, size_t len,
             std::shared_ptr<const void> keepalive, VersionCallback done);
  void serve_request(int src, const FrameHeader &header, const std::string &name, const PartialReader &read);
  bool receive_push(int src, const FrameHeader &header, const std::string &name, const PartialReader &read);
  bool receive_push_rows(int src, const FrameHeader &header, const std::string &name, const PartialReader &read);
  void serve_rows(int src, const FrameHeader &header, const std::string &name, const std::string &id);
  // Answers a request parked until `wait` calls back (or our timeout passes:
  // then a kFlagTimedOut response). `wait` registers the callback and returns
  // its token (0: it ran at once), `cancel` forgets a token.
  using Respond = std::function<void()>;
  void park(int src, const std::string &id, const std::string &what,
            const std::function<uint64_t(std::function<void(Respond)>)> &wait,
            std::function<void(uint64_t)> cancel);
  // Sends a kP2PResponse to request `id` of `src` (`dims`: the header's, for rows replies).
  void respond(int src, const std::string &id, uint8_t flags, uint64_t version, Blob blob,
               const std::vector<int64_t> &dims = {});

  RuntimeOptions opt_;
  std::atomic<TopologyKind> topology_;
  std::vector<std::shared_ptr<const Topology>> topologies_;  // indexed by TopologyKind
  Mailbox mailbox_;
  P2PStore store_;
  AccumulatorStore accumulators_;
  RowStore rows_;
  std::mutex rows_held_mu_;
  // The version of each (peer, table) we last received whole or in rows.
  std::map<std::pair<int, std::string>, uint64_t> rows_held_;
  std::unique_ptr<OpRegistry> registry_;
  std::unique_ptr<Transport> transport_;  // destroyed first: its threads call into us
  std::atomic<uint64_t> next_request_{0};
  std::once_flag shutdown_once_;
};

}  // namespace kungfu
