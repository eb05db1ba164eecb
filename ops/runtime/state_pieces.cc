#include "state_pieces.h"

#include <algorithm>
#include <cstring>
#include <tuple>

// Header-only: xxHash's functions are compiled in here as static ones, so no
// library is linked and no symbol can clash with TensorFlow's.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kungfu {

std::vector<StatePiece> state_pieces(const std::vector<size_t> &sizes, size_t piece_bytes) {
  size_t total = 0;
  for (size_t s : sizes) total += s;
  std::vector<StatePiece> pieces;
  if (piece_bytes == 0) return pieces;
  pieces.reserve((total + piece_bytes - 1) / piece_bytes);
  size_t variable = 0, offset = 0;  // where the next piece starts
  for (size_t start = 0; start < total; start += piece_bytes) {
    StatePiece piece{start, std::min(piece_bytes, total - start), {}};
    size_t left = piece.len;
    while (left > 0) {
      while (offset == sizes[variable]) {  // skips empty variables too
        ++variable;
        offset = 0;
      }
      size_t n = std::min(left, sizes[variable] - offset);
      piece.segments.push_back({variable, offset, n});
      offset += n;
      left -= n;
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

void scatter_piece(const StatePiece &piece, const char *in, const std::vector<char *> &buffers) {
  for (const StateSegment &s : piece.segments) {
    std::memcpy(buffers[s.variable] + s.offset, in, s.len);
    in += s.len;
  }
}

namespace {

// One XXH3-128 over several byte ranges.
class Xxh3Stream {
 public:
  Xxh3Stream() { XXH3_128bits_reset(&state_); }
  void update(const void *data, size_t len) { XXH3_128bits_update(&state_, data, len); }
  StateDigest finish() const { return canonical(XXH3_128bits_digest(&state_)); }

  static StateDigest canonical(XXH128_hash_t h) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    StateDigest out;
    static_assert(sizeof(c.digest) == std::tuple_size<StateDigest>::value, "XXH3-128 is 16 bytes");
    std::memcpy(out.data(), c.digest, out.size());
    return out;
  }

 private:
  XXH3_state_t state_;
};

}  // namespace

StateDigest piece_digest(const StatePiece &piece, const std::vector<const char *> &buffers) {
  if (piece.segments.size() == 1) {  // the common case: one call, no streaming state
    const StateSegment &s = piece.segments[0];
    return bytes_digest(buffers[s.variable] + s.offset, s.len);
  }
  Xxh3Stream h;
  for (const StateSegment &s : piece.segments) h.update(buffers[s.variable] + s.offset, s.len);
  return h.finish();
}

StateDigest bytes_digest(const void *data, size_t len) { return Xxh3Stream::canonical(XXH3_128bits(data, len)); }

StateDigest state_digest(uint64_t total_bytes, const std::vector<StateDigest> &pieces) {
  Xxh3Stream h;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(total_bytes >> (8 * i));
  h.update(len, sizeof(len));
  for (const StateDigest &d : pieces) h.update(d.data(), d.size());
  return h.finish();
}

}  // namespace kungfu
