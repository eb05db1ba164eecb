// Recycles the buffers that hold messages which arrive before their consumer.
// Fresh large allocations cost page faults and (with std::vector) a memset of
// data that is about to be overwritten; with pieces of a fixed size per
// collective, a few free lists per size remove both.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kungfu {

class BufferPool;

// A buffer that goes back to its pool when destroyed.
class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(std::unique_ptr<char[]> data, size_t size, BufferPool *pool)
      : data_(std::move(data)), size_(size), pool_(pool) {}
  PooledBuffer(PooledBuffer &&) = default;
  PooledBuffer &operator=(PooledBuffer &&other) noexcept;
  ~PooledBuffer();

  char *data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  void release();
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  BufferPool *pool_ = nullptr;
};

class BufferPool {
 public:
  // Uninitialised memory of exactly `size` bytes.
  PooledBuffer get(size_t size);
  void put(std::unique_ptr<char[]> data, size_t size);
  static BufferPool &global();

 private:
  static constexpr size_t kMaxCachedBytes = size_t(256) << 20;
  std::mutex mu_;
  std::map<size_t, std::vector<std::unique_ptr<char[]>>> free_;
  size_t cached_bytes_ = 0;
};

}  // namespace kungfu
