// Named-message rendezvous (KungFu's named collective messages, §4.3). A
// consumer *expects* the next message from a given peer under a key; the
// receiving thread *delivers* messages. Whichever comes first waits for the
// other, so workers may issue collectives in any order with no coordinator.
// When the consumer is already waiting with a buffer of the right size, the
// payload is read from the socket straight into that buffer (no copy).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "buffer_pool.h"
#include "frame.h"
#include "status.h"

namespace kungfu {

struct Message {
  int src = -1;
  FrameHeader header;
  std::string key;
  // Payload: either `owned` or the expectation's buffer (data() says which).
  PooledBuffer owned;
  const char *direct = nullptr;
  // The payload was already handed to the expectation's BlockSink.
  bool streamed = false;

  const char *data() const { return direct ? direct : owned.data(); }
  size_t size() const { return header.payload_len; }
};

// Called exactly once per expectation: with the message, or with an error when
// the peer is lost or the expectation is cancelled. Runs on the receiving
// thread or on the thread that called expect().
using MessageCallback = std::function<void(const Status &, Message &)>;

// Reads the next `len` bytes of the current frame's payload into `dst`.
using PartialReader = std::function<bool(void *dst, size_t len)>;

// Reads a `len`-byte payload into a pooled buffer. The buffer grows as the
// bytes arrive (at most kEagerPayloadBytes, then doubling), so a header that
// claims more than the peer sends never makes us allocate what it claims.
// False if reading failed.
constexpr size_t kEagerPayloadBytes = size_t(64) << 20;
bool read_payload(const PartialReader &read, uint64_t len, PooledBuffer *out);

// Consumes a payload block by block as it comes off the socket: `offset` and
// `len` are in bytes. Lets a reduction run on cache-hot data instead of first
// landing the whole payload in memory.
using BlockSink = std::function<void(const char *block, size_t offset, size_t len)>;

// Streamed payloads arrive in blocks of this size (the last may be shorter):
// small enough to stay in L2 while reduced, large enough to amortise syscalls.
constexpr size_t kStreamBlock = 128 * 1024;

class Mailbox {
 public:
  // Registers interest in the next message from `src` under `key`. If `dst` is
  // not null and the payload has exactly `dst_size` bytes, it lands in `dst`.
  // Returns a token for cancel().
  uint64_t expect(int src, const std::string &key, void *dst, size_t dst_size, MessageCallback cb);
  // Like expect(), but a payload of exactly `size` bytes that arrives while we
  // wait is fed to `sink` block by block (then msg.streamed is true); one that
  // arrived earlier is delivered whole.
  uint64_t expect_stream(int src, const std::string &key, size_t size, BlockSink sink, MessageCallback cb);
  // Removes a waiting expectation (its callback is not called). False if it
  // already fired.
  bool cancel(int src, const std::string &key, uint64_t token);

  // Receiving side. Reads the payload through `read` into the right place and
  // hands the message over. Returns false if the read failed (connection lost).
  bool deliver(int src, const FrameHeader &header, std::string key, const PartialReader &read);

  // Instance `instance` (and every earlier one) of collective `op_name`
  // failed here: its pieces already queued are dropped, and so are those that
  // arrive later, so the next instance of the name never consumes them. A
  // collective piece's key is "<op_name>#<piece><phase>@<instance>" and its
  // header.seq the instance.
  void retire(const std::string &op_name, uint64_t instance);

  // Fails every current and future expectation from `src` (peer died).
  void fail_peer(int src, const Status &why);
  // Forgets that `src` failed (a new incarnation connected after a resize).
  void revive_peer(int src);
  // For good (a retired cluster version): fails every expectation with
  // `why`, drops every message held, and from now on fails new expectations
  // at once and drops what is delivered.
  void close(const Status &why);
  // Unclaimed messages held (for tests and leak checks).
  size_t pending_messages() const;

 private:
  struct Waiter {
    uint64_t token;
    void *dst;
    size_t dst_size;
    BlockSink sink;
    MessageCallback cb;
  };
  uint64_t add_waiter(int src, const std::string &key, Waiter w);
  struct Slot {
    std::deque<Waiter> waiters;
    std::deque<Message> messages;
  };
  static std::string slot_key(int src, const std::string &key);
  // Whether `key`/`header` is a piece of a retired collective instance (mu_ held).
  bool is_retired(const FrameHeader &header, const std::string &key) const;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  std::unordered_map<int, Status> failed_peers_;
  Status closed_;  // set by close(): every source is failed
  // Per collective name that ever failed here: the newest failed instance.
  std::unordered_map<std::string, uint64_t> retired_;
  uint64_t next_token_ = 1;
};

}  // namespace kungfu
