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
#include "auto_memory.h"
#include "auto_topology.h"
#include "collective_op.h"
#include "generation.h"
#include "mailbox.h"
#include "op_registry.h"
#include "p2p_store.h"
#include "plan.h"
#include "row_store.h"
#include "runtime_options.h"
#include "topology.h"
#include "transport.h"

namespace kungfu {

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

class Runtime {
 public:
  static Status create(RuntimeOptions options, std::unique_ptr<Runtime> *out);
  // Shuts down (see shutdown()) and closes every connection.
  ~Runtime();

  // Leaves the cluster in order, once: frames already queued are written,
  // peers are told goodbye (they fail only what still waits for data from
  // us, instead of treating our exit as a crash), then operations still in
  // flight here fail and new ones are refused. Waits at most
  // min(timeout, kMaxLeaveSeconds). Safe to call from any thread while
  // kernels still run; the object stays usable (every op fails).
  void shutdown();
  static constexpr double kMaxLeaveSeconds = 10;
  // Links whose orderly leave (shutdown() or update_cluster()) was still
  // unfinished at the leave deadline, over every version so far. A leave
  // that waits only on its own frames never reaches the deadline, so tests
  // tell "left on its own" from "waited until the deadline" by this count,
  // not by the clock (which a loaded machine stretches).
  uint64_t leaves_cut_by_deadline() const { return leaves_cut_by_deadline_.load(); }

  // Switches this worker to `cluster` (a newer version that contains us)
  // atomically: operations in flight on the old version fail with
  // Unavailable("... cluster changed to version N"), the old connections
  // leave in order (queued frames written, goodbyes, closed), the listening
  // port stays bound and passes to the new version, whose connections open
  // on first use (a peer that has not switched yet is retried until the
  // timeout). Rank, size, topology graphs and per-name op counters are the
  // new cluster's when this returns; the p2p store, accumulators and row
  // store are kept. InvalidArgument if the version is not newer than ours
  // or we are not in the cluster (the message names both); FailedPrecondition
  // after shutdown(). Thread-safe; concurrent calls are serialised.
  Status update_cluster(const Cluster &cluster);
  // Fails every operation in flight on the current version now (collectives
  // also tell their peers) and every new one until the next
  // update_cluster(), with Unavailable(reason). Thread-safe.
  void interrupt(const std::string &reason);
  // Members of the current version whose connection broke without a goodbye
  // (crash, reset, timeout while connecting, a refused connection to a
  // member of the previous version), in rank order. Only what this worker
  // saw: one whose op failed from a peer's abort may list nobody.
  std::vector<PeerID> lost_peers() const;
  PeerID self() const;

  int rank() const { return gen()->self_rank; }
  int size() const { return gen()->size(); }
  int local_rank() const;
  int local_size() const;
  uint32_t cluster_version() const { return gen()->cluster.version(); }
  Cluster cluster() const { return gen()->cluster; }
  TopologyKind topology() const { return topology_.load(); }
  // AUTO's measured choices on the current version, by size class
  // (auto_topology.h); empty until a probe has finished and the workers
  // agreed when it takes over (auto_choices.h), or a choice was recalled.
  std::map<int, TopologyKind> auto_choices() const { return gen()->auto_choices.measured(); }
  // Probes that timed the candidates, over every version so far: a class on
  // a layout measured before is recalled instead (auto_memory.h).
  uint64_t auto_probes_run() const { return auto_probes_.load(); }
  // AUTO all-reduces that waited for a probe to end, over every version so
  // far: only those started while the workers agree from which call on its
  // choice applies (and those a failed probe's sample held); the others run
  // on the prediction (auto_choices.h).
  uint64_t auto_calls_waited_for_probe() const { return auto_calls_waited_.load(); }
  // Samples AUTO's probes have started, over every version so far. It grows
  // while a size class of the layout is being measured (one sample after
  // each call of the class) and stops when every class that is called has
  // decided: a policy that times steps waits until it stops.
  uint64_t auto_probe_samples() const { return auto_probe_samples_.load(); }
  // Calls of a class that waited for a timed sample of its
  // probe to end (AutoChoices::sample_started).
  uint64_t auto_calls_held_for_sample() const { return auto_calls_held_.load(); }
  // Threads serving the current version's links (Transport::sender_threads,
  // receiver_threads): a worker has them only for the peers it talks to.
  size_t sender_threads() const;
  size_t receiver_threads() const;
  // Wake-ups of the current version's sender threads that found nothing to
  // send (Transport::sender_idle_wakeups).
  uint64_t sender_idle_wakeups() const;

  void all_reduce(const std::string &name, Buffer buf, ReduceOp op, DoneCallback done);
  // Same, but on a fixed topology (control messages must not depend on the switchable one).
  void all_reduce_on(TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op, DoneCallback done);
  void broadcast(const std::string &name, Buffer buf, int root, DoneCallback done);
  void reduce(const std::string &name, Buffer buf, ReduceOp op, int root, DoneCallback done);
  // buf.recv holds size() * desc.count elements: rank r's input lands at r * count.
  void all_gather(const std::string &name, Buffer buf, DoneCallback done);
  void barrier(const std::string &name, DoneCallback done);
  // Waits on the calling thread for `done()` (set by an op's callback) by
  // reading same-host peers' shared-memory rings itself, for at most a
  // short, adaptive budget (runtime_poll.cc): a small collective's frames
  // then reach it without a thread hand-off, and its callback runs here.
  // True if done() came within the budget; otherwise the receiving threads
  // carry on and the caller waits as before (never required: every op
  // completes without it). The budget shrinks to nothing while waits
  // outlast it (a host with more busy threads than cores, a large op), so a
  // loaded host does not spin; it is tried again now and then.
  bool poll_until(const std::function<bool()> &done);
  // The same with a fixed budget (tests; nothing adapts).
  bool poll_until(const std::function<bool()> &done, std::chrono::nanoseconds budget);
  // Polls for at most this long.
  static constexpr std::chrono::microseconds kPollFor{50};
  // The calling thread's current budget for poll_until() (tests).
  static std::chrono::nanoseconds poll_budget();
  // Frames taken by poll_until() on the current version (for tests).
  uint64_t polled_frames() const;
  // KungFu Alg. 1: true iff every worker passed the same bytes.
  void consensus(const std::string &name, std::vector<char> bytes, ConsensusCallback done);
  // Consistent topology switch: consensus on the name, switch, barrier. Every
  // worker must call it; `done` gets false if the workers disagreed.
  void set_topology(const std::string &name, TopologyKind kind, ConsensusCallback done);

  void save(const std::string &name, uint64_t version, const void *data, size_t len);
  // Same, keeping `blob` itself (no copy; the caller built it for the store).
  void save(const std::string &name, uint64_t version, Blob blob);
  // Drops every version of every blob, every accumulator and every table
  // whose name starts with `prefix` (a sync's state pieces once every
  // receiver has them; a replaced strategy plan's stale parameter servers).
  // Requests parked for them stay parked.
  void forget(const std::string &prefix);
  // How many blobs, accumulators and tables this worker holds (for tests and leak checks).
  size_t stored_names() const;
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
  Status take_rows(const std::string &name, const RowsDesc &desc, std::vector<int64_t> *rows, std::vector<char> *values,
                   int64_t *pushes);

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

  // The current version's transport counters (a one-worker cluster without a
  // port has none: do not call it then; traffic() is always safe).
  const TrafficCounters &counters() const { return gen()->transport->counters(); }
  struct PeerTraffic {
    uint64_t sent = 0, received = 0;
  };
  // Bytes exchanged with each rank of the current version since it began.
  std::vector<PeerTraffic> traffic() const;
  uint64_t rejected_connections() const;
  // Accepted connections still in their handshake, and those shut down to
  // free a slot for a newcomer (Transport::evict_stalled_handshake).
  size_t handshakes_in_progress() const;
  uint64_t evicted_handshakes() const;
  uint64_t authenticated_connections() const;
  // Connections of the current version, in either direction, whose frames
  // travel through shared memory.
  uint64_t shm_connections() const;
  size_t pending_messages() const { return gen()->mailbox.pending_messages(); }
  // request_at_least()s (ours or peers') waiting here for a save (for tests and leak checks).
  size_t parked_requests() const { return store_.waiting() + rows_.waiting(); }
  // Where the current version's transport hands what it reads (the frame
  // fuzzer feeds frames through it without sockets). Valid while the runtime
  // lives, also after a change (that version's frames then go nowhere).
  FrameHandler &frame_handler() const { return *gen()->handler; }

 private:
  using GenPtr = std::shared_ptr<Generation>;
  class Handler;  // the transport's FrameHandler of one generation

  // runtime.cc: generations and what their transports read.
  explicit Runtime(RuntimeOptions options);
  GenPtr gen() const;
  // A generation for `cluster` with its handler; no transport yet.
  GenPtr make_generation(const Cluster &cluster, int self_rank);
  // Gives `g` a transport on `listeners` (or freshly bound ones). `previous`:
  // the version before (null at start), whose members' ports are bound.
  Status start_transport(Generation &g, Listeners listeners, const Generation *previous);
  // What the transport of generation `g` reads.
  bool on_frame(Generation &g, int src, const FrameHeader &header, std::string key, const PartialReader &read);
  void on_peer_lost(Generation &g, int peer, const Status &why);
  void on_peer_left(Generation &g, int peer, const Status &why);

  // runtime_collectives.cc
  CollectiveContext context(Generation &g);
  // `staged`: buf.recv already holds this worker's contribution.
  void run(Generation &g, const std::string &kind, const std::string &name, Buffer &buf, ReduceOp op, Plan plan,
           bool staged, DoneCallback done);
  TopologyKind resolve(const Generation &g, TopologyKind kind, size_t bytes) const;
  // The collectives on one given generation: compound ops (consensus,
  // set_topology) run every step on the generation they started on.
  void all_reduce_in(const GenPtr &g, TopologyKind kind, const std::string &name, Buffer buf, ReduceOp op,
                     DoneCallback done);
  void barrier_in(const GenPtr &g, const std::string &name, DoneCallback done);

  // runtime_auto.cc: AUTO's probe of one size class on generation `g`
  // (auto_topology.h); `state` is the probe's progress.
  void probe_auto(const GenPtr &g, int size_class);
  // Times the candidates (no worker remembered a choice for this layout).
  void start_probe(const GenPtr &g, int size_class);
  void probe_step(const GenPtr &g, const std::shared_ptr<void> &state);
  void probe_prune(const GenPtr &g, const std::shared_ptr<void> &state);
  void probe_decide(const GenPtr &g, const std::shared_ptr<void> &state);
  void probe_switch(const GenPtr &g, const std::shared_ptr<void> &state);
  void probe_tick(const GenPtr &g, const std::shared_ptr<void> &state);
  void probe_failed(const GenPtr &g, int size_class);

  // runtime_consensus.cc
  void consensus_in(const GenPtr &g, const std::string &name, std::vector<char> bytes, ConsensusCallback done);

  // runtime_p2p.cc
  void fetch(int peer, const std::string &name, uint64_t version, bool at_least, void *dst, size_t len,
             std::shared_ptr<const void> keepalive, VersionCallback done);
  void serve_request(Generation &g, int src, const FrameHeader &header, const std::string &name,
                     const PartialReader &read);
  // Answers a request parked until `wait` calls back (or our timeout passes:
  // then a kFlagTimedOut response). `wait` registers the callback and returns
  // its token (0: it ran at once), `cancel` forgets a token.
  using Respond = std::function<void()>;
  void park(Generation &g, int src, const std::string &id, const std::string &what,
            const std::function<uint64_t(std::function<void(Respond)>)> &wait, std::function<void(uint64_t)> cancel);
  // Sends a kP2PResponse to request `id` of `src` (`dims`: the header's, for rows replies).
  void respond(Generation &g, int src, const std::string &id, uint8_t flags, uint64_t version, Blob blob,
               const std::vector<int64_t> &dims = {});

  // runtime_push.cc
  bool receive_push(Generation &g, int src, const FrameHeader &header, const std::string &name,
                    const PartialReader &read);
  bool receive_push_rows(Generation &g, int src, const FrameHeader &header, const std::string &name,
                         const PartialReader &read);

  // runtime_rows.cc
  void serve_rows(Generation &g, int src, const FrameHeader &header, const std::string &name, const std::string &id);

  const RuntimeOptions opt_;  // cluster and self_rank: those the runtime started with
  std::atomic<TopologyKind> topology_;
  P2PStore store_;
  AccumulatorStore accumulators_;
  RowStore rows_;
  std::atomic<uint64_t> next_request_{0};
  // AUTO's choices of the layouts measured so far, across versions.
  AutoMemory auto_memory_;
  std::atomic<uint64_t> auto_probes_{0};
  std::atomic<uint64_t> leaves_cut_by_deadline_{0};
  std::atomic<uint64_t> auto_calls_waited_{0};
  std::atomic<uint64_t> auto_probe_samples_{0};
  std::atomic<uint64_t> auto_calls_held_{0};
  // Advanced when an AUTO probe settles: every waiting thread's poll budget
  // starts again from full (runtime_poll.cc).
  std::atomic<uint64_t> poll_epoch_{0};

  mutable std::mutex gen_mu_;  // guards current_ (the pointer, not the object)
  GenPtr current_;
  std::mutex update_mu_;  // serialises update_cluster() and shutdown()
  bool left_ = false;     // shutdown() ran (update_mu_)
  // Swapped-out generations: kept (threads stopped) while callbacks may
  // still point into them; a few kilobytes each.
  std::vector<GenPtr> retired_;
  std::once_flag shutdown_once_;
};

}  // namespace kungfu
