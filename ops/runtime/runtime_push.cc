// Pushes into a peer's accumulators (asynchronous parameter servers), dense
// and by rows, and taking what was pushed here.
#include "runtime.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "peer_op.h"

namespace kungfu {

void Runtime::push(int peer, const std::string &name, Buffer buf, DoneCallback done) {
  GenPtr g = gen();
  std::string what = "push '" + name + "' to " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) {
    return done(InvalidArgument(what + ": no such rank in a cluster of " + std::to_string(g->size())));
  }
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()));
  size_t bytes = buf.desc.count * dtype_size(buf.desc.dtype);
  if (peer == g->self_rank) {
    accumulators_.add(name, g->cluster.describe(peer), buf.desc.dtype, buf.desc.count, buf.send);
    return done(Status::OK());
  }
  std::string id = "push#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), std::move(done));
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kPush);
  h.dtype = static_cast<uint8_t>(buf.desc.dtype);
  h.ndims = static_cast<uint32_t>(std::min<size_t>(buf.desc.shape.size(), kMaxDims));
  for (uint32_t i = 0; i < h.ndims; ++i) h.dims[i] = buf.desc.shape[i];
  auto registry = &g->registry;
  g->transport->send(peer, h, name, buf.send, bytes, buf.keepalive, [op, registry, id, what](const Status &st) {
    registry->remove(id);
    op->complete(st.ok() ? st : Status(st.code(), what + ": " + st.message()));
  });
}

Status Runtime::take(const std::string &name, void *dst, const TensorDesc &desc, int64_t *pushes) {
  return accumulators_.take(name, desc.dtype, desc.count, dst, pushes);
}

bool Runtime::receive_push(Generation &g, int src, const FrameHeader &header, const std::string &name,
                           const PartialReader &read) {
  if (!dtype_valid(header.dtype) || header.payload_len % dtype_size(static_cast<DType>(header.dtype)) != 0) {
    // Not something a peer of this build sends; the transport skips the payload.
    fprintf(stderr, "kungfu: dropped a malformed push to '%s' from %s\n", name.c_str(),
            g.cluster.describe(src).c_str());
    return true;
  }
  DType dtype = static_cast<DType>(header.dtype);
  // The whole payload first, then one add under the accumulator's lock: a
  // take never sees half a push, and never waits on the network.
  PooledBuffer payload;
  if (!read_payload(read, header.payload_len, &payload)) return false;
  accumulators_.add(name, g.cluster.describe(src), dtype, header.payload_len / dtype_size(dtype), payload.data());
  return true;
}

void Runtime::push_rows(int peer, const std::string &name, const RowsDesc &desc, size_t n, const int64_t *rows,
                        const void *values, DoneCallback done) {
  GenPtr g = gen();
  std::string what = "push of " + std::to_string(n) + " rows into '" + name + "' to " +
                     (peer >= 0 && peer < g->size() ? g->cluster.describe(peer) : "rank " + std::to_string(peer));
  if (peer < 0 || peer >= g->size()) {
    return done(InvalidArgument(what + ": no such rank in a cluster of " + std::to_string(g->size())));
  }
  Status refused = g->registry.closed();
  if (!refused.ok()) return done(Status(refused.code(), what + ": " + refused.message()));
  if (peer == g->self_rank) {
    accumulators_.add_rows(name, g->cluster.describe(peer), desc.dtype, desc.num_rows, desc.row_len, n, rows, values);
    return done(Status::OK());
  }
  // One frame: the indices, then the rows (a copy of only the touched rows).
  auto payload = std::make_shared<std::vector<char>>(n * (sizeof(int64_t) + desc.row_bytes()));
  if (n > 0) {
    std::memcpy(payload->data(), rows, n * sizeof(int64_t));
    std::memcpy(payload->data() + n * sizeof(int64_t), values, n * desc.row_bytes());
  }
  std::string id = "push#" + std::to_string(g->self_rank) + "#" + std::to_string(next_request_++);
  auto op = std::make_shared<PeerOp>(peer, what, g->cluster.describe(peer), std::move(done));
  Status s = g->registry.add(id, op);
  if (!s.ok()) return op->complete(s);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kPushRows);
  h.dtype = static_cast<uint8_t>(desc.dtype);
  h.ndims = 2;
  h.dims[0] = static_cast<int64_t>(desc.num_rows);
  h.dims[1] = static_cast<int64_t>(desc.row_len);
  h.seq = n;
  auto registry = &g->registry;
  g->transport->send(peer, h, name, payload->data(), payload->size(), payload,
                     [op, registry, id, what](const Status &st) {
                       registry->remove(id);
                       op->complete(st.ok() ? st : Status(st.code(), what + ": " + st.message()));
                     });
}

bool Runtime::receive_push_rows(Generation &g, int src, const FrameHeader &header, const std::string &name,
                                const PartialReader &read) {
  RowsDesc desc;
  bool valid = dtype_valid(header.dtype) && header.ndims == 2 && header.dims[0] >= 0 && header.dims[1] >= 0;
  if (valid) {
    desc = RowsDesc{static_cast<DType>(header.dtype), static_cast<size_t>(header.dims[0]),
                    static_cast<size_t>(header.dims[1])};
    // Divisions, not products: a product of claimed sizes can wrap around
    // and make a short payload claim billions of rows (or a table of a few
    // bytes claim billions of elements).
    const size_t elem = dtype_size(desc.dtype);
    valid = desc.row_len <= SIZE_MAX / elem - sizeof(int64_t) &&
            (desc.row_len == 0 || desc.num_rows <= SIZE_MAX / desc.row_bytes());
    if (valid) {
      const uint64_t per_row = sizeof(int64_t) + desc.row_bytes();
      valid = header.payload_len % per_row == 0 && header.payload_len / per_row == header.seq;
    }
  }
  if (!valid) {
    // Not something a peer of this build sends; the transport skips the payload.
    fprintf(stderr, "kungfu: dropped a malformed push of rows to '%s' from %s\n", name.c_str(),
            g.cluster.describe(src).c_str());
    return true;
  }
  // The whole payload first, then one add under the accumulator's lock.
  PooledBuffer payload;
  if (!read_payload(read, header.payload_len, &payload)) return false;
  size_t n = header.seq;
  std::vector<int64_t> rows(n);
  if (n > 0) std::memcpy(rows.data(), payload.data(), n * sizeof(int64_t));  // aligned for the adds
  accumulators_.add_rows(name, g.cluster.describe(src), desc.dtype, desc.num_rows, desc.row_len, n, rows.data(),
                         payload.data() + n * sizeof(int64_t));
  return true;
}

Status Runtime::take_rows(const std::string &name, const RowsDesc &desc, std::vector<int64_t> *rows,
                          std::vector<char> *values, int64_t *pushes) {
  return accumulators_.take_rows(name, desc.dtype, desc.num_rows, desc.row_len, rows, values, pushes);
}

}  // namespace kungfu
