#include "accumulator.h"

#include <algorithm>
#include <cstring>

#include "prefix_erase.h"

namespace kungfu {

namespace {

std::string size_text(DType dtype, size_t count, size_t row_len) {
  std::string bytes = " (" + std::to_string(count * dtype_size(dtype)) + " bytes)";
  if (row_len == 0) return std::to_string(count) + " " + dtype_name(dtype) + " elements" + bytes;
  return "a table of " + std::to_string(count / row_len) + " rows of " + std::to_string(row_len) + " " +
         dtype_name(dtype) + " elements" + bytes;
}

}  // namespace

std::string AccumulatorStore::Accumulator::shape_text() const { return size_text(dtype, count, row_len); }

void AccumulatorStore::Accumulator::drop(const std::string &why) {
  if (dropped.empty()) {
    dropped = why;
  } else {
    ++more_dropped;
  }
}

Status AccumulatorStore::Accumulator::take_dropped(const std::string &name) {
  if (dropped.empty()) return Status::OK();
  std::string why = "take '" + name + "': " + dropped;
  if (more_dropped > 0) why += " (and " + std::to_string(more_dropped) + " more dropped pushes)";
  dropped.clear();
  more_dropped = 0;
  return InvalidArgument(why);
}

void AccumulatorStore::erase_prefix(const std::string &prefix) {
  std::vector<std::shared_ptr<Accumulator>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  dropped = take_by_prefix(accumulators_, prefix);
}

size_t AccumulatorStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accumulators_.size();
}

std::shared_ptr<AccumulatorStore::Accumulator> AccumulatorStore::get(const std::string &name, DType dtype, size_t count,
                                                                     size_t row_len, const std::string &who) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Accumulator> &acc = accumulators_[name];
  if (!acc) {
    acc = std::make_shared<Accumulator>();
    acc->dtype = dtype;
    acc->count = count;
    acc->row_len = row_len;
    acc->defined_by = who;
    if (row_len > 0) {
      // A table is summed in place: zeros everywhere, rows zeroed again when taken.
      acc->sum.assign(count * dtype_size(dtype), 0);
      acc->touched.assign(count / row_len, 0);
    }
  }
  return acc;
}

void AccumulatorStore::add(const std::string &name, const std::string &from, DType dtype, size_t count,
                           const void *data) {
  std::shared_ptr<Accumulator> acc = get(name, dtype, count, 0, "the first push, from " + from);
  std::lock_guard<std::mutex> lock(acc->mu);
  if (dtype != acc->dtype || count != acc->count || acc->row_len != 0) {
    acc->drop("a push from " + from + " was dropped: it has " + size_text(dtype, count, 0) +
              " but the accumulator holds " + acc->shape_text() + " (fixed by " + acc->defined_by + ")");
    return;
  }
  size_t bytes = count * dtype_size(dtype);
  if (acc->pushes == 0) {
    // The first push since a take is the sum: a copy, no zeroing and adding.
    acc->sum.resize(bytes);
    if (bytes > 0) std::memcpy(acc->sum.data(), data, bytes);
  } else {
    reduce_inplace(acc->sum.data(), data, count, dtype, ReduceOp::kSum);
  }
  ++acc->pushes;
}

void AccumulatorStore::add_rows(const std::string &name, const std::string &from, DType dtype, size_t num_rows,
                                size_t row_len, size_t n, const int64_t *rows, const void *values) {
  if (row_len == 0) {
    // Rows of nothing: an empty dense accumulator says the same.
    return add(name, from, dtype, 0, values);
  }
  std::shared_ptr<Accumulator> acc = get(name, dtype, num_rows * row_len, row_len, "the first push, from " + from);
  std::lock_guard<std::mutex> lock(acc->mu);
  if (dtype != acc->dtype || num_rows * row_len != acc->count || row_len != acc->row_len) {
    acc->drop("a push from " + from + " was dropped: it has rows of " + size_text(dtype, num_rows * row_len, row_len) +
              " but the accumulator holds " + acc->shape_text() + " (fixed by " + acc->defined_by + ")");
    return;
  }
  // Check every index before adding any: a bad push changes nothing.
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || static_cast<size_t>(rows[i]) >= num_rows) {
      acc->drop("a push from " + from + " was dropped: row " + std::to_string(rows[i]) + " is outside the table's " +
                std::to_string(num_rows) + " rows");
      return;
    }
  }
  size_t row_bytes = row_len * dtype_size(dtype);
  const char *src = static_cast<const char *>(values);
  for (size_t i = 0; i < n; ++i) {
    auto r = static_cast<size_t>(rows[i]);
    reduce_inplace(acc->sum.data() + r * row_bytes, src + i * row_bytes, row_len, dtype, ReduceOp::kSum);
    if (!acc->touched[r]) {
      acc->touched[r] = 1;
      acc->touched_rows.push_back(rows[i]);
    }
  }
  ++acc->pushes;
}

Status AccumulatorStore::take(const std::string &name, DType dtype, size_t count, void *dst, int64_t *pushes) {
  std::shared_ptr<Accumulator> acc = get(name, dtype, count, 0, "the first take");
  std::lock_guard<std::mutex> lock(acc->mu);
  Status dropped = acc->take_dropped(name);
  if (!dropped.ok()) return dropped;
  if (dtype != acc->dtype || count != acc->count || acc->row_len != 0) {
    return InvalidArgument("take '" + name + "': asked for " + size_text(dtype, count, 0) +
                           " but the accumulator holds " + acc->shape_text() + " (fixed by " + acc->defined_by + ")");
  }
  size_t bytes = count * dtype_size(dtype);
  if (bytes > 0) {
    if (acc->pushes > 0) {
      std::memcpy(dst, acc->sum.data(), bytes);
    } else {
      std::memset(dst, 0, bytes);  // all-zero bits are 0 in every dtype we sum
    }
  }
  *pushes = acc->pushes;
  acc->pushes = 0;
  return Status::OK();
}

Status AccumulatorStore::take_rows(const std::string &name, DType dtype, size_t num_rows, size_t row_len,
                                   std::vector<int64_t> *rows, std::vector<char> *values, int64_t *pushes) {
  rows->clear();
  values->clear();
  if (row_len == 0) return take(name, dtype, 0, nullptr, pushes);
  std::shared_ptr<Accumulator> acc = get(name, dtype, num_rows * row_len, row_len, "the first take");
  std::lock_guard<std::mutex> lock(acc->mu);
  Status dropped = acc->take_dropped(name);
  if (!dropped.ok()) return dropped;
  if (dtype != acc->dtype || num_rows * row_len != acc->count || row_len != acc->row_len) {
    return InvalidArgument("take '" + name + "': asked for " + size_text(dtype, num_rows * row_len, row_len) +
                           " but the accumulator holds " + acc->shape_text() + " (fixed by " + acc->defined_by + ")");
  }
  // Ascending rows: the same sums give the same outputs, whatever order the pushes came in.
  std::sort(acc->touched_rows.begin(), acc->touched_rows.end());
  size_t row_bytes = row_len * dtype_size(dtype);
  rows->swap(acc->touched_rows);
  values->resize(rows->size() * row_bytes);
  for (size_t i = 0; i < rows->size(); ++i) {
    char *row = acc->sum.data() + static_cast<size_t>((*rows)[i]) * row_bytes;
    std::memcpy(values->data() + i * row_bytes, row, row_bytes);
    std::memset(row, 0, row_bytes);
    acc->touched[static_cast<size_t>((*rows)[i])] = 0;
  }
  *pushes = acc->pushes;
  acc->pushes = 0;
  return Status::OK();
}

}  // namespace kungfu
