// Wire format of one message between two workers: a fixed header, the key
// bytes, then the payload. Both ends run the same build on the same kind of
// machine (little-endian), so the header travels as raw bytes.
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace kungfu {

constexpr uint32_t kFrameMagic = 0x4b46544d;  // "KFTM"
constexpr int kMaxDims = 8;
constexpr uint32_t kMaxKeyLen = 4096;

enum class FrameType : uint8_t {
  kCollective = 1,   // a piece of a collective; key = op name + piece + phase
  kAbort = 2,        // the op named by key (instance seq) failed on the sender; payload = reason
  kP2PRequest = 3,   // asks for a saved blob; key = blob name, seq = version
  kP2PResponse = 4,  // answers a request; key = request id
  kPing = 5,         // latency probe; echoed back as kPong
  kPong = 6,
  kPush = 7,  // adds the payload into the receiver's accumulator; key = accumulator name
  // Adds rows into the receiver's table accumulator; key = accumulator name,
  // dims = {table rows, elements per row}, seq = n, payload = n int64 row
  // indices then the n rows.
  kPushRows = 8,
  // The sender is leaving the cluster in order: every frame it sent before
  // this one is complete and it sends nothing after (no key, no payload).
  // seq: the cluster version the sender moves on to, 0 if it leaves the job.
  kGoodbye = 9,
  // Only as the first frame of a same-host connection, with the descriptors
  // of a shared-memory ring attached (SCM_RIGHTS; no key, no payload): every
  // later frame of the connection travels through that ring (shm_ring.h).
  kShmRing = 10,
};

enum FrameFlags : uint8_t {
  kFlagNotFound = 1,  // p2p response: nothing saved under that name/version
  kFlagAtLeast = 2,   // p2p request: any version >= seq (the newest); wait for a save if none yet
  kFlagTimedOut = 4,  // p2p response: no version >= seq was saved within the timeout
  // p2p request for a table's changed rows (with kFlagAtLeast): dims[0] = the
  // version the requester holds. Response: dims = {table rows, bytes per
  // row}, payload = n int64 row indices then the rows.
  kFlagRows = 8,
  kFlagAllRows = 16,  // rows response: the whole table instead (no indices)
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t dtype = 0;     // DType of the whole tensor
  uint8_t topology = 0;  // TopologyKind the sender chose (collectives)
  uint8_t flags = 0;
  uint32_t cluster_version = 0;
  uint32_t key_len = 0;
  uint64_t payload_len = 0;
  // p2p request: version (UINT64_MAX = latest); response: version served;
  // ping: probe id; collective piece and abort: the op's instance (OpRegistry).
  uint64_t seq = 0;
  // Shape of the sender's whole tensor, so a mismatch error can show both shapes.
  uint32_t ndims = 0;
  uint32_t reserved = 0;
  int64_t dims[kMaxDims] = {};
};

static_assert(sizeof(FrameHeader) == 104, "frame header layout is part of the wire format");

// What a receiver checks before it trusts a header to size anything: the
// magic, the key length and the number of dims. OK or InvalidArgument naming
// the field and its value. Pure, so the fuzzer can drive it directly.
Status check_frame_header(const FrameHeader &header);

}  // namespace kungfu
