// What authenticating every frame (frame_auth.h: AES-256-GMAC) costs, per
// MiB of payload, next to copying the same bytes once (memcpy) and to the
// HMAC-SHA256 tag it replaced, on one core. Built and run by
// `make bench-frame-auth`.
//
//   frame_auth_cost [SECONDS_PER_POINT]
//
// Prints a table: frame size, memcpy MiB/s, the AES-256-GMAC tags the
// transport uses (one per 128 KiB segment; sign and verify MiB/s, sign
// us/frame), and the
// HMAC-SHA256 tag it used before (sign MiB/s, us/frame). A receive path adds
// the verify column's cost to every frame; a send path adds the sign
// column's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "frame.h"
#include "frame_auth.h"
#include "hmac.h"

namespace {

using Clock = std::chrono::steady_clock;

double mib_per_s(size_t bytes, int reps, double seconds) { return double(bytes) * reps / (1 << 20) / seconds; }

// Runs fn repeatedly for about `seconds`, in growing batches; returns the
// best of 3 batches' time per call (the least disturbed by other processes).
template <typename Fn>
double seconds_per_call(double seconds, Fn fn) {
  int reps = 1;
  while (true) {  // size a batch to take ~seconds/3
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (t > seconds / 3 || reps > (1 << 24)) break;
    reps *= 2;
  }
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return best;
}

// The tag frame_auth.h used before AES-256-GMAC: HMAC-SHA256 over
// direction | sequence | header_len | header | key_len | key | payload |
// payload_len, truncated to 16 bytes, keyed once (precomputed pads).
// Benchmark-only, for the comparison column.
class HmacFrameTag {
 public:
  explicit HmacFrameTag(const kungfu::SessionKey &key) : mac_(key) {}
  void tag(const void *header, size_t hlen, const std::string &key, const void *payload, size_t plen, uint8_t out[16]) {
    uint8_t prefix[1 + 8 + 4];
    prefix[0] = 1;
    std::memcpy(prefix + 1, &seq_, 8);
    const uint32_t h32 = uint32_t(hlen), k32 = uint32_t(key.size());
    std::memcpy(prefix + 9, &h32, 4);
    mac_.update(prefix, sizeof(prefix));
    mac_.update(header, hlen);
    mac_.update(&k32, 4);
    mac_.update(key.data(), key.size());
    mac_.update(payload, plen);
    const uint64_t p64 = plen;
    mac_.update(&p64, 8);
    const kungfu::HmacDigest d = mac_.finish();
    std::memcpy(out, d.data(), 16);
    ++seq_;
  }

 private:
  kungfu::HmacSha256 mac_;
  uint64_t seq_ = 0;
};

// Tags (or checks) a frame as the transport does: one tag per
// kSegmentLen of payload, the first covering header and key too.
bool segmented(kungfu::FrameAuthenticator &a, bool sign, const kungfu::FrameHeader &header, const std::string &key,
               const char *payload, size_t len, std::vector<kungfu::FrameAuthenticator::Tag> &tags) {
  const uint64_t n = kungfu::FrameAuthenticator::segments(len);
  tags.resize(n);
  bool ok = true;
  for (uint64_t i = 0; i < n; ++i) {
    const size_t off = i * kungfu::FrameAuthenticator::kSegmentLen;
    if (i == 0) {
      a.begin_frame(&header, sizeof(header), key.data(), key.size());
    } else {
      a.begin_segment();
    }
    a.add_payload(payload + off, std::min(kungfu::FrameAuthenticator::kSegmentLen, len - off));
    if (sign) {
      tags[i] = a.end_frame();
    } else {
      ok &= a.verify_frame(tags[i].data());
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char **argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.6;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: frame_auth_cost [SECONDS_PER_POINT > 0]\n");
    return 2;
  }
  kungfu::SessionKey key;
  for (size_t i = 0; i < key.size(); ++i) key.data()[i] = uint8_t(i * 7 + 1);
  kungfu::FrameAuthenticator sender(key, kungfu::FrameDirection::kClientToServer);
  kungfu::FrameHeader header;
  const std::string frame_key =
      "gradients/dense/kernel:0\x01"
      "chunk3";

  HmacFrameTag hmac(key);
  std::printf("%-10s %12s %15s %17s %17s %15s %17s\n", "frame", "memcpy MiB/s", "GMAC sign MiB/s", "GMAC verify MiB/s",
              "GMAC us/frame", "HMAC sign MiB/s", "HMAC us/frame");
  for (size_t size : {size_t(64), size_t(4) << 10, size_t(64) << 10, size_t(1) << 20, size_t(16) << 20}) {
    std::vector<char> src(size, 'x'), dst(size);
    for (size_t i = 0; i < size; ++i) src[i] = char(i * 31);
    header.payload_len = size;
    const double copy_s = seconds_per_call(seconds, [&] {
      std::memcpy(dst.data(), src.data(), size);
      // Keeps the copy from being optimised away.
      asm volatile("" : : "r"(dst.data()) : "memory");
    });
    std::vector<kungfu::FrameAuthenticator::Tag> tags;
    const double sign_s = seconds_per_call(seconds,
                                           [&] { segmented(sender, true, header, frame_key, src.data(), size, tags); });
    // The receiver must see the frames in the sender's order, so verify
    // re-signs each frame with a second sender kept in step.
    kungfu::FrameAuthenticator lockstep(key, kungfu::FrameDirection::kClientToServer);
    kungfu::FrameAuthenticator checker(key, kungfu::FrameDirection::kClientToServer);
    bool all_ok = true;
    const double both_s = seconds_per_call(seconds, [&] {
      segmented(lockstep, true, header, frame_key, src.data(), size, tags);
      all_ok &= segmented(checker, false, header, frame_key, src.data(), size, tags);
    });
    if (!all_ok) {
      std::fprintf(stderr, "verification failed: the benchmark is wrong\n");
      return 1;
    }
    const double verify_s = std::max(both_s - sign_s, 1e-12);
    uint8_t htag[16];
    const double hmac_s = seconds_per_call(seconds, [&] {
      hmac.tag(&header, sizeof(header), frame_key, src.data(), size, htag);
    });
    char label[32];
    if (size >= (1 << 20)) {
      std::snprintf(label, sizeof(label), "%zu MiB", size >> 20);
    } else if (size >= 1024) {
      std::snprintf(label, sizeof(label), "%zu KiB", size >> 10);
    } else {
      std::snprintf(label, sizeof(label), "%zu B", size);
    }
    std::printf("%-10s %12.0f %15.0f %17.0f %17.2f %15.0f %17.2f\n", label, mib_per_s(size, 1, copy_s),
                mib_per_s(size, 1, sign_s), mib_per_s(size, 1, verify_s), sign_s * 1e6, mib_per_s(size, 1, hmac_s),
                hmac_s * 1e6);
  }
  return 0;
}
