// libFuzzer target: the server side of the handshake (handshake.h) against a
// client whose bytes are the fuzzer's input. The input is written into one
// end of a socketpair and that end is shut for writing, so the server sees
// exactly these bytes and then the end of the stream.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "handshake.h"
#include "secret.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The default socket buffer holds far more than libFuzzer's default max_len;
  // longer inputs are cut (the server bounds every field well below this).
  if (size > 64 * 1024) size = 64 * 1024;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::write(fds[1], data + off, size - off);
    if (n <= 0) std::abort();
    off += static_cast<size_t>(n);
  }
  ::shutdown(fds[1], SHUT_WR);
  kungfu::SecretString secret("fuzz-secret");
  kungfu::HandshakeIdentity self{"fuzz-job", 3};
  std::string client_id, err;
  kungfu::SessionKey key;
  if (kungfu::server_handshake(fds[0], secret, self, &client_id, &key, &err, 1.0)) {
    std::abort();  // the fuzzer cannot know the secret: accepting would be a forgery
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
