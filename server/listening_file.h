// The listening file (--listening_file): what a started softmax-server
// listens on, for scripts and tests that start it on port 0 and must learn
// the ports it was given, without parsing its log.
//
// The file is one JSON object:
//   {"grpc": "127.0.0.1:41251", "http": "127.0.0.1:8000", "metrics": "off",
//    "pid": 1234, "version": "0.1.0", "revision": "1a2b3c4"}
// with each endpoint's bound host:port (the port the kernel picked where :0
// was asked), or "off" for one not served. It is written once, when every
// listener is up, to a temporary file beside PATH that is then renamed over
// it: a reader sees no file, an older server's, or this one's whole.
//
// Thread-safety: thread-compatible (one call at a time per path).
#ifndef SOFTMAX_SERVER_LISTENING_FILE_H_
#define SOFTMAX_SERVER_LISTENING_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace softmax::server {

struct ListeningInfo {
  std::string grpc;     // host:port
  std::string http;     // host:port or "off"
  std::string metrics;  // host:port or "off"
  int64_t pid = 0;
  std::string version;
  std::string revision;
};

// `info` as the file's JSON text (one line, newline-terminated).
std::string ListeningJson(const ListeningInfo& info);

// Writes ListeningJson(info) to `path` atomically (temporary file, then
// rename). On failure (the folder missing or not writable) returns
// FAILED_PRECONDITION naming the path and the system's reason, and leaves
// `path` as it was.
absl::Status WriteListeningFile(const std::string& path, const ListeningInfo& info);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_LISTENING_FILE_H_
