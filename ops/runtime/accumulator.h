// Named sums that peers push into: the receiving side of an asynchronous
// parameter server. Workers push gradients to the owner of a variable
// whenever they have one; the owner takes the sum (and how many pushes it
// holds) when it applies an update, without waiting for anybody.
//
// An accumulator is either dense (every push covers every element) or a
// table of rows (a push carries some rows of a sparse gradient, which are
// scatter-added; a take returns only the rows pushed since the last take).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtype.h"
#include "status.h"

namespace kungfu {

class AccumulatorStore {
 public:
  // Adds `count` elements of `dtype` at `data` into accumulator `name`,
  // element-wise. The first push or take of a name fixes its dtype and
  // element count (the shape is not part of it). A push that does not match
  // is dropped, so it cannot corrupt the sum, and the next take reports it;
  // `from` names the sender in that error ("rank 2 (host:port)").
  void add(const std::string &name, const std::string &from, DType dtype, size_t count, const void *data);

  // Sparse push into a table of `num_rows` rows of `row_len` elements: row
  // `rows[i]` gets `values[i * row_len ...]` added, for i < n (a row may come
  // twice). Dropped whole, like a mismatching add(), if the table's shape or
  // dtype differ or a row index is out of range.
  void add_rows(const std::string &name, const std::string &from, DType dtype, size_t num_rows, size_t row_len,
                size_t n, const int64_t *rows, const void *values);

  // Moves the sum of `name` into `dst` (`count` elements of `dtype`) and sets
  // *pushes to the number of pushes it holds, then starts a new, empty sum.
  // Nothing pushed since the last take: zeros and 0. Fails, leaving the sum
  // as it is, if pushes were dropped since the last take or if dtype/count
  // differ from the accumulator's.
  Status take(const std::string &name, DType dtype, size_t count, void *dst, int64_t *pushes);

  // Like take() for a table: the rows pushed since the last take, ascending,
  // into *rows and their sums into *values (rows->size() * row_len elements).
  Status take_rows(const std::string &name, DType dtype, size_t num_rows, size_t row_len, std::vector<int64_t> *rows,
                   std::vector<char> *values, int64_t *pushes);

  // Drops every accumulator whose name starts with `prefix` (a replaced
  // strategy plan's, whose names no step uses again). A push that comes
  // later starts a new, empty one.
  void erase_prefix(const std::string &prefix);
  // How many accumulators exist (for tests and leak checks).
  size_t size() const;

 private:
  struct Accumulator {
    std::mutex mu;
    DType dtype = DType::kFloat32;
    size_t count = 0;
    size_t row_len = 0;                 // 0: dense; else a table of count / row_len rows
    std::string defined_by;             // who fixed dtype/count, for error messages
    std::vector<char> sum;              // dense: valid only while pushes > 0; table: always (zeros where untouched)
    std::vector<uint8_t> touched;       // table: per row, pushed since the last take
    std::vector<int64_t> touched_rows;  // table: those rows, in first-push order
    int64_t pushes = 0;
    std::string dropped;  // the first push dropped since the last take
    int64_t more_dropped = 0;

    std::string shape_text() const;
    // Records a dropped push (its error is reported by the next take).
    void drop(const std::string &why);
    // The pending drop error as a Status (and clears it); OK if none.
    Status take_dropped(const std::string &name);
  };
  // The accumulator of `name`, created (with dtype/count/row_len) if it is new.
  std::shared_ptr<Accumulator> get(const std::string &name, DType dtype, size_t count, size_t row_len,
                                   const std::string &who);

  mutable std::mutex mu_;  // guards the map only; each accumulator has its own lock
  std::unordered_map<std::string, std::shared_ptr<Accumulator>> accumulators_;
};

}  // namespace kungfu
