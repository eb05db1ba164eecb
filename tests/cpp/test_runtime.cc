// Runtime tests: several runtimes in one process, talking over real sockets.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "handshake.h"
#include "socket_io.h"
#include "test_util.h"

using namespace kungfu;
using kftest::contains;
using kftest::make_cluster;
using kftest::seconds_since;
using kftest::wait_for;

namespace {

using Cluster_ = std::vector<std::unique_ptr<Runtime>>;

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}

template <typename T>
T value_of(int rank, size_t i) {
  return static_cast<T>((rank + 1) * 3 + static_cast<int>(i % 7));
}

// All-reduce on every runtime at once; checks each result element-wise.
template <typename T>
void check_all_reduce(Cluster_ &rts, size_t count, ReduceOp op, const std::string &name) {
  int n = static_cast<int>(rts.size());
  std::vector<std::vector<T>> in(n, std::vector<T>(count)), out(n, std::vector<T>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = value_of<T>(r, i);
  std::vector<std::future<Status>> futures;
  std::vector<std::shared_ptr<std::promise<Status>>> promises;
  for (int r = 0; r < n; ++r) {
    auto p = std::make_shared<std::promise<Status>>();
    futures.push_back(p->get_future());
    Buffer b{in[r].data(), out[r].data(), TensorDesc{dtype_of<T>(), {static_cast<int64_t>(count)}, count}, nullptr};
    rts[r]->all_reduce(name, b, op, [p](const Status &s) { p->set_value(s); });
  }
  for (auto &f : futures) CHECK_OK(f.get());
  bool all_ok = true;
  for (size_t i = 0; i < count && all_ok; ++i) {
    T expect = in[0][i];
    for (int r = 1; r < n; ++r) {
      T v = in[r][i];
      switch (op) {
        case ReduceOp::kSum: expect = static_cast<T>(expect + v); break;
        case ReduceOp::kProd: expect = static_cast<T>(expect * v); break;
        case ReduceOp::kMin: expect = std::min(expect, v); break;
        case ReduceOp::kMax: expect = std::max(expect, v); break;
      }
    }
    for (int r = 0; r < n; ++r) all_ok = all_ok && out[r][i] == expect;
  }
  if (!all_ok)
    std::fprintf(stderr, "  wrong result: n=%d count=%zu op=%s name=%s\n", n, count, reduce_op_name(op), name.c_str());
  CHECK(all_ok);
}

void test_all_reduce_matrix() {
  for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree,
                            TopologyKind::kBinaryTreeStar, TopologyKind::kClique, TopologyKind::kAuto}) {
    for (int n = 1; n <= 4; ++n) {
      // A small chunk size makes even modest tensors travel as many pieces.
      Cluster_ rts = make_cluster(n, topo, 20, 4096);
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
        std::string base = std::string(topology_name(topo)) + "/" + std::to_string(count);
        check_all_reduce<float>(rts, count, ReduceOp::kSum, base + "/f32sum");
        check_all_reduce<int32_t>(rts, count, ReduceOp::kMax, base + "/i32max");
        check_all_reduce<int64_t>(rts, count, ReduceOp::kMin, base + "/i64min");
        check_all_reduce<double>(rts, count, ReduceOp::kProd, base + "/f64prod");
        check_all_reduce<uint8_t>(rts, count, ReduceOp::kMax, base + "/u8max");
      }
    }
  }
}

void test_many_concurrent_in_random_order() {
  const int n = 4, ops = 320;
  Cluster_ rts = make_cluster(n, TopologyKind::kAuto, 30, 2048);
  std::vector<std::vector<std::vector<float>>> bufs(n, std::vector<std::vector<float>>(ops));
  std::vector<std::future<Status>> futures;
  std::vector<std::thread> issuers;
  std::mutex mu;
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < ops; ++k) bufs[r][k].assign(1 + (k * 37) % 3000, static_cast<float>(r * 1000 + k));
  }
  for (int r = 0; r < n; ++r) {
    issuers.emplace_back([&, r] {
      std::vector<int> order(ops);
      for (int k = 0; k < ops; ++k) order[k] = k;
      std::shuffle(order.begin(), order.end(), std::mt19937(r + 7));
      for (int k : order) {
        auto p = std::make_shared<std::promise<Status>>();
        {
          std::lock_guard<std::mutex> lock(mu);
          futures.push_back(p->get_future());
        }
        std::vector<float> &b = bufs[r][k];
        Buffer buf{b.data(), b.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(b.size())}, b.size()},
                   nullptr};
        rts[r]->all_reduce("grad/" + std::to_string(k), buf, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
      }
    });
  }
  for (auto &t : issuers) t.join();
  for (auto &f : futures) CHECK_OK(f.get());
  bool ok = true;
  for (int k = 0; k < ops; ++k) {
    float expect = 0;
    for (int r = 0; r < n; ++r) expect += static_cast<float>(r * 1000 + k);
    for (int r = 0; r < n; ++r)
      for (float v : bufs[r][k]) ok = ok && v == expect;
  }
  CHECK(ok);
  for (auto &rt : rts) CHECK(rt->pending_messages() == 0);
}

// all_reduce_on: each call picks its own topology while the runtime's current
// one stays put; calls on different topologies run concurrently, issued in a
// different order on every rank.
void test_per_call_topology() {
  const int n = 3;
  const size_t count = 10007;  // several 4 KiB pieces, not a multiple of n
  Cluster_ rts = make_cluster(n, TopologyKind::kStar, 20, 4096);
  const std::vector<TopologyKind> kinds = {TopologyKind::kStar,       TopologyKind::kRing,
                                           TopologyKind::kBinaryTree, TopologyKind::kBinaryTreeStar,
                                           TopologyKind::kClique,     TopologyKind::kAuto};
  std::vector<std::vector<std::vector<float>>> bufs(n, std::vector<std::vector<float>>(kinds.size()));
  std::vector<std::future<Status>> futures;
  for (int r = 0; r < n; ++r) {
    std::vector<size_t> order(kinds.size());
    for (size_t k = 0; k < kinds.size(); ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), std::mt19937(r + 1));
    for (size_t k : order) {
      std::vector<float> &b = bufs[r][k];
      for (size_t i = 0; i < count; ++i) b.push_back(value_of<float>(r, i + k));
      auto p = std::make_shared<std::promise<Status>>();
      futures.push_back(p->get_future());
      Buffer buf{b.data(), b.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(count)}, count}, nullptr};
      rts[r]->all_reduce_on(kinds[k], std::string("per-call/") + topology_name(kinds[k]), buf, ReduceOp::kSum,
                            [p](const Status &s) { p->set_value(s); });
    }
  }
  for (auto &f : futures) CHECK_OK(f.get());
  bool ok = true;
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (size_t i = 0; i < count; ++i) {
      float expect = 0;
      for (int r = 0; r < n; ++r) expect += value_of<float>(r, i + k);
      for (int r = 0; r < n; ++r) ok = ok && bufs[r][k][i] == expect;
    }
  }
  CHECK(ok);
  for (auto &rt : rts) CHECK(rt->topology() == TopologyKind::kStar);

  // Workers that disagree on the topology of one collective get a clear error
  // naming both topologies (not a size mismatch, not the timeout).
  Cluster_ two = make_cluster(2, TopologyKind::kAuto, 30);
  std::vector<float> a(1000, 1), b(1000, 2);
  auto pa = std::make_shared<std::promise<Status>>(), pb = std::make_shared<std::promise<Status>>();
  auto fa = pa->get_future(), fb = pb->get_future();
  two[0]->all_reduce_on(TopologyKind::kStar, "mixed",
                        Buffer{a.data(), a.data(), TensorDesc{DType::kFloat32, {1000}, 1000}, nullptr}, ReduceOp::kSum,
                        [pa](const Status &s) { pa->set_value(s); });
  two[1]->all_reduce_on(TopologyKind::kRing, "mixed",
                        Buffer{b.data(), b.data(), TensorDesc{DType::kFloat32, {1000}, 1000}, nullptr}, ReduceOp::kSum,
                        [pb](const Status &s) { pb->set_value(s); });
  for (Status s : {fa.get(), fb.get()}) {
    CHECK(s.code() == Code::kFailedPrecondition);
    CHECK(s.message().find("'mixed'") != std::string::npos);
    CHECK(s.message().find("STAR") != std::string::npos && s.message().find("RING") != std::string::npos);
  }
  // At once, not after the 30 s timeout: told by the code, not the clock (a
  // timeout ends DeadlineExceeded, never FailedPrecondition naming both).
}

void test_shape_mismatch_fails_fast() {
  Cluster_ rts = make_cluster(3, TopologyKind::kRing, 30);
  std::vector<float> a(10), b(11), c(10);
  std::vector<std::future<Status>> fs;
  std::vector<float> *bufs[] = {&a, &b, &c};
  for (int r = 0; r < 3; ++r) {
    auto p = std::make_shared<std::promise<Status>>();
    fs.push_back(p->get_future());
    std::vector<float> &v = *bufs[r];
    Buffer buf{v.data(), v.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(v.size())}, v.size()}, nullptr};
    rts[r]->all_reduce("mismatch", buf, ReduceOp::kSum, [p](const Status &s) { p->set_value(s); });
  }
  for (auto &f : fs) {
    Status s = f.get();
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message().find("mismatch") != std::string::npos);
    CHECK(s.message().find("float32[10]") != std::string::npos || s.message().find("float32[11]") != std::string::npos);
  }
  // An abort, not the 30 s timeout: InvalidArgument naming the shapes says
  // so (a timeout ends DeadlineExceeded), whatever the host's speed.
}

void test_rooted_and_gather() {
  for (TopologyKind topo : {TopologyKind::kStar, TopologyKind::kRing, TopologyKind::kBinaryTree, TopologyKind::kAuto}) {
    const int n = 4;
    Cluster_ rts = make_cluster(n, topo, 20, 4096);
    for (int root = 0; root < n; ++root) {
      const size_t count = 5000;
      std::vector<std::vector<int32_t>> bufs(n, std::vector<int32_t>(count));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) bufs[r][i] = r * 100000 + static_cast<int32_t>(i);
      std::vector<std::future<Status>> fs;
      for (int r = 0; r < n; ++r) {
        auto p = std::make_shared<std::promise<Status>>();
        fs.push_back(p->get_future());
        Buffer b{bufs[r].data(), bufs[r].data(), TensorDesc{DType::kInt32, {(int64_t)count}, count}, nullptr};
        rts[r]->broadcast("bcast/" + std::to_string(root), b, root, [p](const Status &s) { p->set_value(s); });
      }
      for (auto &f : fs) CHECK_OK(f.get());
      bool ok = true;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) ok = ok && bufs[r][i] == root * 100000 + static_cast<int32_t>(i);
      CHECK(ok);

      // reduce to root: only the root's result is defined.
      std::vector<std::vector<int64_t>> rb(n, std::vector<int64_t>(count, 0));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) rb[r][i] = r + 1;
      fs.clear();
      for (int r = 0; r < n; ++r) {
        auto p = std::make_shared<std::promise<Status>>();
        fs.push_back(p->get_future());
        Buffer b{rb[r].data(), rb[r].data(), TensorDesc{DType::kInt64, {(int64_t)count}, count}, nullptr};
        rts[r]->reduce("reduce/" + std::to_string(root), b, ReduceOp::kSum, root,
                       [p](const Status &s) { p->set_value(s); });
      }
      for (auto &f : fs) CHECK_OK(f.get());
      CHECK(std::all_of(rb[root].begin(), rb[root].end(), [&](int64_t v) { return v == n * (n + 1) / 2; }));
    }
    // all-gather: output region r holds rank r's input.
    const size_t count = 3001;
    std::vector<std::vector<double>> in(n, std::vector<double>(count)), out(n, std::vector<double>(n * count));
    std::vector<std::future<Status>> fs;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) in[r][i] = r + i * 0.5;
      auto p = std::make_shared<std::promise<Status>>();
      fs.push_back(p->get_future());
      Buffer b{in[r].data(), out[r].data(), TensorDesc{DType::kFloat64, {(int64_t)count}, count}, nullptr};
      rts[r]->all_gather("gather", b, [p](const Status &s) { p->set_value(s); });
    }
    for (auto &f : fs) CHECK_OK(f.get());
    bool ok = true;
    for (int r = 0; r < n; ++r)
      for (int src = 0; src < n; ++src)
        for (size_t i = 0; i < count; ++i) ok = ok && out[r][src * count + i] == src + i * 0.5;
    CHECK(ok);
  }
}

// Reduce to a root is half an all-reduce: on a star each non-root sends its
// tensor once and the root sends nothing back. Inputs are never written, and
// the root's result lands in its (separate) output buffer.
void test_reduce_to_root_traffic() {
  const int n = 3;
  const size_t count = 100000;  // 400 KB: one piece at the default chunk size
  const size_t bytes = count * sizeof(float);
  Cluster_ rts = make_cluster(n, TopologyKind::kStar, 20);
  check_all_reduce<float>(rts, 10, ReduceOp::kSum, "warmup");  // connections up
  for (int root : {0, 2}) {
    std::vector<std::vector<uint64_t>> sent_before(n, std::vector<uint64_t>(n));
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) sent_before[r][p] = rts[r]->counters().sent(p);
    std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(count, -1));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) in[r][i] = value_of<float>(r, i);
    std::vector<std::vector<float>> original = in;
    std::vector<std::future<Status>> fs;
    std::string name = "reduce-traffic/" + std::to_string(root);
    for (int r = 0; r < n; ++r) {
      auto p = std::make_shared<std::promise<Status>>();
      fs.push_back(p->get_future());
      Buffer b{in[r].data(), out[r].data(), TensorDesc{DType::kFloat32, {(int64_t)count}, count}, nullptr};
      rts[r]->reduce(name, b, ReduceOp::kMax, root, [p](const Status &s) { p->set_value(s); });
    }
    for (auto &f : fs) CHECK_OK(f.get());
    CHECK(in == original);
    bool ok = true;
    for (size_t i = 0; i < count; ++i) {
      float expect = value_of<float>(0, i);
      for (int r = 1; r < n; ++r) expect = std::max(expect, value_of<float>(r, i));
      ok = ok && out[root][i] == expect;
    }
    CHECK(ok);
    // Done on a sender means its frame has been written, so the counters are final.
    const uint64_t overhead = sizeof(FrameHeader) + name.size() + 8;  // header, key, "#0r"
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        uint64_t delta = rts[r]->counters().sent(p) - sent_before[r][p];
        if (r != root && p == root) {
          CHECK(delta >= bytes && delta <= bytes + overhead);
        } else {
          CHECK(delta == 0);
        }
      }
    }
  }
  // A root outside the cluster fails at once on every worker, naming the key.
  for (auto &rt : rts) {
    std::vector<float> x(4);
    Status s = wait_for([&](DoneCallback d) {
      rt->reduce("bad-root", Buffer{x.data(), x.data(), TensorDesc{DType::kFloat32, {4}, 4}, nullptr}, ReduceOp::kSum,
                 3, d);
    });
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message().find("'bad-root'") != std::string::npos && s.message().find("root 3") != std::string::npos);
  }
}

void test_consensus_barrier_topology_switch() {
  const int n = 3;
  Cluster_ rts = make_cluster(n, TopologyKind::kStar, 20);
  auto run_consensus = [&](const std::string &name, std::vector<std::string> values) {
    std::vector<std::future<std::pair<Status, bool>>> fs;
    for (int r = 0; r < n; ++r) {
      auto p = std::make_shared<std::promise<std::pair<Status, bool>>>();
      fs.push_back(p->get_future());
      rts[r]->consensus(name, std::vector<char>(values[r].begin(), values[r].end()), [p](const Status &s, bool agreed) {
        p->set_value({s, agreed});
      });
    }
    std::vector<bool> out;
    for (auto &f : fs) {
      auto res = f.get();
      CHECK_OK(res.first);
      out.push_back(res.second);
    }
    return out;
  };
  CHECK((run_consensus("c1", {"same", "same", "same"}) == std::vector<bool>{true, true, true}));
  CHECK((run_consensus("c2", {"same", "sane", "same"}) == std::vector<bool>{false, false, false}));
  CHECK((run_consensus("c3", {"short", "longer", "short"}) == std::vector<bool>{false, false, false}));
  CHECK((run_consensus("c4", {"", "", ""}) == std::vector<bool>{true, true, true}));

  // Switch topologies between rounds of concurrent all-reduces.
  for (TopologyKind k : {TopologyKind::kRing, TopologyKind::kClique, TopologyKind::kBinaryTree, TopologyKind::kAuto}) {
    std::vector<std::future<std::pair<Status, bool>>> fs;
    for (int r = 0; r < n; ++r) {
      auto p = std::make_shared<std::promise<std::pair<Status, bool>>>();
      fs.push_back(p->get_future());
      rts[r]->set_topology("switch", k, [p](const Status &s, bool ok) { p->set_value({s, ok}); });
    }
    for (auto &f : fs) {
      auto res = f.get();
      CHECK_OK(res.first);
      CHECK(res.second);
    }
    for (auto &rt : rts) CHECK(rt->topology() == k);
    for (int i = 0; i < 5; ++i)
      check_all_reduce<float>(rts, 20000, ReduceOp::kSum, "after-switch/" + std::to_string(i));
  }
  // Disagreeing workers keep the old topology.
  std::vector<std::future<std::pair<Status, bool>>> fs;
  for (int r = 0; r < n; ++r) {
    auto p = std::make_shared<std::promise<std::pair<Status, bool>>>();
    fs.push_back(p->get_future());
    rts[r]->set_topology("switch", r == 1 ? TopologyKind::kStar : TopologyKind::kRing, [p](const Status &s, bool ok) {
      p->set_value({s, ok});
    });
  }
  for (auto &f : fs) CHECK(!f.get().second);
  for (auto &rt : rts) CHECK(rt->topology() == TopologyKind::kAuto);
}

void test_p2p() {
  Cluster_ rts = make_cluster(2, TopologyKind::kAuto, 20);  // nothing here may time out: 20 s only ends a hang
  std::vector<float> model(1000);
  for (size_t i = 0; i < model.size(); ++i) model[i] = i * 0.25f;
  rts[1]->save("model", 3, model.data(), model.size() * 4);
  model[0] = 42;
  rts[1]->save("model", 4, model.data(), model.size() * 4);
  std::vector<float> got(1000, -1);
  CHECK_OK(wait_for([&](DoneCallback d) { rts[0]->request(1, "model", 3, got.data(), 4000, nullptr, d); }));
  CHECK(got[0] == 0 && got[999] == 999 * 0.25f);
  CHECK_OK(
      wait_for([&](DoneCallback d) { rts[0]->request(1, "model", P2PStore::kLatest, got.data(), 4000, nullptr, d); }));
  CHECK(got[0] == 42);
  Status s = wait_for(
      [&](DoneCallback d) { rts[0]->request(1, "nothing", P2PStore::kLatest, got.data(), 4000, nullptr, d); });
  CHECK(s.code() == Code::kNotFound);
  s = wait_for([&](DoneCallback d) { rts[0]->request(1, "model", 4, got.data(), 400, nullptr, d); });
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK_OK(wait_for([&](DoneCallback d) { rts[1]->request(1, "model", 4, got.data(), 4000, nullptr, d); }));
  CHECK(rts[0]->counters().received(1) > 8000 && rts[1]->counters().sent(0) > 8000);
}

void test_dead_peer_and_timeout() {
  {
    Cluster_ rts = make_cluster(3, TopologyKind::kStar, 60);
    check_all_reduce<float>(rts, 100, ReduceOp::kSum, "warmup");  // connections up
    std::vector<float> a(100, 1), b(100, 1);
    auto pa = std::make_shared<std::promise<Status>>();
    auto pb = std::make_shared<std::promise<Status>>();
    auto fa = pa->get_future(), fb = pb->get_future();
    Buffer ba{a.data(), a.data(), TensorDesc{DType::kFloat32, {100}, 100}, nullptr};
    Buffer bb{b.data(), b.data(), TensorDesc{DType::kFloat32, {100}, 100}, nullptr};
    rts[0]->all_reduce("doomed", ba, ReduceOp::kSum, [pa](const Status &s) { pa->set_value(s); });
    rts[1]->all_reduce("doomed", bb, ReduceOp::kSum, [pb](const Status &s) { pb->set_value(s); });
    rts[2].reset();  // rank 2 dies before contributing
    Status sa = fa.get(), sb = fb.get();
    // Unavailable naming the dead rank, not the 60 s timeout (DeadlineExceeded).
    CHECK(sa.code() == Code::kUnavailable && sb.code() == Code::kUnavailable);
    CHECK(sa.message().find("rank 2") != std::string::npos);
    CHECK(sa.message().find("all_reduce 'doomed'") != std::string::npos);
    CHECK(sb.message().find("all_reduce 'doomed'") != std::string::npos);
  }
  {
    Cluster_ rts = make_cluster(2, TopologyKind::kStar, 1.0);
    std::vector<float> a(10, 1);
    auto start = std::chrono::steady_clock::now();
    Status s = wait_for([&](DoneCallback d) {
      Buffer b{a.data(), a.data(), TensorDesc{DType::kFloat32, {10}, 10}, nullptr};
      rts[0]->all_reduce("lonely", b, ReduceOp::kSum, d);  // rank 1 never joins
    });
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(s.code() == Code::kDeadlineExceeded);
    CHECK(s.message().find("rank 1") != std::string::npos);
    CHECK(secs >= 0.9 && secs < 10);  // at the timeout, not before; later only by how loaded the machine is
  }
}

void test_intruders_are_rejected() {
  std::vector<PeerID> peers = kftest::local_peers(2);
  std::vector<std::unique_ptr<Runtime>> rts(2);
  for (int r = 0; r < 2; ++r) CHECK_OK(Runtime::create(kftest::options(peers, r), &rts[r]));
  auto connect_tcp = [&](uint16_t port) {
    Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(::connect(fd.get(), reinterpret_cast<struct sockaddr *>(&a), sizeof(a)) == 0);
    return fd;
  };
  {  // garbage
    Fd fd = connect_tcp(peers[0].port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    std::string err;
    send_all(fd.get(), junk, sizeof(junk), &err);
  }
  {  // the right protocol with the wrong secret, claiming to be rank 1
    Fd fd = connect_tcp(peers[0].port);
    std::string err;
    CHECK(!client_handshake(fd.get(), "wrong-secret", {kftest::kTestJobId, 0}, peers[1].str(), nullptr, &err));
  }
  {  // the right secret but not a member of the cluster
    Fd fd = connect_tcp(peers[0].port);
    std::string err;
    client_handshake(fd.get(), "test-secret", {kftest::kTestJobId, 0}, "127.0.0.1:1", nullptr, &err);
  }
  {  // the right secret, claiming to be rank 1, but a leftover of another run
    Fd fd = connect_tcp(peers[0].port);
    std::string err;
    CHECK(!client_handshake(fd.get(), "test-secret", {"old-run", 0}, peers[1].str(), nullptr, &err));
    CHECK(err.find("server belongs to job 'test-job'") != std::string::npos);
  }
  {  // ... or of another cluster version: refused, but neither counted nor
     // logged as a stranger (during a resize peers switch a few ms apart)
    Fd fd = connect_tcp(peers[0].port);
    std::string err;
    VersionSkew skew = VersionSkew::kNone;
    CHECK(!client_handshake(fd.get(), "test-secret", {kftest::kTestJobId, 1}, peers[1].str(), nullptr, &err,
                            kHandshakeTimeoutSeconds, &skew));
    CHECK(err.find("at cluster version 0") != std::string::npos && skew == VersionSkew::kPeerBehind);
  }
  // Counted as each server thread finishes (milliseconds; 30 s rules out
  // "never"). The extra 100 ms only gives a wrongly counted fifth (the other
  // cluster version) a chance to show: it cannot fail a correct count.
  CHECK(kftest::eventually([&] { return rts[0]->rejected_connections() >= 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(rts[0]->rejected_connections() == 4);
  check_all_reduce<float>(rts, 1000, ReduceOp::kSum, "after-intruders");  // the job carries on
}

void test_half_precision() {
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 10);
  // float16 1.5 + 2.25 = 3.75, bfloat16 1.5 + 2.25 = 3.75 (exact in both).
  uint16_t h[2][3] = {{0x3e00, 0x3c00, 0x0001}, {0x4080, 0x3c00, 0x0001}};  // 1.5, 1, 2^-24 | 2.25, 1, 2^-24
  uint16_t b[2][2] = {{0x3fc0, 0x3f80}, {0x4010, 0x3f80}};                  // 1.5, 1 | 2.25, 1
  std::vector<std::future<Status>> fs;
  for (int r = 0; r < 2; ++r) {
    auto p1 = std::make_shared<std::promise<Status>>(), p2 = std::make_shared<std::promise<Status>>();
    fs.push_back(p1->get_future());
    fs.push_back(p2->get_future());
    rts[r]->all_reduce("h", Buffer{h[r], h[r], TensorDesc{DType::kFloat16, {3}, 3}, nullptr}, ReduceOp::kSum,
                       [p1](const Status &s) { p1->set_value(s); });
    rts[r]->all_reduce("b", Buffer{b[r], b[r], TensorDesc{DType::kBFloat16, {2}, 2}, nullptr}, ReduceOp::kSum,
                       [p2](const Status &s) { p2->set_value(s); });
  }
  for (auto &f : fs) CHECK_OK(f.get());
  for (int r = 0; r < 2; ++r) {
    CHECK(h[r][0] == 0x4380);  // 3.75
    CHECK(h[r][1] == 0x4000);  // 2.0
    CHECK(h[r][2] == 0x0002);  // 2^-23, subnormal
    CHECK(b[r][0] == 0x4070);  // 3.75
    CHECK(b[r][1] == 0x4000);  // 2.0
  }
}

void test_scale_for_mean() {
  float f[3] = {3.0f, -6.0f, 1.5f};
  scale_inplace(f, 3, DType::kFloat32, 1.0 / 3);
  CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0.5f);
  double d[2] = {4.0, 1.0};
  scale_inplace(d, 2, DType::kFloat64, 0.25);
  CHECK(d[0] == 1.0 && d[1] == 0.25);
  uint16_t h[2] = {0x4400, 0x3c00};  // float16 4.0, 1.0
  scale_inplace(h, 2, DType::kFloat16, 0.5);
  CHECK(h[0] == 0x4000 && h[1] == 0x3800);  // 2.0, 0.5
  uint16_t b[1] = {0x4080};                 // bfloat16 4.0
  scale_inplace(b, 1, DType::kBFloat16, 0.25);
  CHECK(b[0] == 0x3f80);  // 1.0
  int32_t i[1] = {7};
  scale_inplace(i, 1, DType::kInt32, 0.5);  // integers are left alone
  CHECK(i[0] == 7);
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"all_reduce matrix", test_all_reduce_matrix},
      {"many concurrent in random order", test_many_concurrent_in_random_order},
      {"per-call topology", test_per_call_topology},
      {"shape mismatch fails fast", test_shape_mismatch_fails_fast},
      {"broadcast, reduce, all_gather", test_rooted_and_gather},
      {"reduce to root: result and traffic", test_reduce_to_root_traffic},
      {"consensus, barrier, set_topology", test_consensus_barrier_topology_switch},
      {"p2p store", test_p2p},
      {"dead peer and timeout", test_dead_peer_and_timeout},
      {"intruders rejected", test_intruders_are_rejected},
      {"half precision", test_half_precision},
      {"scale for mean", test_scale_for_mean},
  });
}
