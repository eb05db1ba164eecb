// Point-to-point tests for the parameter-server primitives: push/take into
// named accumulators and requests for at least a version of a saved blob, on
// the stores alone and between runtimes over real sockets.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

TensorDesc desc_of(DType dt, size_t count) { return TensorDesc{dt, {static_cast<int64_t>(count)}, count}; }

// ---------------------------------------------------------------- the store alone

void test_accumulator_sums_every_dtype() {
  AccumulatorStore store;
  int64_t pushes = -1;
  {  // nothing pushed yet: zeros and 0
    float out[3] = {7, 7, 7};
    CHECK_OK(store.take("f32", DType::kFloat32, 3, out, &pushes));
    CHECK(pushes == 0 && out[0] == 0 && out[1] == 0 && out[2] == 0);
  }
  {
    float a[3] = {1.5f, -2, 0.25f}, b[3] = {2.5f, 4, 0.5f}, out[3];
    store.add("f32", "rank 1", DType::kFloat32, 3, a);
    store.add("f32", "rank 2", DType::kFloat32, 3, b);
    store.add("f32", "rank 1", DType::kFloat32, 3, a);
    CHECK_OK(store.take("f32", DType::kFloat32, 3, out, &pushes));
    CHECK(pushes == 3 && out[0] == 5.5f && out[1] == 0 && out[2] == 1.0f);
    // Taken: the next take starts from empty.
    CHECK_OK(store.take("f32", DType::kFloat32, 3, out, &pushes));
    CHECK(pushes == 0 && out[0] == 0 && out[1] == 0 && out[2] == 0);
  }
  {
    double a[2] = {0.1, 1e300}, out[2];
    store.add("f64", "rank 1", DType::kFloat64, 2, a);
    store.add("f64", "rank 1", DType::kFloat64, 2, a);
    CHECK_OK(store.take("f64", DType::kFloat64, 2, out, &pushes));
    CHECK(pushes == 2 && out[0] == 0.1 + 0.1 && out[1] == 2e300);
  }
  {
    int32_t a[2] = {2147483647, -5}, b[2] = {1, 5}, out[2];
    store.add("i32", "rank 1", DType::kInt32, 2, a);
    store.add("i32", "rank 2", DType::kInt32, 2, b);
    CHECK_OK(store.take("i32", DType::kInt32, 2, out, &pushes));
    CHECK(pushes == 2 && out[0] == INT32_MIN && out[1] == 0);  // wraps like TF's integer add
  }
  {
    int64_t a[1] = {int64_t(1) << 40}, out[1];
    for (int i = 0; i < 5; ++i) store.add("i64", "rank 1", DType::kInt64, 1, a);
    CHECK_OK(store.take("i64", DType::kInt64, 1, out, &pushes));
    CHECK(pushes == 5 && out[0] == 5 * (int64_t(1) << 40));
  }
  {  // half types: 1.5 + 2.25 = 3.75 exactly in both
    uint16_t h1[2] = {0x3e00, 0x3c00}, h2[2] = {0x4080, 0x3c00}, hout[2];
    store.add("f16", "rank 1", DType::kFloat16, 2, h1);
    store.add("f16", "rank 2", DType::kFloat16, 2, h2);
    CHECK_OK(store.take("f16", DType::kFloat16, 2, hout, &pushes));
    CHECK(pushes == 2 && hout[0] == 0x4380 && hout[1] == 0x4000);
    uint16_t b1[1] = {0x3fc0}, b2[1] = {0x4010}, bout[1];
    store.add("bf16", "rank 1", DType::kBFloat16, 1, b1);
    store.add("bf16", "rank 2", DType::kBFloat16, 1, b2);
    CHECK_OK(store.take("bf16", DType::kBFloat16, 1, bout, &pushes));
    CHECK(pushes == 2 && bout[0] == 0x4070);
  }
  {  // empty tensors count pushes too
    store.add("empty", "rank 1", DType::kFloat32, 0, nullptr);
    CHECK_OK(store.take("empty", DType::kFloat32, 0, nullptr, &pushes));
    CHECK(pushes == 1);
  }
}

void test_accumulator_mismatches() {
  AccumulatorStore store;
  int64_t pushes = -1;
  float good[4] = {1, 2, 3, 4}, out[4];
  int32_t wrong_dtype[4] = {1, 1, 1, 1};
  float wrong_size[5] = {9, 9, 9, 9, 9};
  store.add("w", "rank 1 (h:1)", DType::kFloat32, 4, good);
  store.add("w", "rank 2 (h:2)", DType::kFloat32, 5, wrong_size);  // dropped
  store.add("w", "rank 3 (h:3)", DType::kInt32, 4, wrong_dtype);   // dropped
  store.add("w", "rank 1 (h:1)", DType::kFloat32, 4, good);
  // The take after a dropped push fails, naming the first sender and both sizes...
  Status s = store.take("w", DType::kFloat32, 4, out, &pushes);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(contains(s.message(), "'w'") && contains(s.message(), "rank 2 (h:2)"));
  CHECK(contains(s.message(), "5 float32 elements (20 bytes)") &&
        contains(s.message(), "4 float32 elements (16 bytes)"));
  CHECK(contains(s.message(), "1 more dropped"));
  // ... and leaves the good pushes for the next take: nothing was corrupted.
  CHECK_OK(store.take("w", DType::kFloat32, 4, out, &pushes));
  CHECK(pushes == 2 && out[0] == 2 && out[1] == 4 && out[2] == 6 && out[3] == 8);

  // A take that does not match the accumulator fails and keeps the sum.
  store.add("w", "rank 1 (h:1)", DType::kFloat32, 4, good);
  float small[2];
  s = store.take("w", DType::kFloat32, 2, small, &pushes);
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "2 float32 elements (8 bytes)"));
  CHECK_OK(store.take("w", DType::kFloat32, 4, out, &pushes));
  CHECK(pushes == 1 && out[3] == 4);

  // A take fixes the size first: a push that disagrees with it is the one dropped.
  double declared[3];
  CHECK_OK(store.take("declared", DType::kFloat64, 3, declared, &pushes));
  store.add("declared", "rank 2 (h:2)", DType::kFloat32, 4, good);
  s = store.take("declared", DType::kFloat64, 3, declared, &pushes);
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "rank 2 (h:2)") &&
        contains(s.message(), "first take"));
}

// Takes racing with pushes: every push is taken exactly once and whole.
void test_accumulator_concurrent() {
  AccumulatorStore store;
  const size_t count = 10000;
  const int threads = 3, per_thread = 200;
  std::vector<int64_t> ones(count, 1);
  std::vector<std::thread> pushers;
  for (int t = 0; t < threads; ++t) {
    pushers.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) store.add("c", "rank 1", DType::kInt64, count, ones.data());
    });
  }
  int64_t total = 0;
  bool whole = true, all_ok = true;
  std::vector<int64_t> out(count);
  auto take_once = [&] {
    int64_t pushes = 0;
    all_ok = all_ok && store.take("c", DType::kInt64, count, out.data(), &pushes).ok();
    for (int64_t v : out) whole = whole && v == pushes;  // no half-added push
    total += pushes;
  };
  for (int i = 0; i < 200 && total < threads * per_thread; ++i) {
    take_once();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (auto &t : pushers) t.join();
  take_once();
  CHECK(all_ok);
  CHECK(whole);
  CHECK(total == threads * per_thread);
}

// ---------------------------------------------------------------- between runtimes

void barrier_all(Cluster_ &rts, const std::string &name) {
  std::vector<std::future<Status>> fs;
  for (auto &rt : rts) {
    auto p = std::make_shared<std::promise<Status>>();
    fs.push_back(p->get_future());
    rt->barrier(name, [p](const Status &s) { p->set_value(s); });
  }
  for (auto &f : fs) CHECK_OK(f.get());
}

void test_push_take() {
  const int n = 3, rounds = 7;
  const size_t count = 300001;  // over the inline-send limit: goes through the sender thread
  Cluster_ rts = make_cluster(n, TopologyKind::kStar, 20);
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) data[r][i] = static_cast<float>(r * 10 + static_cast<int>(i % 5));
  // Ranks 1 and 2 push concurrently, without waiting for each push; rank 0 pushes to itself.
  std::vector<std::future<Status>> fs;
  for (int round = 0; round < rounds; ++round) {
    for (int r = 0; r < n; ++r) {
      auto p = std::make_shared<std::promise<Status>>();
      fs.push_back(p->get_future());
      Buffer b{data[r].data(), nullptr, desc_of(DType::kFloat32, count), nullptr};
      rts[r]->push(0, "grad", b, [p](const Status &s) { p->set_value(s); });
    }
  }
  for (auto &f : fs) CHECK_OK(f.get());
  // Frames on a link arrive in order and a push is added before the next frame
  // is read, so once rank 0 is past a barrier it holds every earlier push.
  barrier_all(rts, "pushed");
  std::vector<float> sum(count, -1);
  int64_t pushes = -1;
  CHECK_OK(rts[0]->take("grad", sum.data(), desc_of(DType::kFloat32, count), &pushes));
  CHECK(pushes == n * rounds);
  bool ok = true;
  for (size_t i = 0; i < count; ++i) {
    float expect = 0;
    for (int r = 0; r < n; ++r) expect += rounds * data[r][i];
    ok = ok && sum[i] == expect;
  }
  CHECK(ok);
  CHECK_OK(rts[0]->take("grad", sum.data(), desc_of(DType::kFloat32, count), &pushes));
  CHECK(pushes == 0 && sum[0] == 0 && sum[count - 1] == 0);
  // Other workers hold nothing under that name.
  CHECK_OK(rts[1]->take("grad", sum.data(), desc_of(DType::kFloat32, count), &pushes));
  CHECK(pushes == 0);

  // A push of the wrong size is dropped; the take on the receiver names the sender.
  std::vector<float> wrong(count + 1, 1);
  CHECK_OK(wait_for([&](DoneCallback d) {
    rts[2]->push(0, "grad", Buffer{wrong.data(), nullptr, desc_of(DType::kFloat32, count + 1), nullptr}, d);
  }));
  CHECK_OK(wait_for([&](DoneCallback d) {
    rts[1]->push(0, "grad", Buffer{data[1].data(), nullptr, desc_of(DType::kFloat32, count), nullptr}, d);
  }));
  barrier_all(rts, "pushed-wrong");
  Status s = rts[0]->take("grad", sum.data(), desc_of(DType::kFloat32, count), &pushes);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(contains(s.message(), "'grad'") && contains(s.message(), "rank 2 (127.0.0.1:"));
  CHECK(contains(s.message(), std::to_string(count + 1) + " float32") &&
        contains(s.message(), std::to_string(count) + " float32"));
  CHECK_OK(rts[0]->take("grad", sum.data(), desc_of(DType::kFloat32, count), &pushes));
  CHECK(pushes == 1 && sum[7] == data[1][7]);

  // Bad ranks fail at once.
  s = wait_for([&](DoneCallback d) {
    rts[1]->push(3, "grad", Buffer{data[1].data(), nullptr, desc_of(DType::kFloat32, 1), nullptr}, d);
  });
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "rank 3"));
}

void test_push_to_dead_peer() {
  const double timeout = 2.0;
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, timeout);
  std::vector<float> x(1000, 1);
  CHECK_OK(wait_for([&](DoneCallback d) {
    rts[0]->push(1, "g", Buffer{x.data(), nullptr, desc_of(DType::kFloat32, 1000), nullptr}, d);
  }));
  rts[1].reset();
  auto start = std::chrono::steady_clock::now();
  // The first push after the death may still fit in the socket buffer; one of
  // the next ones fails (as soon as rank 0 has seen rank 1 go: milliseconds;
  // pushes until then succeed, so keep pushing for up to 30 s), and none
  // waits longer than the timeout (10x: a loaded machine only delays it).
  Status s;
  double slowest = 0;
  while (s.ok() && seconds_since(start) < 30) {
    auto t = std::chrono::steady_clock::now();
    s = wait_for([&](DoneCallback d) {
      rts[0]->push(1, "g", Buffer{x.data(), nullptr, desc_of(DType::kFloat32, 1000), nullptr}, d);
    });
    slowest = std::max(slowest, seconds_since(t));
    if (s.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(s.code() == Code::kUnavailable || s.code() == Code::kDeadlineExceeded);
  CHECK(contains(s.message(), "push 'g' to rank 1"));
  CHECK(slowest < 10 * timeout);
}

// A sender that dies half-way through a push adds nothing: the receiver
// neither blocks nor takes a partial sum.
void test_push_cut_short() {
  std::vector<PeerID> peers = kftest::local_peers(2);
  std::unique_ptr<Runtime> rt;
  // A timeout far above the 10 s this test waits at most: a receiver that
  // waited for the rest of the cut frame until its timeout would show.
  const double timeout = 60;
  CHECK_OK(Runtime::create(kftest::options(peers, 0, TopologyKind::kStar, timeout), &rt));
  const size_t count = 1000;
  auto send_push = [&](int fd, const std::vector<float> &v, size_t payload_bytes) {
    FrameHeader h;
    h.type = static_cast<uint8_t>(FrameType::kPush);
    h.dtype = static_cast<uint8_t>(DType::kFloat32);
    h.ndims = 1;
    h.dims[0] = static_cast<int64_t>(count);
    h.key_len = 1;
    h.payload_len = count * sizeof(float);
    std::string err;
    CHECK(send_all(fd, &h, sizeof(h), &err) && send_all(fd, "w", 1, &err));
    CHECK(send_all(fd, v.data(), payload_bytes, &err));
  };
  {  // impersonate rank 1 (we know the secret): one whole push, then half of one
    Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(peers[0].port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(::connect(fd.get(), reinterpret_cast<struct sockaddr *>(&a), sizeof(a)) == 0);
    std::string err;
    CHECK(client_handshake(fd.get(), "test-secret", {kftest::kTestJobId, 0}, peers[1].str(), nullptr, &err));
    send_push(fd.get(), std::vector<float>(count, 2), count * sizeof(float));
    send_push(fd.get(), std::vector<float>(count, 100), count * sizeof(float) / 2);
  }  // closed mid-frame
  // The receiver gives up on the cut frame at once (end of stream), not
  // after its timeout: it then counts the sender lost. Milliseconds; 10 s
  // only rules out waiting for the 60 s timeout (or forever). The whole
  // push was added before the cut one was read, and the cut one never is.
  CHECK(kftest::eventually([&] { return !rt->lost_peers().empty(); }, 10));
  std::vector<float> out(count, -1);
  int64_t pushes = -1;
  auto start = std::chrono::steady_clock::now();
  CHECK_OK(rt->take("w", out.data(), desc_of(DType::kFloat32, count), &pushes));
  CHECK(seconds_since(start) < 10);  // take never waits (10 s: a hang, not a slow machine)
  CHECK(pushes == 1 && out[0] == 2 && out[count - 1] == 2);
}

// ---------------------------------------------------------------- at least a version

void test_store_when_saved() {
  P2PStore store;
  auto blob_of = [](uint64_t v) { return make_blob(std::vector<char>(1, static_cast<char>(v))); };
  std::vector<std::pair<int, uint64_t>> calls;  // (which waiter, version)
  auto waiter = [&](int which) {
    return [&calls, which](uint64_t v, Blob b) {
      CHECK(b && (*b)[0] == static_cast<char>(v));
      calls.push_back({which, v});
    };
  };
  uint64_t t1 = store.when_saved("m", 3, waiter(1));
  uint64_t t2 = store.when_saved("m", 5, waiter(2));
  uint64_t t3 = store.when_saved("m", 9, waiter(3));
  CHECK(t1 != 0 && t2 != 0 && t3 != 0 && store.waiting() == 3);
  store.save("m", 1, blob_of(1));
  store.save("other", 7, blob_of(7));
  CHECK(calls.empty());
  store.save("m", 6, blob_of(6));  // wakes both waiters it satisfies, with the newest version
  CHECK((calls == std::vector<std::pair<int, uint64_t>>{{1, 6}, {2, 6}}));
  CHECK(store.waiting() == 1);
  CHECK(!store.cancel("m", t1));  // already ran
  CHECK(store.cancel("m", t3) && store.waiting() == 0);
  store.save("m", 10, blob_of(10));
  CHECK(calls.size() == 2);
  // Available already: called at once, with the newest version.
  CHECK(store.when_saved("m", 2, waiter(4)) == 0);
  CHECK(calls.back() == std::make_pair(4, uint64_t(10)));
  uint64_t found = 0;
  CHECK(store.get("m", P2PStore::kLatest, &found) && found == 10);
}

void test_store_erase_prefix() {
  P2PStore store;
  auto blob = make_blob(std::vector<char>(3, 'x'));
  for (const char *name : {"state/0", "state/1", "state0", "other/state/0"}) {
    store.save(name, 1, blob);
    store.save(name, 2, blob);
  }
  store.erase_prefix("state/");
  CHECK(!store.get("state/0", P2PStore::kLatest) && !store.get("state/1", 1));
  CHECK(store.get("state0", 2) && store.get("other/state/0", 1));  // only names that start with the prefix
  store.save("state/0", 3, blob);                                  // saved again after the erase
  uint64_t found = 0;
  CHECK(store.get("state/0", P2PStore::kLatest, &found) && found == 3);
}

// A replaced strategy plan's stale parameter servers leave blobs, accumulators and tables under its
// prefix; forget() drops all three kinds, and nothing outside the prefix.
void test_forget_drops_blobs_accumulators_and_tables() {
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 20);
  Runtime &rt = *rts[0];
  float x[4] = {1, 2, 3, 4};
  const RowsDesc rows{DType::kFloat32, 2, 2};  // 2 rows of 2 floats
  for (const std::string prefix : {"opt/p0/", "opt/p1/"}) {
    rt.save(prefix + "v0/value", 1, x, sizeof(x));
    auto pushed = std::make_shared<std::promise<Status>>();
    std::future<Status> done = pushed->get_future();
    rts[1]->push(0, prefix + "v0/grad", Buffer{x, nullptr, desc_of(DType::kFloat32, 4), nullptr},
                 [pushed](const Status &s) { pushed->set_value(s); });
    CHECK_OK(done.get());
    CHECK_OK(rt.save_rows(prefix + "v1/value", 1, x, rows, nullptr, 0));
  }
  barrier_all(rts, "pushed");  // rank 0 has added both pushes
  CHECK(rt.stored_names() == 6);
  rt.forget("opt/p0/");
  CHECK(rt.stored_names() == 3);
  float sum[4] = {0, 0, 0, 0};
  int64_t pushes = -1;
  CHECK_OK(rt.take("opt/p1/v0/grad", sum, desc_of(DType::kFloat32, 4), &pushes));
  CHECK(pushes == 1 && sum[3] == 4);  // the other plan's push is still there
  CHECK_OK(rt.take("opt/p0/v0/grad", sum, desc_of(DType::kFloat32, 4), &pushes));
  CHECK(pushes == 0 && sum[3] == 0);  // the forgotten one starts again from empty
}

void test_store_keeps_a_views_owner_alive() {
  auto owner = std::make_shared<std::vector<char>>(std::vector<char>{'a', 'b', 'c'});
  std::weak_ptr<std::vector<char>> watch = owner;
  P2PStore store;
  store.save("view", 1, std::make_shared<const BlobBytes>(owner->data() + 1, 2, owner));
  owner.reset();
  CHECK(!watch.expired());  // the blob keeps the memory it shows
  Blob b = store.get("view", 1);
  CHECK(b && b->size() == 2 && (*b)[0] == 'b' && (*b)[1] == 'c');
  b.reset();
  store.erase_prefix("view");
  CHECK(watch.expired());  // and lets it go with the last reference
}

// Saves versions 1..last of "clock" (one int64 holding the version) every `gap`.
std::thread save_versions(Runtime &rt, int last, std::chrono::milliseconds gap,
                          std::vector<std::chrono::steady_clock::time_point> *saved_at) {
  return std::thread([&rt, last, gap, saved_at] {
    for (int64_t v = 1; v <= last; ++v) {
      std::this_thread::sleep_for(gap);
      (*saved_at)[v] = std::chrono::steady_clock::now();
      rt.save("clock", static_cast<uint64_t>(v), &v, sizeof(v));
    }
  });
}

void test_request_at_least() {
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, 20);
  std::vector<std::chrono::steady_clock::time_point> saved_at(6);
  std::thread saver = save_versions(*rts[0], 5, std::chrono::milliseconds(100), &saved_at);
  int64_t value = -1;
  uint64_t version = 0;
  Status s = wait_for([&](DoneCallback d) {
    rts[1]->request_at_least(0, "clock", 3, &value, sizeof(value), nullptr, [&, d](const Status &st, uint64_t v) {
      version = v;
      d(st);
    });
  });
  auto got_at = std::chrono::steady_clock::now();
  saver.join();
  CHECK_OK(s);
  CHECK(version >= 3 && value == static_cast<int64_t>(version));  // consistent, not older than asked
  CHECK(got_at >= saved_at[3]);                                   // and not before it existed
  CHECK(rts[0]->parked_requests() == 0);

  // Already there: the newest one, at once.
  s = wait_for([&](DoneCallback d) {
    rts[1]->request_at_least(0, "clock", 2, &value, sizeof(value), nullptr, [&, d](const Status &st, uint64_t v) {
      version = v;
      d(st);
    });
  });
  // At once, not parked until a newer save: none comes, so a parked request
  // would end DeadlineExceeded at the 20 s timeout, not OK with version 5.
  CHECK_OK(s);
  CHECK(version == 5 && value == 5);

  // From ourselves: waits for our own save.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int64_t v = 8;
    rts[1]->save("own", 8, &v, sizeof(v));
  });
  s = wait_for([&](DoneCallback d) {
    rts[1]->request_at_least(1, "own", 7, &value, sizeof(value), nullptr, [&, d](const Status &st, uint64_t v) {
      version = v;
      d(st);
    });
  });
  later.join();
  CHECK_OK(s);
  CHECK(version == 8 && value == 8 && rts[1]->parked_requests() == 0);

  // The saved blob has another size: InvalidArgument, like request().
  int32_t small = 0;
  s = wait_for([&](DoneCallback d) {
    rts[1]->request_at_least(0, "clock", 1, &small, sizeof(small), nullptr, [d](const Status &st, uint64_t) { d(st); });
  });
  CHECK(s.code() == Code::kInvalidArgument && contains(s.message(), "8 bytes"));
}

void test_request_at_least_times_out() {
  const double timeout = 1.0;
  Cluster_ rts = make_cluster(2, TopologyKind::kStar, timeout);
  int64_t v = 1, value = -1;
  rts[0]->save("clock", 1, &v, sizeof(v));
  for (int peer : {0, 1}) {  // a peer that never saves it, and ourselves
    auto start = std::chrono::steady_clock::now();
    Status s = wait_for([&](DoneCallback d) {
      rts[1]->request_at_least(peer, "clock", 100, &value, sizeof(value), nullptr,
                               [d](const Status &st, uint64_t) { d(st); });
    });
    double secs = seconds_since(start);
    CHECK(s.code() == Code::kDeadlineExceeded);
    CHECK(contains(s.message(), "'clock'") && contains(s.message(), ">= 100") &&
          contains(s.message(), "rank " + std::to_string(peer)));
    // Not before the timeout, and not long after it (10x: a loaded machine
    // only delays the watchdog; a request nobody ends would pass that).
    CHECK(secs >= 0.9 * timeout && secs < 10 * timeout);
    CHECK(value == -1);
  }
  // The server's own timeout answers the parked request, so nothing is left
  // behind on either side (once the server's timeout and its answer have
  // come: about now; 30 s rules out "never").
  CHECK(kftest::eventually([&] {
    for (auto &rt : rts) {
      if (rt->parked_requests() != 0 || rt->pending_messages() != 0) return false;
    }
    return true;
  }));
  // A save after the timeout goes nowhere.
  v = 100;
  rts[0]->save("clock", 100, &v, sizeof(v));
  CHECK(value == -1);
}

void test_request_at_least_dead_peers() {
  {  // the server dies while we wait: Unavailable, fast
    // Fast: as soon as the requester sees the server go, not after the 60 s
    // timeout (which would end it DeadlineExceeded, checked below).
    const double timeout = 60;
    Cluster_ rts = make_cluster(2, TopologyKind::kStar, timeout);
    int64_t v = 1, value = -1;
    rts[0]->save("clock", 1, &v, sizeof(v));
    CHECK_OK(wait_for([&](DoneCallback d) {
      rts[1]->request_at_least(0, "clock", 1, &value, sizeof(value), nullptr,
                               [d](const Status &st, uint64_t) { d(st); });
    }));
    auto p = std::make_shared<std::promise<Status>>();
    auto f = p->get_future();
    rts[1]->request_at_least(0, "clock", 50, &value, sizeof(value), nullptr,
                             [p](const Status &st, uint64_t) { p->set_value(st); });
    // Parked on the server once the request got there (milliseconds).
    CHECK(kftest::eventually([&] { return rts[0]->parked_requests() == 1; }));
    rts[0].reset();
    Status s = f.get();
    // Unavailable: the requester saw the server go; the 60 s timeout would
    // have ended it DeadlineExceeded (the code tells, not the clock).
    CHECK(s.code() == Code::kUnavailable && contains(s.message(), "'clock' version >= 50 from rank 0"));
  }
  {  // the requester dies: the server forgets its parked request
    Cluster_ rts = make_cluster(2, TopologyKind::kStar, 60);
    int64_t v = 1;
    rts[0]->save("clock", 1, &v, sizeof(v));
    auto value = std::make_shared<int64_t>(-1);
    rts[1]->request_at_least(0, "clock", 50, value.get(), sizeof(int64_t), value, [](const Status &, uint64_t) {});
    CHECK(kftest::eventually([&] { return rts[0]->parked_requests() == 1; }));
    rts[1].reset();
    // Forgotten once the server sees the requester go (milliseconds), long
    // before the 60 s timeout would answer it: 30 s tells them apart.
    CHECK(kftest::eventually([&] { return rts[0]->parked_requests() == 0; }));
    v = 50;
    rts[0]->save("clock", 50, &v, sizeof(v));  // nobody to answer: must not crash
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"accumulator sums every dtype", test_accumulator_sums_every_dtype},
      {"accumulator mismatches", test_accumulator_mismatches},
      {"accumulator push/take race", test_accumulator_concurrent},
      {"push and take", test_push_take},
      {"push to a dead peer", test_push_to_dead_peer},
      {"push cut short", test_push_cut_short},
      {"store: wait for a version", test_store_when_saved},
      {"store: erase by prefix", test_store_erase_prefix},
      {"store: a view keeps its owner", test_store_keeps_a_views_owner_alive},
      {"forget: blobs, accumulators and tables", test_forget_drops_blobs_accumulators_and_tables},
      {"request at least a version", test_request_at_least},
      {"request at least: timeout", test_request_at_least_times_out},
      {"request at least: dead peers", test_request_at_least_dead_peers},
  });
}
