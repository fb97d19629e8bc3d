// Stops a civetweb server (prometheus-cpp's exposer, the HTTP front-end)
// without waiting out its accept loop.
//
// civetweb's listening thread polls its sockets with a 2 s timeout and sees a
// stop only when that poll returns, so a stop took up to 2 s of an idle
// server's exit. While the stop runs on a thread of its own, this opens and
// closes loopback connections to the port, which end the poll at once. A
// listener on an address other than loopback waits the poll out.
//
// Thread-safety: call from one thread; `stop` runs on another.
#ifndef SOFTMAX_COMMON_CIVETWEB_STOP_H_
#define SOFTMAX_COMMON_CIVETWEB_STOP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

namespace softmax {

// Opens and closes one loopback TCP connection to `port`.
inline void KnockOnLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  close(fd);
}

// Runs `stop` (which returns once the server has stopped) on a thread of its
// own and knocks on `port` every 10 ms, at most 2 s, until it returns.
// `port` <= 0: no knocking.
inline void StopCivetwebServer(const std::function<void()>& stop, int port) {
  std::atomic<bool> stopped{false};
  std::thread stopper([&stop, &stopped] {
    stop();
    stopped.store(true);
  });
  for (int attempt = 0; attempt < 200 && port > 0 && !stopped.load(); ++attempt) {
    KnockOnLoopback(port);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stopper.join();
}

}  // namespace softmax

#endif  // SOFTMAX_COMMON_CIVETWEB_STOP_H_
