// libFuzzer target: one frame as a worker receives it from an authenticated
// peer. The input is the raw bytes after the handshake: a FrameHeader, the key,
// then the payload. Like Transport::serve_connection it checks the header
// (check_frame_header), reads the key, then hands the frame to a real
// Runtime's frame handler with a reader over the rest of the input, so every frame
// kind is reached: collective pieces, aborts, p2p requests and responses,
// pushes, row pushes, goodbyes. Rank 1 of the 2-peer cluster is a live
// runtime too, so replies (p2p responses, rows) travel over real sockets.
//
// State a frame leaves behind (queued pieces, accumulators) is legitimate:
// the cluster is rebuilt every kRebuildEvery inputs so that the fuzzer's
// memory limits measure what one frame can make a worker allocate.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cpp/test_util.h"
#include "frame.h"
#include "runtime.h"

namespace {

constexpr int kRebuildEvery = 2000;

struct Cluster {
  std::vector<std::unique_ptr<kungfu::Runtime>> rts;
  int inputs = 0;

  void build() {
    rts.clear();
    // A short timeout: parked p2p requests and pending sends expire quickly.
    rts = kftest::make_cluster(2, kungfu::TopologyKind::kAuto, /*timeout=*/1.0);
    // Something to serve: a blob at versions 1 and 2 and a 4x2 float table.
    float blob[4] = {1, 2, 3, 4};
    rts[0]->save("blob", 1, blob, sizeof(blob));
    rts[0]->save("blob", 2, blob, sizeof(blob));
    kungfu::RowsDesc desc;
    desc.dtype = kungfu::DType::kFloat32;
    desc.num_rows = 4;
    desc.row_len = 2;
    float table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int64_t changed[1] = {2};
    rts[0]->save_rows("table", 1, table, desc, changed, 1);
  }
};

Cluster &cluster() {
  static Cluster *c = [] {
    auto *c = new Cluster;  // never destroyed: libFuzzer exits without unwinding
    c->build();
    return c;
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Cluster &c = cluster();
  if (++c.inputs % kRebuildEvery == 0) c.build();
  kungfu::Runtime &rt = *c.rts[0];

  kungfu::FrameHeader h;
  if (size < sizeof(h)) return 0;
  std::memcpy(&h, data, sizeof(h));
  data += sizeof(h);
  size -= sizeof(h);
  if (!kungfu::check_frame_header(h).ok()) return 0;  // the transport drops the connection
  if (h.key_len > size) return 0;                     // the connection ends inside the key
  std::string key(reinterpret_cast<const char *>(data), h.key_len);
  data += h.key_len;
  size -= h.key_len;

  // The transport's reader: never past payload_len; the input's end is the connection's end.
  uint64_t consumed = 0;
  kungfu::PartialReader read = [&](void *dst, size_t len) {
    if (consumed + len > h.payload_len || consumed + len > size) return false;
    if (len == 0) return true;  // dst may be null then (an empty buffer)
    std::memcpy(dst, data + consumed, len);
    consumed += len;
    return true;
  };
  // The first push of rows into a table accumulator sizes the table from the
  // header (dims = {rows, row length}): that allocation is what the peer
  // claims, not what it sends, and is trusted from an authenticated peer of
  // the job (a real embedding table can be gigabytes). Claims of up to 64 MiB
  // are fuzzed; larger ones would only measure the claim.
  if (h.type == static_cast<uint8_t>(kungfu::FrameType::kPushRows) && h.ndims == 2 && h.dims[0] > 0 && h.dims[1] > 0 &&
      static_cast<uint64_t>(h.dims[0]) > (uint64_t(64) << 20) / 8 / static_cast<uint64_t>(h.dims[1])) {
    return 0;
  }
  const int src = 1;
  kungfu::FrameHandler &handler = rt.frame_handler();
  if (h.type == static_cast<uint8_t>(kungfu::FrameType::kGoodbye)) {
    handler.on_peer_left(src, kungfu::Unavailable("rank 1 left the cluster"));
  } else if (h.cluster_version == rt.cluster_version()) {
    handler.on_frame(src, h, std::move(key), read);
  }
  return 0;
}
