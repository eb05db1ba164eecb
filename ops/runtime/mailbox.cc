#include "mailbox.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>

namespace kungfu {

std::string Mailbox::slot_key(int src, const std::string &key) {
  std::string k = std::to_string(src);
  k.push_back('|');
  k += key;
  return k;
}

uint64_t Mailbox::expect(int src, const std::string &key, void *dst, size_t dst_size, MessageCallback cb) {
  return add_waiter(src, key, Waiter{0, dst, dst_size, nullptr, std::move(cb)});
}

uint64_t Mailbox::expect_stream(int src, const std::string &key, size_t size, BlockSink sink, MessageCallback cb) {
  return add_waiter(src, key, Waiter{0, nullptr, size, std::move(sink), std::move(cb)});
}

uint64_t Mailbox::add_waiter(int src, const std::string &key, Waiter w) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t token = next_token_++;
  w.token = token;
  std::string sk = slot_key(src, key);
  auto it = slots_.find(sk);
  if (it != slots_.end() && !it->second.messages.empty()) {
    Message msg = std::move(it->second.messages.front());
    it->second.messages.pop_front();
    if (it->second.messages.empty() && it->second.waiters.empty()) slots_.erase(it);
    lock.unlock();
    w.cb(Status::OK(), msg);
    return token;
  }
  auto failed = failed_peers_.find(src);
  if (!closed_.ok() || failed != failed_peers_.end()) {
    Status why = closed_.ok() ? failed->second : closed_;
    lock.unlock();
    Message none;
    none.src = src;
    none.key = key;
    w.cb(why, none);
    return token;
  }
  slots_[sk].waiters.push_back(std::move(w));
  return token;
}

bool Mailbox::cancel(int src, const std::string &key, uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(slot_key(src, key));
  if (it == slots_.end()) return false;
  auto &waiters = it->second.waiters;
  for (auto w = waiters.begin(); w != waiters.end(); ++w) {
    if (w->token == token) {
      waiters.erase(w);
      if (waiters.empty() && it->second.messages.empty()) slots_.erase(it);
      return true;
    }
  }
  return false;
}

bool read_payload(const PartialReader &read, uint64_t len, PooledBuffer *out) {
  if (len <= kEagerPayloadBytes) {
    *out = BufferPool::global().get(len);
    return read(out->data(), len);
  }
  // Large: one copy of the received bytes per doubling (less than len in all),
  // which a payload this size amortises; only a lying header pays more.
  size_t cap = kEagerPayloadBytes;
  std::unique_ptr<char[]> buf(new char[cap]);
  size_t got = 0;
  while (true) {
    if (!read(buf.get() + got, cap - got)) return false;
    got = cap;
    if (got == len) break;
    size_t next = len - cap <= cap ? len : 2 * cap;  // min(len, 2 * cap) without overflow
    std::unique_ptr<char[]> bigger(new char[next]);
    std::memcpy(bigger.get(), buf.get(), got);
    buf = std::move(bigger);
    cap = next;
  }
  *out = PooledBuffer(std::move(buf), len, &BufferPool::global());
  return true;
}

namespace {

bool stream_into(const PartialReader &read, size_t total, const BlockSink &sink) {
  thread_local std::unique_ptr<char[]> block(new char[kStreamBlock]);
  for (size_t off = 0; off < total; off += kStreamBlock) {
    size_t n = std::min(kStreamBlock, total - off);
    if (!read(block.get(), n)) return false;
    sink(block.get(), off, n);
  }
  return true;
}

}  // namespace

namespace {

// The op name of a collective piece key "<op_name>#<piece><phase>@<instance>".
std::string op_name_of(const std::string &key) {
  size_t hash = key.rfind('#');
  return hash == std::string::npos ? key : key.substr(0, hash);
}

}  // namespace

bool Mailbox::is_retired(const FrameHeader &header, const std::string &key) const {
  if (retired_.empty() || header.type != static_cast<uint8_t>(FrameType::kCollective)) return false;
  auto it = retired_.find(op_name_of(key));
  return it != retired_.end() && header.seq <= it->second;
}

void Mailbox::retire(const std::string &op_name, uint64_t instance) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t &newest = retired_[op_name];
  newest = std::max(newest, instance);
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto &messages = it->second.messages;
    for (auto m = messages.begin(); m != messages.end();) {
      m = is_retired(m->header, m->key) ? messages.erase(m) : std::next(m);
    }
    if (messages.empty() && it->second.waiters.empty()) {
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Mailbox::deliver(int src, const FrameHeader &header, std::string key, const PartialReader &read) {
  std::string sk = slot_key(src, key);
  Message msg;
  msg.src = src;
  msg.header = header;
  msg.key = std::move(key);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A late piece of a failed instance: nobody will ever want it (the
    // transport skips its payload). Nor anything once closed.
    if (!closed_.ok() || is_retired(header, msg.key)) return true;
    auto it = slots_.find(sk);
    if (it != slots_.end() && !it->second.waiters.empty() && it->second.messages.empty()) {
      Waiter w = std::move(it->second.waiters.front());
      it->second.waiters.pop_front();
      if (it->second.waiters.empty()) slots_.erase(it);
      lock.unlock();
      // The consumer is waiting: read straight into its buffer (or its sink) when it fits.
      bool ok;
      if (w.sink && w.dst_size == header.payload_len) {
        ok = stream_into(read, header.payload_len, w.sink);
        msg.streamed = true;
      } else if (w.dst != nullptr && w.dst_size == header.payload_len) {
        ok = read(w.dst, header.payload_len);
        msg.direct = static_cast<const char *>(w.dst);
      } else {
        ok = read_payload(read, header.payload_len, &msg.owned);
      }
      if (!ok) {
        Status lost = Unavailable("connection to peer lost while receiving '" + msg.key + "'");
        w.cb(lost, msg);
        return false;
      }
      w.cb(Status::OK(), msg);
      return true;
    }
  }
  // Nobody is waiting yet: buffer the payload, then re-check, because a
  // consumer may have arrived while we were reading.
  if (!read_payload(read, header.payload_len, &msg.owned)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!closed_.ok() || is_retired(header, msg.key)) return true;  // retired or closed while we read it
  Slot &slot = slots_[sk];
  if (!slot.waiters.empty() && slot.messages.empty()) {
    Waiter w = std::move(slot.waiters.front());
    slot.waiters.pop_front();
    if (slot.waiters.empty()) slots_.erase(sk);
    lock.unlock();
    w.cb(Status::OK(), msg);
    return true;
  }
  slot.messages.push_back(std::move(msg));
  return true;
}

void Mailbox::fail_peer(int src, const Status &why) {
  std::vector<Waiter> doomed;
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_peers_[src] = why;
    std::string prefix = std::to_string(src) + "|";
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (it->first.compare(0, prefix.size(), prefix) == 0) {
        for (Waiter &w : it->second.waiters) {
          keys.push_back(it->first.substr(prefix.size()));
          doomed.push_back(std::move(w));
        }
        it->second.waiters.clear();
        if (it->second.messages.empty()) {
          it = slots_.erase(it);
          continue;
        }
      }
      ++it;
    }
  }
  for (size_t i = 0; i < doomed.size(); ++i) {
    Message none;
    none.src = src;
    none.key = keys[i];
    doomed[i].cb(why, none);
  }
}

void Mailbox::close(const Status &why) {
  std::vector<std::pair<std::pair<int, std::string>, Waiter>> doomed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = why;
    for (auto &kv : slots_) {
      // slot_key is "<src>|<key>".
      const size_t bar = kv.first.find('|');
      const int src = std::stoi(kv.first.substr(0, bar));
      for (Waiter &w : kv.second.waiters) doomed.push_back({{src, kv.first.substr(bar + 1)}, std::move(w)});
    }
    slots_.clear();
    retired_.clear();
  }
  for (auto &d : doomed) {
    Message none;
    none.src = d.first.first;
    none.key = d.first.second;
    d.second.cb(why, none);
  }
}

void Mailbox::revive_peer(int src) {
  std::lock_guard<std::mutex> lock(mu_);
  failed_peers_.erase(src);
}

size_t Mailbox::pending_messages() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto &kv : slots_) n += kv.second.messages.size();
  return n;
}

}  // namespace kungfu
