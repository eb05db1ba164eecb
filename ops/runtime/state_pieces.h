// How elastic state sync cuts a worker's variables into pieces that travel
// and are hashed independently.
//
// The variables' bytes, concatenated in order, are cut every kStatePieceBytes
// bytes. A piece depends only on the variables' sizes, never on how many
// workers send or receive: every member of a sync computes the same pieces,
// and the state's digest (a hash over the pieces' hashes) is the same on a
// member that sent, received or only hashed the same bytes. Pieces are small
// enough that several are in flight from several sources at once and that a
// receiver hashes the first ones while the later ones still arrive.
//
// The digest is XXH3-128 (xxHash), not a cryptographic hash: its job is to
// show that every member holds the same bytes after a sync (a transfer, a
// layout or an update bug), not to resist forgery. Only peers that proved the
// job's secret in the handshake exchange state, and such a peer could send
// any state anyway. SHA-256 (OpenSSL, SHA-NI) hashed 68 MB in 40 ms here and
// was most of a grow's idle when four workers hash on two cores; XXH3 takes
// 4 ms for the same bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kungfu {

constexpr size_t kStatePieceBytes = size_t(4) << 20;

// A contiguous part of one variable's buffer.
struct StateSegment {
  size_t variable;  // index into the variables
  size_t offset;    // bytes into that variable's buffer
  size_t len;
};

struct StatePiece {
  size_t start;  // offset in the concatenated state
  size_t len;
  // In order; more than one only where the piece crosses a variable boundary.
  std::vector<StateSegment> segments;
};

// The pieces of a state whose variables hold `sizes` bytes each, in order.
// Empty variables lie in no segment; an empty state has no pieces.
std::vector<StatePiece> state_pieces(const std::vector<size_t> &sizes, size_t piece_bytes = kStatePieceBytes);

// The source (index into the list of workers holding the state) that sends
// piece `piece`: round robin, so that each of n sources sends within one
// piece of 1/n of the bytes.
inline size_t piece_source(size_t piece, size_t sources) { return piece % sources; }

// The name a source saves piece `piece` under in its p2p store.
inline std::string piece_name(const std::string &prefix, size_t piece) { return prefix + "/" + std::to_string(piece); }

// Copies `in` (piece.len bytes) into the variables' buffers.
void scatter_piece(const StatePiece &piece, const char *in, const std::vector<char *> &buffers);

// XXH3-128 with seed 0 in xxHash's canonical form (high 64 bits first, big endian).
using StateDigest = std::array<uint8_t, 16>;

// XXH3-128 of a piece's bytes, read in place from the variables' buffers.
StateDigest piece_digest(const StatePiece &piece, const std::vector<const char *> &buffers);

// XXH3-128 of `len` contiguous bytes.
StateDigest bytes_digest(const void *data, size_t len);

// The state's digest: XXH3-128 over the total byte count (8 bytes, little
// endian) and the pieces' digests in order.
StateDigest state_digest(uint64_t total_bytes, const std::vector<StateDigest> &pieces);

}  // namespace kungfu
