// tcp_ceiling: what raw loopback TCP moves on this host, the ceiling of the
// gRPC transport's figures.
//
// Modes:
//   echo    the load client's pattern without gRPC: each of --connections
//           connections sends a --bytes message, the other end reads all of
//           it and sends it back, and the next message goes once the answer
//           is read in full. Counted as the load client counts payload:
//           bytes sent plus bytes received, per second.
//   stream  one direction only: each connection writes without pause, the
//           other end reads and drops. Bytes received per second.
// Buffers are allocated and touched once, reads and writes are plain
// blocking send/recv of whole buffers (the kernel splits them), TCP_NODELAY
// as gRPC sets it, socket buffers left to the kernel's autotuning. Every
// thread is its own: one per connection end.
//
// Validate, then time: in echo mode the first message of every connection
// carries a pattern that must come back intact, and every later answer is
// checked at a few spots; in stream mode the first --bytes are checked.
//
// Usage: tcp_ceiling [--mode=echo|stream] [--bytes=N] [--connections=C]
//                    [--seconds=S] [--json=PATH]
// Prints one table row; --json writes the same figures.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"

ABSL_FLAG(std::string, mode, "echo", "echo (round trips of --bytes) or stream (one direction).");
ABSL_FLAG(int64_t, bytes, int64_t{64} << 20, "Message size in bytes (echo; stream: the check size).");
ABSL_FLAG(int32_t, connections, 1, "Connections, each with a thread at either end.");
ABSL_FLAG(double, seconds, 3.0, "Timed phase, after the validation round.");
ABSL_FLAG(std::string, json, "", "Write the figures to this file as one JSON object.");

namespace {

using Clock = std::chrono::steady_clock;

// Writes all of [data, data + size); false when the peer is gone.
bool SendAll(int fd, const char* data, int64_t size) {
  while (size > 0) {
    const ssize_t sent = send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL);
    if (sent <= 0) return false;
    data += sent;
    size -= sent;
  }
  return true;
}

// Reads exactly `size` bytes; false on end of stream or error.
bool ReceiveAll(int fd, char* data, int64_t size) {
  while (size > 0) {
    const ssize_t got = recv(fd, data, static_cast<size_t>(size), 0);
    if (got <= 0) return false;
    data += got;
    size -= got;
  }
  return true;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "tcp_ceiling: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

void SetNoDelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) Fail("TCP_NODELAY");
}

// A byte pattern that differs per connection and position.
char Pattern(int connection, int64_t i) {
  return static_cast<char>((i * 2654435761u + connection * 97u) >> 7);
}

// Stream mode's far end reads in chunks of this size, a buffer that stays in
// cache: the most a receiver can get out of loopback TCP (on the 2-core
// development host 0.86 GB/s with 1 MiB reads, 0.23 GB/s reading into a
// 64 MiB buffer).
constexpr int64_t kStreamReadBytes = int64_t{1} << 20;

struct ConnectionResult {
  int64_t bytes = 0;     // counted bytes in the timed phase
  int64_t messages = 0;  // echo round trips in the timed phase
  bool valid = true;
  std::string problem;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Raw loopback TCP throughput: the ceiling for the gRPC transport.");
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int connections = absl::GetFlag(FLAGS_connections);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if ((mode != "echo" && mode != "stream") || bytes < 1 || connections < 1 || seconds <= 0) {
    std::fprintf(stderr, "tcp_ceiling: need --mode=echo|stream, --bytes>=1, --connections>=1, "
                         "--seconds>0\n");
    return 2;
  }
  const bool echo = mode == "echo";

  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) Fail("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) Fail("bind");
  socklen_t length = sizeof(address);
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    Fail("getsockname");
  }
  if (listen(listener, connections) != 0) Fail("listen");

  std::vector<int> client_fds(connections), server_fds(connections);
  for (int c = 0; c < connections; ++c) {
    client_fds[c] = socket(AF_INET, SOCK_STREAM, 0);
    if (client_fds[c] < 0) Fail("socket");
    if (connect(client_fds[c], reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      Fail("connect");
    }
    server_fds[c] = accept(listener, nullptr, nullptr);
    if (server_fds[c] < 0) Fail("accept");
    SetNoDelay(client_fds[c]);
    SetNoDelay(server_fds[c]);
  }
  close(listener);

  std::atomic<bool> timing{false};
  std::atomic<bool> stop{false};
  std::vector<ConnectionResult> results(connections);
  std::vector<char> far_end_valid(connections, 1);
  // Stream mode: bytes each far end has read so far.
  std::vector<std::atomic<int64_t>> received(connections);
  // Echo mode: when each near end's last counted answer arrived.
  std::vector<Clock::time_point> last_answer(connections);
  std::vector<std::thread> near_ends, far_ends;
  Clock::time_point start;  // written before `timing` is set

  for (int c = 0; c < connections; ++c) {
    // The far end: echoes each message, or reads in kStreamReadBytes chunks,
    // checks the first message, and drops the rest.
    far_ends.emplace_back([&, c] {
      const int fd = server_fds[c];
      if (echo) {
        std::vector<char> buffer(static_cast<size_t>(bytes), 1);
        while (ReceiveAll(fd, buffer.data(), bytes) && SendAll(fd, buffer.data(), bytes)) {
        }
      } else {
        std::vector<char> buffer(static_cast<size_t>(kStreamReadBytes), 1);
        int64_t total = 0;
        while (true) {
          const ssize_t got = recv(fd, buffer.data(), buffer.size(), 0);
          if (got <= 0) break;
          for (int64_t i = 0; i < got && total + i < bytes; ++i) {
            if (buffer[i] != Pattern(c, total + i)) far_end_valid[c] = 0;
          }
          total += got;
          received[c].store(total, std::memory_order_relaxed);
        }
        if (total < bytes) far_end_valid[c] = 0;
      }
      close(fd);
    });
    // The near end: sends, and in echo mode reads each answer and checks it.
    near_ends.emplace_back([&, c] {
      ConnectionResult& result = results[c];
      std::vector<char> out(static_cast<size_t>(bytes)), in(static_cast<size_t>(bytes), 0);
      for (int64_t i = 0; i < bytes; ++i) out[i] = Pattern(c, i);
      const int fd = client_fds[c];
      // The validation round: the first message.
      if (!SendAll(fd, out.data(), bytes)) {
        result.valid = false;
        result.problem = "send failed";
      } else if (echo && !ReceiveAll(fd, in.data(), bytes)) {
        result.valid = false;
        result.problem = "the echo ended early";
      } else if (echo && std::memcmp(in.data(), out.data(), out.size()) != 0) {
        result.valid = false;
        result.problem = "the echo differs from the message";
      }
      if (!echo) {
        // Stream: send until told to stop; the far end counts.
        while (result.valid && !stop.load() && SendAll(fd, out.data(), bytes)) {
        }
        shutdown(fd, SHUT_WR);
        return;
      }
      while (!timing.load() && !stop.load()) std::this_thread::yield();
      // Echo, as the load client's closed loop counts: every message sent
      // before the stop counts, and the time runs to its answer.
      while (result.valid && !stop.load()) {
        const char spot = static_cast<char>(result.messages + 1);
        out[0] = out[bytes / 2] = out[bytes - 1] = spot;
        if (!SendAll(fd, out.data(), bytes) || !ReceiveAll(fd, in.data(), bytes)) {
          result.valid = false;
          result.problem = "the connection broke";
          break;
        }
        if (in[0] != spot || in[bytes / 2] != spot || in[bytes - 1] != spot) {
          result.valid = false;
          result.problem = "an echo differs from its message";
          break;
        }
        last_answer[c] = Clock::now();
        result.bytes += 2 * bytes;
        ++result.messages;
      }
      shutdown(fd, SHUT_WR);
    });
  }

  // Stream mode: let every connection get going (past its first message)
  // before the window opens.
  if (!echo) {
    for (int c = 0; c < connections; ++c) {
      while (received[c].load() < bytes && results[c].valid) std::this_thread::yield();
    }
  }
  int64_t received_before = 0;
  for (int c = 0; c < connections; ++c) received_before += received[c].load();
  start = Clock::now();
  timing.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  int64_t received_after = 0;
  for (int c = 0; c < connections; ++c) received_after += received[c].load();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  stop.store(true);
  // Each near end finishes its message and half-closes; the far ends then
  // see the end of their stream.
  for (std::thread& thread : near_ends) thread.join();
  for (std::thread& thread : far_ends) thread.join();
  for (int c = 0; c < connections; ++c) close(client_fds[c]);
  if (echo) {
    Clock::time_point last = start;
    for (int c = 0; c < connections; ++c) {
      if (results[c].messages > 0 && last_answer[c] > last) last = last_answer[c];
    }
    elapsed = std::chrono::duration<double>(last - start).count();
  } else {
    results[0].bytes = received_after - received_before;  // the total, counted once
  }

  int64_t total = 0;
  double messages = 0;
  bool valid = true;
  std::string problem;
  for (int c = 0; c < connections; ++c) {
    if (!far_end_valid[c]) {
      results[c].valid = false;
      results[c].problem = "the first message arrived changed";
    }
  }
  for (const ConnectionResult& result : results) {
    total += result.bytes;
    messages += static_cast<double>(result.messages);
    if (!result.valid && valid) problem = result.problem;
    valid = valid && result.valid;
  }
  if (!echo) messages = static_cast<double>(total) / static_cast<double>(bytes);
  const double gbps = elapsed > 0 ? static_cast<double>(total) / elapsed / 1e9 : 0.0;
  std::printf("| mode | bytes | connections | GB/s | GB/s per connection | messages/s | valid |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|\n");
  std::printf("| %s | %lld | %d | %.3f | %.3f | %.1f | %s |\n", mode.c_str(),
              static_cast<long long>(bytes), connections, gbps, gbps / connections,
              elapsed > 0 ? messages / elapsed : 0.0, valid ? "yes" : problem.c_str());
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << absl::StrFormat(
        "{\"mode\": \"%s\", \"bytes\": %d, \"connections\": %d, \"seconds\": %.6f, "
        "\"gb_per_s\": %.6f, \"gb_per_s_per_connection\": %.6f, \"messages\": %.1f, "
        "\"valid\": %s}\n",
        mode, bytes, connections, elapsed, gbps, gbps / connections, messages,
        valid ? "true" : "false");
    if (!json) {
      std::fprintf(stderr, "tcp_ceiling: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return valid ? 0 : 1;
}
