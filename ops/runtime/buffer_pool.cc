#include "buffer_pool.h"

namespace kungfu {

PooledBuffer &PooledBuffer::operator=(PooledBuffer &&other) noexcept {
  if (this != &other) {
    release();
    data_ = std::move(other.data_);
    size_ = other.size_;
    pool_ = other.pool_;
    other.size_ = 0;
  }
  return *this;
}

PooledBuffer::~PooledBuffer() { release(); }

void PooledBuffer::release() {
  if (data_ && pool_) pool_->put(std::move(data_), size_);
  data_.reset();
}

PooledBuffer BufferPool::get(size_t size) {
  if (size == 0) return PooledBuffer(nullptr, 0, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      std::unique_ptr<char[]> data = std::move(it->second.back());
      it->second.pop_back();
      cached_bytes_ -= size;
      return PooledBuffer(std::move(data), size, this);
    }
  }
  return PooledBuffer(std::unique_ptr<char[]>(new char[size]), size, this);  // uninitialised on purpose
}

void BufferPool::put(std::unique_ptr<char[]> data, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_bytes_ + size > kMaxCachedBytes) return;  // let it go
  cached_bytes_ += size;
  free_[size].push_back(std::move(data));
}

BufferPool &BufferPool::global() {
  static BufferPool *pool = new BufferPool();  // outlives every runtime thread
  return *pool;
}

}  // namespace kungfu
