// Tests for the sparse parameter-server primitives: rows pushed into a table
// accumulator (scatter-added, taken by row) and a table whose peers fetch only
// the rows changed since their last fetch; on the stores alone and between
// runtimes over real sockets, counting the bytes that travel.
#include <chrono>
#include <cstring>
#include <thread>

#include "test_util.h"

using namespace kungfu;
using kftest::contains;
using kftest::make_cluster;
using kftest::seconds_since;
using kftest::wait_for;

namespace {

using Cluster_ = std::vector<std::unique_ptr<Runtime>>;

std::vector<float> floats(const std::vector<char> &bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<float> floats(const BlobBytes &blob) { return floats(std::vector<char>(blob.begin(), blob.end())); }

// ---------------------------------------------------------------- table accumulator

void test_rows_scatter_add() {
  AccumulatorStore store;
  std::vector<int64_t> rows;
  std::vector<char> values;
  int64_t pushes = -1;
  // A table of 5 rows of 2 floats; row 3 twice in one push, row 1 from two pushes.
  int64_t r1[3] = {3, 1, 3};
  float v1[6] = {1, 2, 10, 20, 0.5f, 0.25f};
  int64_t r2[1] = {1};
  float v2[2] = {-10, 1};
  store.add_rows("t", "rank 1", DType::kFloat32, 5, 2, 3, r1, v1);
  store.add_rows("t", "rank 2", DType::kFloat32, 5, 2, 1, r2, v2);
  CHECK_OK(store.take_rows("t", DType::kFloat32, 5, 2, &rows, &values, &pushes));
  CHECK(pushes == 2 && (rows == std::vector<int64_t>{1, 3}));
  CHECK((floats(values) == std::vector<float>{0, 21, 1.5f, 2.25f}));
  // Taken rows start again from zero; untouched rows never show up.
  int64_t r3[1] = {3};
  float v3[2] = {7, 8};
  store.add_rows("t", "rank 1", DType::kFloat32, 5, 2, 1, r3, v3);
  CHECK_OK(store.take_rows("t", DType::kFloat32, 5, 2, &rows, &values, &pushes));
  CHECK(pushes == 1 && (rows == std::vector<int64_t>{3}) && (floats(values) == std::vector<float>{7, 8}));
  // Nothing pushed: no rows, 0 pushes. A push of no rows still counts.
  CHECK_OK(store.take_rows("t", DType::kFloat32, 5, 2, &rows, &values, &pushes));
  CHECK(pushes == 0 && rows.empty() && values.empty());
  store.add_rows("t", "rank 1", DType::kFloat32, 5, 2, 0, nullptr, nullptr);
  CHECK_OK(store.take_rows("t", DType::kFloat32, 5, 2, &rows, &values, &pushes));
  CHECK(pushes == 1 && rows.empty());
  // Other dtypes add like the dense accumulator.
  int64_t ri[2] = {0, 0};
  int64_t vi[2] = {int64_t(1) << 40, 3};
  store.add_rows("i", "rank 1", DType::kInt64, 4, 1, 2, ri, vi);
  CHECK_OK(store.take_rows("i", DType::kInt64, 4, 1, &rows, &values, &pushes));
  int64_t got = 0;
  std::memcpy(&got, values.data(), sizeof(got));
  CHECK(rows.size() == 1 && got == (int64_t(1) << 40) + 3);
}

void test_rows_mismatches() {
  AccumulatorStore store;
  std::vector<int64_t> rows;
  std::vector<char> values;
  int64_t pushes = -1;
  int64_t good_rows[1] = {2}, bad_rows[2] = {1, 9};
  float v[4] = {1, 1, 1, 1};
  store.add_rows("t", "rank 1 (h:1)", DType::kFloat32, 4, 2, 1, good_rows, v);
  store.add_rows("t", "rank 2 (h:2)", DType::kFloat32, 4, 2, 2, bad_rows, v);   // row 9: dropped whole
  store.add_rows("t", "rank 3 (h:3)", DType::kFloat32, 8, 2, 1, good_rows, v);  // another table size
  store.add("t", "rank 3 (h:3)", DType::kFloat32, 8, v);                        // a dense push
  Status s = store.take_rows("t", DType::kFloat32, 4, 2, &rows, &values, &pushes);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(contains(s.message(), "rank 2 (h:2)") && contains(s.message(), "row 9 is outside the table's 4 rows"));
  CHECK(contains(s.message(), "2 more dropped"));
  // Nothing of the bad pushes landed: row 1 is untouched.
  CHECK_OK(store.take_rows("t", DType::kFloat32, 4, 2, &rows, &values, &pushes));
  CHECK(pushes == 1 && (rows == std::vector<int64_t>{2}) && (floats(values) == std::vector<float>{1, 1}));
  // The dense-vs-table mismatch names both shapes.
  store.add("t", "rank 3 (h:3)", DType::kFloat32, 8, v);
  s = store.take_rows("t", DType::kFloat32, 4, 2, &rows, &values, &pushes);
  CHECK(contains(s.message(), "8 float32 elements (32 bytes)") &&
        contains(s.message(), "a table of 4 rows of 2 float32 elements (32 bytes)"));
  // A dense take of a table fails and keeps its rows.
  store.add_rows("t", "rank 1 (h:1)", DType::kFloat32, 4, 2, 1, good_rows, v);
  float dense[8];
  s = store.take("t", DType::kFloat32, 8, dense, &pushes);
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "a table of 4 rows"));
  CHECK_OK(store.take_rows("t", DType::kFloat32, 4, 2, &rows, &values, &pushes));
  CHECK(pushes == 1 && rows.size() == 1);
}

// ---------------------------------------------------------------- the row store alone

struct Got {
  RowsReply reply;
  int calls = 0;
};
RowsCallback into(Got *g) {
  return [g](RowsReply r) {
    g->reply = std::move(r);
    ++g->calls;
  };
}
// The row indices and row values (floats) of a rows reply.
std::pair<std::vector<int64_t>, std::vector<float>> split(const RowsReply &r) {
  size_t n = r.payload->size() / (sizeof(int64_t) + 2 * sizeof(float));
  std::vector<int64_t> rows(n);
  if (n) std::memcpy(rows.data(), r.payload->data(), n * sizeof(int64_t));
  std::vector<char> rest(r.payload->begin() + static_cast<long>(n * sizeof(int64_t)), r.payload->end());
  return {rows, floats(rest)};
}

void test_row_store_deltas() {
  RowStore store;
  std::vector<float> table = {0, 0, 1, 1, 2, 2, 3, 3};  // 4 rows of 2 floats
  const size_t row_bytes = 2 * sizeof(float);
  auto data = [&] { return reinterpret_cast<const char *>(table.data()); };
  Got a, b;
  // Peer 1 waits for version 1 before anything exists.
  uint64_t token = store.when_updated("t", 1, 0, 1, into(&a));
  CHECK(token != 0 && store.waiting() == 1);
  CHECK_OK(store.update("t", 1, data(), 4, row_bytes, nullptr, 0));
  // Its first fetch: the whole table.
  CHECK(a.calls == 1 && a.reply.version == 1 && a.reply.all_rows && floats(*a.reply.payload) == table);
  CHECK(store.waiting() == 0);
  // Versions 2 and 3 change rows 2, then 0 and 2: peer 1 (holding 1) gets rows 0 and 2 as of version 3.
  table[4] = 20;
  int64_t ch2[1] = {2};
  CHECK_OK(store.update("t", 2, data(), 4, row_bytes, ch2, 1));
  table[0] = 5;
  table[5] = 21;
  int64_t ch3[2] = {2, 0};
  CHECK_OK(store.update("t", 3, data(), 4, row_bytes, ch3, 2));
  CHECK(store.when_updated("t", 1, 1, 2, into(&a)) == 0);
  auto [rows, values] = split(a.reply);
  CHECK(a.calls == 2 && a.reply.version == 3 && !a.reply.all_rows);
  CHECK((rows == std::vector<int64_t>{0, 2}) && (values == std::vector<float>{5, 0, 20, 21}));
  // Up to date: no rows.
  CHECK(store.when_updated("t", 1, 3, 3, into(&a)) == 0);
  CHECK(a.calls == 3 && !a.reply.all_rows && a.reply.payload->empty());
  // A peer whose held version is not the one we sent it (a restart, a lost
  // answer) gets the whole table again; so does a new peer.
  CHECK(store.when_updated("t", 1, 2, 1, into(&a)) == 0);
  CHECK(a.reply.all_rows && floats(*a.reply.payload) == table);
  CHECK(store.when_updated("t", 2, 0, 1, into(&b)) == 0);
  CHECK(b.reply.all_rows && b.reply.version == 3);
  // A waiter for a later version is answered by the update that brings it, and can be cancelled.
  Got c;
  uint64_t t5 = store.when_updated("t", 2, 3, 5, into(&c));
  uint64_t t9 = store.when_updated("t", 1, 3, 9, into(&a));
  table[7] = 30;
  int64_t ch4[1] = {3};
  CHECK_OK(store.update("t", 4, data(), 4, row_bytes, ch4, 1));
  CHECK(c.calls == 0);
  CHECK_OK(store.update("t", 5, data(), 4, row_bytes, nullptr, 0));
  auto [rows5, values5] = split(c.reply);
  CHECK(c.calls == 1 && c.reply.version == 5 && (rows5 == std::vector<int64_t>{3}) &&
        (values5 == std::vector<float>{3, 30}));
  CHECK(!store.cancel("t", t5) && store.cancel("t", t9) && store.waiting() == 0);
  // Bad updates change nothing.
  Status s = store.update("t", 6, data(), 8, sizeof(float), nullptr, 0);
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "8 rows of 4 bytes") &&
        contains(s.message(), "4 rows of 8 bytes"));
  int64_t bad[2] = {1, 4};
  s = store.update("t", 6, data(), 4, row_bytes, bad, 2);
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "row 4 is outside its 4 rows"));
  CHECK(store.when_updated("t", 2, 5, 1, into(&c)) == 0 && c.reply.version == 5 && c.reply.payload->empty());
}

// ---------------------------------------------------------------- between runtimes

uint64_t total_bytes(Runtime &rt) {
  uint64_t n = 0;
  const TrafficCounters &c = rt.counters();
  for (int p = 0; p < rt.size(); ++p) n += c.sent(p) + c.received(p);
  return n;
}

void test_push_rows_between_runtimes() {
  const size_t num_rows = 100000, row_len = 16;  // a 6.4 MB table
  Cluster_ rts = make_cluster(3, TopologyKind::kStar, 20);
  const RowsDesc desc{DType::kFloat32, num_rows, row_len};
  uint64_t before = total_bytes(*rts[1]);
  for (int r = 0; r < 3; ++r) {
    std::vector<int64_t> rows = {int64_t(r), 99999};
    std::vector<float> values(2 * row_len, static_cast<float>(r + 1));
    CHECK_OK(wait_for([&](DoneCallback d) { rts[r]->push_rows(0, "emb", desc, 2, rows.data(), values.data(), d); }));
  }
  // Pushes travel before a later barrier and are added before it is read.
  std::vector<std::future<Status>> fs;
  for (auto &rt : rts) {
    auto p = std::make_shared<std::promise<Status>>();
    fs.push_back(p->get_future());
    rt->barrier("pushed", [p](const Status &s) { p->set_value(s); });
  }
  for (auto &f : fs) CHECK_OK(f.get());
  uint64_t sent = total_bytes(*rts[1]) - before;
  CHECK(sent < 4096);  // two rows and a barrier, not the table
  std::vector<int64_t> rows;
  std::vector<char> values;
  int64_t pushes = 0;
  CHECK_OK(rts[0]->take_rows("emb", desc, &rows, &values, &pushes));
  std::vector<float> v = floats(values);
  CHECK(pushes == 3 && (rows == std::vector<int64_t>{0, 1, 2, 99999}) && v.size() == 4 * row_len);
  CHECK(v[0] == 1 && v[row_len] == 2 && v[2 * row_len] == 3 && v[3 * row_len] == 6);
  // A bad row index from a peer is dropped there and reported by the take, naming the peer.
  std::vector<int64_t> bad = {int64_t(num_rows)};
  std::vector<float> one(row_len, 1);
  CHECK_OK(wait_for([&](DoneCallback d) { rts[2]->push_rows(0, "emb", desc, 1, bad.data(), one.data(), d); }));
  // Reported once rank 0 has read the push (milliseconds; 30 s rules out "never").
  Status s;
  CHECK(kftest::eventually([&] {
    s = rts[0]->take_rows("emb", desc, &rows, &values, &pushes);
    return !s.ok();
  }));
  CHECK(contains(s.message(), "rank 2") && contains(s.message(), "row 100000 is outside"));
}

void test_request_rows_between_runtimes() {
  const size_t num_rows = 50000, row_len = 8;
  const RowsDesc desc{DType::kFloat32, num_rows, row_len};
  const size_t table_bytes = num_rows * desc.row_bytes();
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 20);
  std::vector<float> table(num_rows * row_len, 1.0f);
  auto fetch = [&](uint64_t min_version, RowsReply *out) {
    return wait_for([&](DoneCallback d) {
      rts[1]->request_rows(0, "emb", min_version, [out, d](const Status &s, RowsReply r) {
        *out = std::move(r);
        d(s);
      });
    });
  };
  // Rank 1 asks for version 1 before rank 0 saved anything: it waits, then gets the whole table.
  std::thread saver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_OK(rts[0]->save_rows("emb", 1, table.data(), desc, nullptr, 0));
  });
  RowsReply r;
  uint64_t before = total_bytes(*rts[1]);
  CHECK_OK(fetch(1, &r));
  saver.join();
  CHECK(r.version == 1 && r.all_rows && r.payload->size() == table_bytes);
  CHECK(r.num_rows == num_rows && r.row_bytes == desc.row_bytes());
  CHECK(total_bytes(*rts[1]) - before >= table_bytes);
  // Then only changed rows travel, across however many versions.
  for (uint64_t v = 2; v <= 4; ++v) {
    int64_t row = static_cast<int64_t>(v * 1000);
    table[static_cast<size_t>(row) * row_len] = static_cast<float>(v);
    CHECK_OK(rts[0]->save_rows("emb", v, table.data(), desc, &row, 1));
  }
  before = total_bytes(*rts[1]);
  CHECK_OK(fetch(3, &r));
  uint64_t moved = total_bytes(*rts[1]) - before;
  CHECK(r.version == 4 && !r.all_rows && r.payload->size() == 3 * (sizeof(int64_t) + desc.row_bytes()));
  CHECK(moved < 2048);
  int64_t first_row = 0;
  std::memcpy(&first_row, r.payload->data(), sizeof(first_row));
  CHECK(first_row == 2000);
  // A version that never comes: DeadlineExceeded after the timeout, naming
  // the table. The short timeout is what this costs; nothing on `quick` is
  // meant to succeed within it but the save (local) and the fetch's connection.
  const double quick_timeout = 1.0;
  Cluster_ quick = make_cluster(2, TopologyKind::kStar, quick_timeout);
  CHECK_OK(quick[0]->save_rows("emb", 1, table.data(), desc, nullptr, 0));
  auto start = std::chrono::steady_clock::now();
  Status s = wait_for(
      [&](DoneCallback d) { quick[1]->request_rows(0, "emb", 7, [d](const Status &st, RowsReply) { d(st); }); });
  CHECK(s.code() == Code::kDeadlineExceeded && contains(s.message(), "'emb' version >= 7 from rank 0"));
  CHECK(seconds_since(start) < 10 * quick_timeout);  // after the timeout, not never (10x: a loaded machine)
  // Nothing left behind once the server's own timeout has answered (about
  // now; 30 s rules out "never").
  CHECK(kftest::eventually([&] {
    for (auto &rt : quick) {
      if (rt->parked_requests() != 0 || rt->pending_messages() != 0) return false;
    }
    return true;
  }));
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"table accumulator: scatter-add", test_rows_scatter_add},
      {"table accumulator: mismatches", test_rows_mismatches},
      {"row store: deltas per peer", test_row_store_deltas},
      {"push rows between runtimes", test_push_rows_between_runtimes},
      {"request rows between runtimes", test_request_rows_between_runtimes},
  });
}
