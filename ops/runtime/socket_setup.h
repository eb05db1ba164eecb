// How the transport's sockets are addressed, tuned and dialed.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace kungfu {

// Fills *addr with the same-host (Unix socket) address of `port`; returns
// its length. Linux abstract Unix socket names are scoped by network
// namespace and vanish with the process, so there are no stale files to
// clean up.
socklen_t unix_address(uint16_t port, struct sockaddr_un *addr);

// No Nagle delay on TCP; 4 MiB socket buffers.
void tune_socket(int fd, bool is_unix);

// connect() that gives up at `deadline`: a blocking connect to a host that
// does not answer can take minutes, far past KUNGFU_TIMEOUT.
// False with *err (and *error_number: the errno, 0 on a timeout) set when it fails.
bool connect_until(int fd, const struct sockaddr *addr, socklen_t len, std::chrono::steady_clock::time_point deadline,
                   std::string *err, int *error_number);

}  // namespace kungfu
