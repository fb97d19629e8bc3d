// accept4 for gRPC 1.51's listener, linked into softmax-server only.
//
// gRPC 1.51 stops accepting on a listener for good once accept4 fails with
// EMFILE or ENFILE (tcp_server_posix.cc, on_read: any error but EINTR,
// EAGAIN and ECONNABORTED leaves the loop without waiting for the next
// connection), so after one burst of connections past the open-file limit
// the server never accepts again, and callers wait in the listen queue.
//
// This executable's accept4 comes first in the global symbol scope, so
// libgrpc calls it instead of libc's (--export-dynamic-symbol puts it in the
// dynamic symbol table; only libgrpc calls accept4 here: civetweb and
// prometheus-cpp call accept). When no descriptor is left it sheds instead
// of failing: it closes a descriptor held in reserve, accepts the waiting
// connection and closes it at once (the caller sees the connection close
// and fails UNAVAILABLE, which it may retry), takes the reserve again, and
// so on until no connection waits; then it reports EAGAIN, on which gRPC
// waits for the next connection as usual. Once descriptors are free again,
// connections are accepted as before.
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "server/logging/log.h"

namespace {

int RawAccept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  return static_cast<int>(syscall(SYS_accept4, fd, address, length, flags));
}

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

std::mutex reserve_mutex;
int reserve_fd = OpenReserve();  // -1 while in use (or when /dev/null is missing)
// True from the first EMFILE until the next accepted connection: one log
// line per episode.
std::atomic<bool> out_of_descriptors{false};

// Accepts and closes every connection waiting on `listener`, with the
// reserve descriptor; returns the errno to report (EAGAIN once none waits).
int ShedWaitingConnections(int listener) {
  std::lock_guard<std::mutex> lock(reserve_mutex);
  for (;;) {
    if (reserve_fd >= 0) {
      close(reserve_fd);
      reserve_fd = -1;
    }
    const int shed = RawAccept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    const int error = errno;
    if (shed >= 0) close(shed);
    reserve_fd = OpenReserve();
    if (shed < 0) {
      // No connection waits (EAGAIN), or another thread took the freed
      // descriptor first (EMFILE): either way gRPC waits for the next one.
      return error == EMFILE || error == ENFILE ? EAGAIN : error;
    }
  }
}

}  // namespace

extern "C" int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  const int accepted = RawAccept4(fd, address, length, flags);
  if (accepted >= 0) {
    out_of_descriptors.store(false, std::memory_order_relaxed);
    return accepted;
  }
  const int error = errno;
  if (error != EMFILE && error != ENFILE) return accepted;
  if (!out_of_descriptors.exchange(true, std::memory_order_relaxed)) {
    softmax::server::logging::LogWarning(
        absl::StrCat("accept4: ", std::strerror(error),
                     "; closing new connections until descriptors are free"));
  }
  errno = ShedWaitingConnections(fd);
  return -1;
}
