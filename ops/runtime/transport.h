// Persistent, authenticated connections between the workers of one cluster.
//
// Every ordered pair of peers that talks has one outgoing connection (opened
// by the link's sender thread, which starts with the link's first frame, so a
// worker holds threads and descriptors only for the peers its topologies
// use; retried until the timeout while the other side starts up) over which
// frames travel in FIFO order. Same-host peers use a Unix domain socket, which
// is faster than loopback TCP, and, once its handshake is done, move its
// frames into a shared-memory ring (shm_ring.h) that the dialer hands over
// on that socket; the socket stays open so that either side's end is seen
// at once. A thread waiting for a small collective may read those rings
// itself (poll_rings, transport_poll.cc) instead of waiting for the
// connection's receiving thread to hand it the frames. A connection is
// accepted only after the client
// proves it holds the job secret (handshake.h); anything else is dropped
// without disturbing the job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "frame.h"
#include "frame_auth.h"
#include "handshake.h"
#include "mailbox.h"
#include "rate_limited_log.h"
#include "secret.h"
#include "shm_ring.h"
#include "socket_io.h"
#include "status.h"
#include "traffic_counters.h"

namespace kungfu {

// Receives what the transport reads. Implemented by the runtime.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // Called on a receiving thread for every frame. The handler reads as much of
  // the payload as it wants through `read`, in order; the transport skips the
  // rest. Returns false if reading failed.
  virtual bool on_frame(int src, const FrameHeader &header, std::string key, const PartialReader &read) = 0;
  // The connection from or to `peer` broke; pending work that needs it must fail.
  virtual void on_peer_lost(int peer, const Status &why) = 0;
  // `peer` said goodbye: it has sent everything it will ever send us. Only
  // work that still waits for data from it must fail.
  virtual void on_peer_left(int peer, const Status &why) = 0;
};

using SendCallback = std::function<void(const Status &)>;

struct TransportOptions {
  Cluster cluster;
  int self_rank = 0;
  SecretString secret;
  std::string job_id;  // with the cluster version, every handshake binds a connection to it
  // Which connections carry a 16-byte tag on every frame (frame_auth.h),
  // keyed by the connection's session key: a tampered, replayed, reordered
  // or injected frame breaks the connection instead of being used. Decided
  // per connection (by default: those joining two hosts), agreed in its
  // handshake. Costs an AES-GMAC pass over every byte on each side (make
  // bench-frame-auth); large frames still stream, verified per 128 KiB
  // segment before anything reads it.
  FrameAuthPolicy frame_auth = FrameAuthPolicy::kAcrossHosts;
  double timeout_seconds = 120;  // connect retries and handshakes give up after this
  bool same_host_unix_sockets = true;
  // Same-host connections carry their frames through a shared-memory ring
  // (KUNGFU_SHM, default on; needs same_host_unix_sockets). Not for a
  // connection that authenticates its frames: those stay on the socket.
  bool same_host_shm = true;
  // By rank: peers whose port is known to be bound (members of the previous
  // cluster version; a port stays bound across changes). A refused
  // connection to one is a dead process, reported at once instead of
  // retried until the timeout as for a peer that may still be starting.
  std::vector<bool> listening;
};

// The bound, listening sockets of one worker's port (TCP, and the same-host
// Unix socket). A cluster change hands them from one transport to the next,
// so the port never closes: peers that connect meanwhile wait in the backlog.
struct Listeners {
  Fd tcp;
  Fd unix_socket;
  bool valid() const { return tcp.valid(); }
};

class Transport {
 public:
  Transport(TransportOptions options, FrameHandler *handler);
  // stop()s.
  ~Transport();
  Transport(const Transport &) = delete;
  Transport &operator=(const Transport &) = delete;

  // Starts accepting on `inherited` (from release_listeners() of the
  // previous cluster version's transport), or binds the listeners when there
  // are none. Fails if the port is taken.
  Status start(Listeners inherited = Listeners());

  // Stops accepting and hands the listening sockets over (once). Connections
  // already accepted are still served until stop().
  Listeners release_listeners();

  // Joins every thread and closes every connection; afterwards send() fails
  // at once with `why` and the handler is never called again. Idempotent;
  // never call it from a thread of this transport.
  void stop(const Status &why);

  // Orderly leave: every frame already handed to send() is written, then each
  // peer we are connected to gets a goodbye and the end of our stream, so it
  // can tell this from a crash. Waits until then or `deadline`, whichever
  // comes first; later sends fail. The destructor then closes everything.
  // On a cluster change a link still dialing its peer is not waited for
  // (its frames are of ops that fail with the change).
  // `next_version`: we move on to that cluster version (0: we leave the
  // job); the goodbye says so, for the peers' error messages.
  // Returns how many links were still unfinished at `deadline` (0 when every
  // peer was done with in time: what a leave should cost is its own frames,
  // never the deadline).
  int leave(std::chrono::steady_clock::time_point deadline, uint32_t next_version = 0);

  // Sends header + key + payload to `dst` (never self). `data` must stay valid
  // until `on_sent` runs; `keepalive` is released after that. Frames to one
  // peer are written in call order. Small frames on an idle link are written
  // inline by the calling thread (lower latency) as far as the socket takes
  // them without blocking; everything else by the peer's sender thread, so
  // the caller never waits on the network.
  void send(int dst, FrameHeader header, std::string key, const void *data, size_t len,
            std::shared_ptr<const void> keepalive, SendCallback on_sent);

  const TrafficCounters &counters() const { return counters_; }
  const Cluster &cluster() const { return opt_.cluster; }
  int self_rank() const { return opt_.self_rank; }
  // Rejected connection attempts (bad secret, garbage, unknown peer, or
  // dropped because too many were already in their handshake).
  uint64_t rejected_connections() const { return rejected_.load(); }
  // Connections, in either direction, whose frames are authenticated.
  uint64_t authenticated_connections() const { return authenticated_.load(); }
  // Connections, in either direction, whose frames travel through a
  // shared-memory ring.
  uint64_t shm_connections() const { return shm_.load(); }

  // Reads, on the calling thread, the frames that same-host peers sent
  // through shared memory, until `done()` or `budget` passes: a caller
  // waiting for a small collective takes its frames (and runs what they
  // complete, its own callback included) without the hand-off through the
  // connection's receiving thread and its wake-up. Only whole frames that
  // are waiting in a ring are taken, in order, with the same checks as the
  // receiving thread makes; the first frame it does not take (still
  // arriving, a goodbye, another cluster version, a bad header) and every
  // frame behind it stay for that thread, which is woken for them
  // (transport_poll.cc). Returns done().
  bool poll_rings(const std::function<bool()> &done, std::chrono::nanoseconds budget);
  // Frames poll_rings() handed on (for tests: proves the path was taken).
  uint64_t polled_frames() const { return polled_frames_.load(); }

  // At most this many accepted connections may be in their handshake at
  // once; more are closed at once. A cluster's own peers connect once each
  // (and retry), so only a flood of strangers ever reaches it.
  static constexpr size_t kMaxHandshakes = 64;
  // A peer of the job answers the server's hello within a round trip; a
  // connection still in its handshake after this long, when all slots are
  // taken, yields its slot to the newcomer (slow-loris strangers cannot hold
  // every slot for the whole handshake timeout and lock the job's peers out).
  static constexpr double kEvictAfterSeconds = 1.0;
  // The listeners' accept queues: a burst of connections while the acceptor
  // is descheduled fits in the queue instead of having its SYNs dropped
  // (a dropped SYN costs the connecting peer a 1 s retransmission).
  static constexpr int kListenBacklog = 4096;
  static constexpr int kAcceptBurst = 256;
  // Handshake slots taken now (for tests and diagnostics).
  size_t handshakes_in_progress();
  // Threads serving links, for tests and diagnostics: sender threads started
  // (one per peer we have sent to: they start with a link's first frame),
  // and accepted connections being served (one thread each, a peer that
  // has sent to us, or a stranger still in its handshake).
  size_t sender_threads() const { return senders_started_.load(); }
  // Times a sender thread was woken and found nothing to do: a notification
  // nobody needed (each costs the notifier a futex wake-up and the thread a
  // context switch), or, rarely, a spurious wake-up.
  uint64_t sender_idle_wakeups() const { return sender_idle_wakeups_.load(); }
  size_t receiver_threads();
  // Connections shut down by evict_stalled_handshake().
  uint64_t evicted_handshakes() const { return evicted_.load(); }

 private:
  struct SendItem {
    FrameHeader header;
    std::string key;
    const void *data;
    size_t len;
    std::shared_ptr<const void> keepalive;
    SendCallback on_sent;
    size_t written = 0;          // bytes of the frame on the wire (tags included) already sent
    bool authenticated = false;  // set by the first write on a link that authenticates frames
    // The tag of segment signed_segments - 1 (frame_auth.h), computed just
    // before that segment's first byte is written.
    FrameAuthenticator::Tag tag{};
    uint64_t signed_segments = 0;
  };
  // Bytes of `item` on the wire: header, key, payload and, once known to be
  // authenticated, one tag per segment.
  static size_t frame_bytes(const SendItem &item) {
    return sizeof(item.header) + item.key.size() + item.len +
           (item.authenticated ? FrameAuthenticator::segments(item.len) * FrameAuthenticator::kTagLen : 0);
  }
  struct Link {  // our outgoing connection to one peer
    std::mutex mu;
    std::condition_variable cv;
    std::deque<SendItem> queue;
    Fd fd;
    std::unique_ptr<FrameAuthenticator> auth;  // with fd, when its frames are authenticated
    std::unique_ptr<ShmRing> ring;             // with fd, when its frames go through shared memory
    bool busy = false;                         // a frame is being written right now
    Status broken;                             // once set, every send fails with it
    bool closing = false;                      // we are leaving: our goodbye is queued, nothing may follow it
    bool goodbye_written = false;
    std::thread sender;     // started by the link's first frame; guarded by mu until stop()
    void *order = nullptr;  // socket_order_key of this connection; set once, in the constructor
    int connecting = -1;    // the socket connect_to() is dialing (not owned); stop() shuts it down
  };

  // An accepted connection and the thread serving it; reaped (joined) by
  // the acceptor once `done`, so finished threads never pile up.
  struct Connection {
    std::thread thread;
    int fd = -1;  // owned by the thread; shut down from outside on stop
    std::atomic<bool> done{false};
    // Guarded by conn_mu_: still proving itself, since when (the oldest
    // stalled one is evicted when the handshake slots are full).
    bool proving = true;
    bool evicted = false;
    std::chrono::steady_clock::time_point accepted;
  };

  // transport.cc
  Status bind_listeners();
  // Wakes the acceptor and joins it.
  void stop_accepting();
  // Our side of the handshake of a connection that does (not) join two hosts.
  HandshakeIdentity identity(bool across_hosts) const;
  // Counts a connection that authenticates its frames; the first one under
  // the default policy is logged, so a job shows that it pays for them.
  void note_authenticated_connection();

  // transport_accept.cc
  void accept_loop();
  // Accepts every connection pending on `listener` (non-blocking, at most
  // kAcceptBurst per wake-up so one listener cannot starve the other).
  void accept_pending(int listener, bool is_unix);
  // Takes one accepted connection: starts its handshake thread, or drops it
  // when the handshake slots are full and none can be evicted.
  void admit(Fd fd, bool is_unix);
  // With conn_mu_ held and every slot taken: shuts down the connection that
  // has been proving itself longest if that is over kEvictAfterSeconds (a
  // stranger that connected and says nothing). True if one was evicted.
  bool evict_stalled_handshake();
  // Joins the threads of finished connections.
  void reap_connections();

  // The reading side of an accepted connection's ring, shared by the
  // connection's receiving thread and the threads in poll_rings(): `mu` is
  // held by whichever of them reads a frame, from its header to its last
  // byte, so frames are taken whole and in order.
  struct RingReader {
    RingReader(int src, int fd, void *order, std::unique_ptr<ShmRing> ring)
        : src(src), fd(fd), order(order), ring(std::move(ring)) {}
    const int src;
    const int fd;  // the connection's socket (owned by its thread; valid while !closed)
    void *const order;
    const std::unique_ptr<ShmRing> ring;
    std::mutex mu;
    bool closed = false;  // (mu) the receiving thread ended: nobody may hand on frames
    std::string broken;   // (mu) why a polled frame broke the connection
  };

  // transport_receive.cc
  void serve_connection(Fd fd, Connection *conn);

  // transport_poll.cc
  // Takes the frame at the head of `r`'s ring if it is whole and for us;
  // true if it did. One it leaves wakes the receiving thread, once per
  // frame: `*left_at` is the ring position the last wake-up was for.
  bool poll_ring(RingReader &r, uint64_t *left_at);
  void add_ring_reader(const std::shared_ptr<RingReader> &r);
  void remove_ring_reader(const RingReader *r);

  // transport_connect.cc
  // Opens our connection to `dst`. A peer still at an older cluster version
  // (it has not switched yet) is retried until the timeout; *moved_on is set
  // when the peer is at a newer version: it will never again talk at ours.
  Status connect_to(int dst, Fd *out, std::unique_ptr<FrameAuthenticator> *auth, std::unique_ptr<ShmRing> *ring,
                    bool *moved_on);
  // After the handshake of a same-host connection: a ring for its frames,
  // handed to the peer (null, and the socket carries the frames, when
  // shared memory is off or cannot be had here).
  Status offer_shm_ring(int dst, int fd, std::unique_ptr<ShmRing> *ring);

  // transport_send.cc
  // With link.mu held: starts the link's sender thread (its first frame).
  Status start_sender(int dst, Link &link);
  void sender_loop(int dst);
  // Writes what is left of `item`. `wait`: until all is written (or the
  // send timeout passes with no progress); otherwise only what fits in the
  // socket now, never blocking.
  Status write_frame(int dst, int fd, FrameAuthenticator *auth, SendItem &item, bool wait);
  // The same into a link's shared-memory ring (transport_shm.cc); `fd` is
  // the socket beside it, watched for the peer's end.
  Status write_frame_to_ring(int dst, int fd, ShmRing &ring, SendItem &item, bool wait);
  // Writes `item` with the link marked busy; `lock` (held on entry) is
  // released. An item not written whole (only when !wait) goes back to the
  // front of the queue.
  void write_exclusively(int dst, Link &link, std::unique_lock<std::mutex> &lock, SendItem &item, bool wait);
  void break_link(int dst, const Status &why);
  // The peer said goodbye: sends to it fail from now on, and our stream to it ends.
  void peer_departed(int dst, const Status &why);

  TransportOptions opt_;
  FrameHandler *handler_;
  TrafficCounters counters_;
  std::vector<std::unique_ptr<Link>> links_;
  Fd tcp_listener_;
  Fd unix_listener_;
  Fd wake_read_, wake_write_;
  std::thread acceptor_;
  std::mutex conn_mu_;  // guards the two below
  std::list<std::unique_ptr<Connection>> connections_;
  size_t handshaking_ = 0;  // accepted connections not yet authenticated
  RateLimitedLog rejections_log_{std::chrono::seconds(10), 20};
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;  // serialises stop() and release_listeners()
  bool stopped_ = false;
  std::atomic<bool> leaving_{false};  // leave() began: peers closing on us is expected
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> authenticated_{0};
  std::atomic<uint64_t> shm_{0};
  std::atomic<size_t> senders_started_{0};
  std::atomic<uint64_t> sender_idle_wakeups_{0};
  std::atomic<uint64_t> polled_frames_{0};
  std::mutex rings_mu_;  // guards rings_
  std::vector<std::shared_ptr<RingReader>> rings_;
  std::atomic<bool> shm_unavailable_logged_{false};
};

}  // namespace kungfu
