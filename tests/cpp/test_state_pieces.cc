// The layout of elastic state sync (state_pieces.h): pieces cover the
// variables' bytes exactly once and in order whatever their sizes, a piece
// scatters back where it came from, and the digests are XXH3-128 as specified
// (checked against the values the system's libxxhash computes for the same
// inputs, `xxhsum -H2`, and the layout's definition).
#include <cstring>
#include <random>
#include <string>

#include "state_pieces.h"
#include "test_util.h"

using namespace kungfu;

namespace {

// Every byte of every variable lies in exactly one segment, in order.
bool covers_once_in_order(const std::vector<size_t> &sizes, const std::vector<StatePiece> &pieces, size_t piece_bytes) {
  size_t variable = 0, offset = 0, start = 0;
  for (const StatePiece &p : pieces) {
    if (p.start != start || p.len == 0 || p.len > piece_bytes) return false;
    size_t sum = 0;
    for (const StateSegment &s : p.segments) {
      while (variable < sizes.size() && offset == sizes[variable]) {
        ++variable;
        offset = 0;
      }
      if (s.variable != variable || s.offset != offset || s.len == 0) return false;
      offset += s.len;
      if (offset > sizes[variable]) return false;
      sum += s.len;
    }
    if (sum != p.len) return false;
    start += p.len;
  }
  while (variable < sizes.size() && offset == sizes[variable]) {
    ++variable;
    offset = 0;
  }
  return variable == sizes.size();
}

void test_pieces_cut_the_concatenation_every_piece_bytes() {
  std::vector<size_t> sizes{0, 3, 10, 0, 5};
  auto pieces = state_pieces(sizes, 4);
  CHECK(pieces.size() == 5);              // 18 bytes: 4 + 4 + 4 + 4 + 2
  CHECK(pieces[0].segments.size() == 2);  // 3 bytes of variable 1, 1 of variable 2
  CHECK(pieces[0].segments[0].variable == 1 && pieces[0].segments[1].variable == 2);
  CHECK(pieces[3].segments.size() == 2 && pieces[3].segments[1].variable == 4);  // skips the empty variable 3
  CHECK(pieces[4].start == 16 && pieces[4].len == 2);
  CHECK(covers_once_in_order(sizes, pieces, 4));
  CHECK(state_pieces({}, 4).empty());
  CHECK(state_pieces({0, 0}, 4).empty());
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<size_t> random_sizes(rng() % 12);
    for (size_t &s : random_sizes) s = rng() % 3 == 0 ? 0 : rng() % 50;
    size_t piece_bytes = 1 + rng() % 20;
    CHECK(covers_once_in_order(random_sizes, state_pieces(random_sizes, piece_bytes), piece_bytes));
  }
}

void test_sources_share_pieces_round_robin() {
  std::vector<size_t> per_source(3, 0);
  for (size_t p = 0; p < 10; ++p) per_source[piece_source(p, 3)]++;
  CHECK(per_source[0] == 4 && per_source[1] == 3 && per_source[2] == 3);
  CHECK(piece_name("kungfu/state", 12) == "kungfu/state/12");
}

void test_a_scattered_piece_lands_where_it_came_from() {
  std::vector<std::string> original{"abc", "", "defghij", "k"};
  std::vector<std::string> copy{"...", "", ".......", "."};
  std::vector<size_t> sizes;
  std::vector<const char *> from;
  std::vector<char *> to;
  for (size_t i = 0; i < original.size(); ++i) {
    sizes.push_back(original[i].size());
    from.push_back(original[i].data());
    to.push_back(copy[i].data());
  }
  for (const StatePiece &p : state_pieces(sizes, 3)) {
    std::string bytes;
    for (const StateSegment &s : p.segments) bytes.append(from[s.variable] + s.offset, s.len);
    scatter_piece(p, bytes.data(), to);
  }
  CHECK(copy == original);
}

StateDigest hex_digest(const char *hex) {
  StateDigest d{};
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<uint8_t>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
  return d;
}

void test_digests_are_xxh3_128_as_specified() {
  // libxxhash 0.8.1's XXH3_128bits (high 64 bits first) of "" and "abc".
  CHECK(bytes_digest("", 0) == hex_digest("99aa06d3014798d86001c324468d497f"));
  CHECK(bytes_digest("abc", 3) == hex_digest("06b05ab6733a618578af5f94892f3950"));
  // "abc" split over two variables and one piece hashes as the whole.
  std::string a = "a", bc = "bc";
  std::vector<const char *> buffers{a.data(), bc.data()};
  auto pieces = state_pieces({1, 2}, 64);
  CHECK(pieces.size() == 1);
  StateDigest d = piece_digest(pieces[0], buffers);
  CHECK(d == hex_digest("06b05ab6733a618578af5f94892f3950"));
  // The state's digest: XXH3-128(total bytes as 8 little-endian bytes || piece digests).
  StateDigest other = piece_digest(state_pieces({2}, 64)[0], {bc.data()});
  CHECK(other == bytes_digest("bc", 2));
  std::string input(8, '\0');
  input[0] = 5;
  input.append(reinterpret_cast<const char *>(d.data()), d.size());
  input.append(reinterpret_cast<const char *>(other.data()), other.size());
  StateDigest got = state_digest(5, {d, other});
  CHECK(got == bytes_digest(input.data(), input.size()));
  CHECK(state_digest(5, {other, d}) != got);  // the order of the pieces counts
  CHECK(state_digest(6, {d, other}) != got);  // and the byte count
}

}  // namespace

int main() {
  test_pieces_cut_the_concatenation_every_piece_bytes();
  test_sources_share_pieces_round_robin();
  test_a_scattered_piece_lands_where_it_came_from();
  test_digests_are_xxh3_128_as_specified();
  return kftest::report();
}
