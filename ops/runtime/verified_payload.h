#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "frame.h"
#include "frame_auth.h"
#include "socket_io.h"

namespace kungfu {

// Reads the payload of one authenticated frame segment by segment
// (frame_auth.h) and hands out only verified bytes. Segment 0, which also
// covers the header and key, is verified before the frame is handed to
// anyone; a later read that covers whole segments lands straight in the
// caller's buffer and returns once their tags matched, and a segment read in
// parts is verified in `segment_` first. So a large frame streams (its first
// segments are used while the rest is still arriving) and nothing acts on
// bytes before their tag matched; a frame whose later segment fails has
// been partly used (only genuine bytes) and breaks the connection.
class VerifiedPayload {
 public:
  // `forged` runs when a tag does not match, before the read fails: a
  // reader fails its op with a generic "connection lost", and the op should
  // rather fail with the reason (`why`).
  VerifiedPayload(int fd, FrameAuthenticator &auth, std::string &why, std::function<void()> forged)
      : fd_(fd), auth_(auth), why_(why), forged_(std::move(forged)) {
    segment_.resize(FrameAuthenticator::kSegmentLen);
  }

  // Starts the frame: reads and verifies its first segment.
  bool begin(const FrameHeader &h, const std::string &key) {
    header_ = &h;
    key_ = &key;
    next_ = 0;
    held_ = held_len_ = 0;
    const size_t n = next_segment_len();
    if (!load(segment_.data(), n, true)) return false;
    held_len_ = n;
    return true;
  }

  bool read(void *dst, size_t len) {
    char *out = static_cast<char *>(dst);
    while (len > 0) {
      if (held_ < held_len_) {
        const size_t n = std::min(len, held_len_ - held_);
        std::memcpy(out, segment_.data() + held_, n);
        held_ += n;
        out += n;
        len -= n;
        continue;
      }
      const size_t n = next_segment_len();
      if (n == 0) {
        why_ = "handler read past the end of a frame";
        return false;
      }
      if (len >= n) {  // a whole segment: straight into the caller's buffer
        if (!load(out, n, false)) return false;
        out += n;
        len -= n;
      } else {
        if (!load(segment_.data(), n, false)) return false;
        held_ = 0;
        held_len_ = n;
      }
    }
    return true;
  }

  // Reads (and verifies) whatever of the frame nobody wanted.
  bool finish() {
    held_ = held_len_ = 0;
    for (size_t n; (n = next_segment_len()) > 0;) {
      if (!load(segment_.data(), n, false)) return false;
    }
    return true;
  }

 private:
  size_t next_segment_len() const {
    return static_cast<size_t>(std::min<uint64_t>(FrameAuthenticator::kSegmentLen, header_->payload_len - next_));
  }

  // The next segment (n bytes) into dst, then its tag; `first`: segment 0,
  // whose tag covers the header and key too.
  bool load(char *dst, size_t n, bool first) {
    FrameAuthenticator::Tag tag;
    if (!recv_all(fd_, dst, n, &why_) || !recv_all(fd_, tag.data(), tag.size(), &why_)) return false;
    if (first) {
      auth_.begin_frame(header_, sizeof(*header_), key_->data(), key_->size());
    } else {
      auth_.begin_segment();
    }
    auth_.add_payload(dst, n);
    next_ += n;
    if (!auth_.verify_frame(tag.data())) {
      why_ = "frame authentication failed (the frame was tampered with, replayed, reordered or injected)";
      forged_();
      return false;
    }
    return true;
  }

  const int fd_;
  FrameAuthenticator &auth_;
  std::string &why_;
  const std::function<void()> forged_;
  std::vector<char> segment_;
  const FrameHeader *header_ = nullptr;
  const std::string *key_ = nullptr;
  uint64_t next_ = 0;               // payload offset of the next segment on the wire
  size_t held_ = 0, held_len_ = 0;  // unread part of segment_
};

}  // namespace kungfu
