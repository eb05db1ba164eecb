#include "frame_auth.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kungfu {

namespace {

void put_be(uint8_t *p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    p[i] = uint8_t(v);
    v >>= 8;
  }
}

// Calling the steps out of order is a bug in the caller; a tag computed over
// a different byte sequence than the peer's would only surface as a spurious
// "tampered frame" much later.
void require(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "kungfu: fatal: FrameAuthenticator misuse: %s\n", what);
    std::abort();
  }
}

}  // namespace

FrameAuthenticator::FrameAuthenticator(const SessionKey &key, FrameDirection direction)
    : mac_(key), direction_(direction) {}

void FrameAuthenticator::begin_frame(const void *header, size_t header_len, const void *key, size_t key_len) {
  if (in_frame_) mac_.finish();  // abandon the unfinished frame: resets the MAC
  in_frame_ = true;
  payload_bytes_ = 0;
  uint8_t prefix[1 + 8 + 4];
  prefix[0] = static_cast<uint8_t>(direction_);
  put_be(prefix + 1, seq_, 8);
  put_be(prefix + 9, header_len, 4);
  mac_.update(prefix, sizeof(prefix));
  mac_.update(header, header_len);
  uint8_t klen[4];
  put_be(klen, key_len, 4);
  mac_.update(klen, sizeof(klen));
  mac_.update(key, key_len);
}

void FrameAuthenticator::add_payload(const void *data, size_t len) {
  require(in_frame_, "add_payload outside a frame");
  mac_.update(data, len);
  payload_bytes_ += len;
}

HmacDigest FrameAuthenticator::finish_frame() {
  require(in_frame_, "a frame ended without begin_frame");
  // The payload length last, so frames that split header, key and payload
  // differently can never produce the same MAC input.
  uint8_t plen[8];
  put_be(plen, payload_bytes_, 8);
  mac_.update(plen, sizeof(plen));
  in_frame_ = false;
  ++seq_;
  return mac_.finish();
}

FrameAuthenticator::Tag FrameAuthenticator::end_frame() {
  HmacDigest full = finish_frame();
  Tag tag;
  std::copy(full.begin(), full.begin() + kTagLen, tag.begin());
  return tag;
}

bool FrameAuthenticator::verify_frame(const uint8_t *received) {
  HmacDigest full = finish_frame();
  if (!constant_time_equal(full.data(), received, kTagLen)) failed_ = true;
  return !failed_;
}

FrameAuthenticator::Tag FrameAuthenticator::sign(const void *header, size_t header_len, const void *key,
                                                 size_t key_len, const void *payload, size_t payload_len) {
  begin_frame(header, header_len, key, key_len);
  add_payload(payload, payload_len);
  return end_frame();
}

bool FrameAuthenticator::verify(const void *header, size_t header_len, const void *key, size_t key_len,
                                const void *payload, size_t payload_len, const uint8_t *received) {
  begin_frame(header, header_len, key, key_len);
  add_payload(payload, payload_len);
  return verify_frame(received);
}

}  // namespace kungfu
