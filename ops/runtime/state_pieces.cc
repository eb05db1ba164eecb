#include "state_pieces.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "libcrypto.h"

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

struct MdCtxFree {
  void operator()(EVP_MD_CTX *c) const { EVP_MD_CTX_free(c); }
};

// One SHA-256 over several byte ranges.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    init_libcrypto();
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      crypto_failure("EVP_DigestInit_ex(SHA-256)");
  }
  void update(const void *data, size_t len) {
    if (len > 0 && EVP_DigestUpdate(ctx_.get(), data, len) != 1) crypto_failure("EVP_DigestUpdate");
  }
  Sha256Digest finish() {
    Sha256Digest out;
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), out.data(), &n) != 1 || n != out.size()) crypto_failure("EVP_DigestFinal_ex");
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx_;
};

}  // namespace

Sha256Digest piece_digest(const StatePiece &piece, const std::vector<const char *> &buffers) {
  Sha256 h;
  for (const StateSegment &s : piece.segments) h.update(buffers[s.variable] + s.offset, s.len);
  return h.finish();
}

Sha256Digest state_digest(uint64_t total_bytes, const std::vector<Sha256Digest> &pieces) {
  Sha256 h;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(total_bytes >> (8 * i));
  h.update(len, sizeof(len));
  for (const Sha256Digest &d : pieces) h.update(d.data(), d.size());
  return h.finish();
}

}  // namespace kungfu
