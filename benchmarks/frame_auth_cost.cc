// What authenticating every frame (frame_auth.h) costs, per MiB of payload,
// next to copying the same bytes once (memcpy), on one core. Built and run by
// `make bench-frame-auth`.
//
//   frame_auth_cost [SECONDS_PER_POINT]
//
// Prints a table: frame size, memcpy MiB/s, sign MiB/s, verify MiB/s, the
// tag's time per frame, and for comparison AES-256-GMAC (OpenSSL's EVP_MAC
// "GMAC", a fresh IV per frame), a faster MAC we could switch to if HMAC's
// cost matters. A receive path adds the verify column's cost to every frame;
// a send path adds the sign column's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "frame.h"
#include "frame_auth.h"
#include "hmac.h"

namespace {

using Clock = std::chrono::steady_clock;

double mib_per_s(size_t bytes, int reps, double seconds) {
  return double(bytes) * reps / (1 << 20) / seconds;
}

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

// AES-256-GMAC over header + key + payload, the IV (12 bytes) from a frame
// counter, as a per-frame MAC would use it. Benchmark-only.
class Gmac {
 public:
  explicit Gmac(const kungfu::SessionKey &key) {
    mac_ = EVP_MAC_fetch(nullptr, "GMAC", nullptr);
    ctx_ = mac_ ? EVP_MAC_CTX_new(mac_) : nullptr;
    if (ctx_ == nullptr) {
      std::fprintf(stderr, "OpenSSL has no GMAC\n");
      std::exit(1);
    }
    std::memcpy(key_, key.data(), sizeof(key_));
  }
  ~Gmac() {
    EVP_MAC_CTX_free(ctx_);
    EVP_MAC_free(mac_);
  }
  void tag(const void *header, size_t hlen, const std::string &key, const void *payload, size_t plen,
           unsigned char out[16]) {
    unsigned char iv[12] = {};
    std::memcpy(iv, &seq_, sizeof(seq_));
    ++seq_;
    char cipher[] = "AES-256-GCM";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, cipher, 0),
                           OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof(iv)),
                           OSSL_PARAM_construct_end()};
    size_t n = 0;
    if (EVP_MAC_init(ctx_, key_, sizeof(key_), params) != 1 ||
        EVP_MAC_update(ctx_, static_cast<const unsigned char *>(header), hlen) != 1 ||
        EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char *>(key.data()), key.size()) != 1 ||
        EVP_MAC_update(ctx_, static_cast<const unsigned char *>(payload), plen) != 1 ||
        EVP_MAC_final(ctx_, out, &n, 16) != 1) {
      std::fprintf(stderr, "GMAC failed\n");
      std::exit(1);
    }
  }

 private:
  EVP_MAC *mac_ = nullptr;
  EVP_MAC_CTX *ctx_ = nullptr;
  unsigned char key_[32];
  uint64_t seq_ = 0;
};

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
  const std::string frame_key = "gradients/dense/kernel:0\x01" "chunk3";

  Gmac gmac(key);
  std::printf("%-10s %12s %12s %12s %14s %12s\n", "frame", "memcpy MiB/s", "sign MiB/s", "verify MiB/s",
              "sign us/frame", "GMAC MiB/s");
  for (size_t size : {size_t(64), size_t(4) << 10, size_t(64) << 10, size_t(1) << 20, size_t(16) << 20}) {
    std::vector<char> src(size, 'x'), dst(size);
    for (size_t i = 0; i < size; ++i) src[i] = char(i * 31);
    header.payload_len = size;
    const double copy_s = seconds_per_call(seconds, [&] {
      std::memcpy(dst.data(), src.data(), size);
      // Keeps the copy from being optimised away.
      asm volatile("" : : "r"(dst.data()) : "memory");
    });
    kungfu::FrameAuthenticator::Tag tag{};
    const double sign_s = seconds_per_call(seconds, [&] {
      tag = sender.sign(&header, sizeof(header), frame_key.data(), frame_key.size(), src.data(), size);
    });
    // The receiver must see the frames in the sender's order, so verify
    // re-signs each frame with a second sender kept in step.
    kungfu::FrameAuthenticator lockstep(key, kungfu::FrameDirection::kClientToServer);
    kungfu::FrameAuthenticator checker(key, kungfu::FrameDirection::kClientToServer);
    bool all_ok = true;
    const double both_s = seconds_per_call(seconds, [&] {
      tag = lockstep.sign(&header, sizeof(header), frame_key.data(), frame_key.size(), src.data(), size);
      all_ok &= checker.verify(&header, sizeof(header), frame_key.data(), frame_key.size(), src.data(), size,
                               tag.data());
    });
    if (!all_ok) {
      std::fprintf(stderr, "verification failed: the benchmark is wrong\n");
      return 1;
    }
    const double verify_s = std::max(both_s - sign_s, 1e-12);
    unsigned char gtag[16];
    const double gmac_s = seconds_per_call(seconds, [&] {
      gmac.tag(&header, sizeof(header), frame_key, src.data(), size, gtag);
    });
    char label[32];
    if (size >= (1 << 20)) {
      std::snprintf(label, sizeof(label), "%zu MiB", size >> 20);
    } else if (size >= 1024) {
      std::snprintf(label, sizeof(label), "%zu KiB", size >> 10);
    } else {
      std::snprintf(label, sizeof(label), "%zu B", size);
    }
    std::printf("%-10s %12.0f %12.0f %12.0f %14.2f %12.0f\n", label, mib_per_s(size, 1, copy_s),
                mib_per_s(size, 1, sign_s), mib_per_s(size, 1, verify_s), sign_s * 1e6, mib_per_s(size, 1, gmac_s));
  }
  return 0;
}
