// Persistent, authenticated connections between the workers of one cluster.
//
// Every ordered pair of peers has one outgoing connection (opened lazily by the
// sender, retried until the timeout while the other side starts up) over which
// frames travel in FIFO order. Same-host peers use a Unix domain socket, which
// is faster than loopback TCP. A connection is accepted only after the client
// proves it holds the job secret (handshake.h); anything else is dropped
// without disturbing the job.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "frame.h"
#include "mailbox.h"
#include "secret.h"
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
};

using SendCallback = std::function<void(const Status &)>;

struct TransportOptions {
  Cluster cluster;
  int self_rank = 0;
  SecretString secret;
  std::string job_id;  // with the cluster version, every handshake binds a connection to it
  double timeout_seconds = 120;  // connect retries and handshakes give up after this
  bool same_host_unix_sockets = true;
};

class Transport {
 public:
  Transport(TransportOptions options, FrameHandler *handler);
  ~Transport();
  Transport(const Transport &) = delete;
  Transport &operator=(const Transport &) = delete;

  // Binds the listeners and starts accepting. Fails if the port is taken.
  Status start();

  // Sends header + key + payload to `dst` (never self). `data` must stay valid
  // until `on_sent` runs; `keepalive` is released after that. Frames to one
  // peer are written in call order. Small frames on an idle link are written
  // inline by the calling thread (lower latency); others by the peer's sender thread.
  void send(int dst, FrameHeader header, std::string key, const void *data, size_t len,
            std::shared_ptr<const void> keepalive, SendCallback on_sent);

  const TrafficCounters &counters() const { return counters_; }
  const Cluster &cluster() const { return opt_.cluster; }
  int self_rank() const { return opt_.self_rank; }
  // Rejected connection attempts (bad secret, garbage, unknown peer).
  uint64_t rejected_connections() const { return rejected_.load(); }

 private:
  struct SendItem {
    FrameHeader header;
    std::string key;
    const void *data;
    size_t len;
    std::shared_ptr<const void> keepalive;
    SendCallback on_sent;
  };
  struct Link {  // our outgoing connection to one peer
    std::mutex mu;
    std::condition_variable cv;
    std::deque<SendItem> queue;
    Fd fd;
    bool busy = false;  // a frame is being written right now
    Status broken;      // once set, every send fails with it
    std::thread sender;
  };

  void accept_loop();
  void serve_connection(Fd fd, bool is_unix);
  void sender_loop(int dst);
  Status connect_to(int dst, Fd *out);
  Status write_frame(int dst, int fd, SendItem &item);
  // Writes `item` with the link marked busy; `lock` (held on entry) is released.
  void write_exclusively(int dst, Link &link, std::unique_lock<std::mutex> &lock, SendItem &item);
  void break_link(int dst, const Status &why);

  TransportOptions opt_;
  FrameHandler *handler_;
  TrafficCounters counters_;
  std::vector<std::unique_ptr<Link>> links_;
  Fd tcp_listener_;
  Fd unix_listener_;
  Fd wake_read_, wake_write_;
  std::thread acceptor_;
  std::mutex conn_mu_;
  std::vector<std::thread> receivers_;
  std::vector<int> open_incoming_;  // fds to shut down on stop
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace kungfu
