// `softmax-client call`: one request, random or read from a .npy file. Prints
// a summary of the result, optionally writes it to a .npy file and checks it
// against the float64 reference (client/summary.h).
//
// Thread-safety: RunCallMode writes to std::cout and std::cerr; call it from
// one thread at a time.
#ifndef SOFTMAX_CLIENT_CALL_MODE_H_
#define SOFTMAX_CLIENT_CALL_MODE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// Everything call mode needs; main.cc fills it from the flags.
struct CallModeOptions {
  ChannelOptions channel;
  CallOptions call;                 // timeout, stream, wait_for_ready
  std::vector<int64_t> shape;       // random input shape
  std::optional<v1::DType> dtype;   // unset: float32, or the file's type
  int axis = -1;
  float temperature = 1.0f;
  bool log = false;
  std::string input_path;           // empty: random input
  std::string output_path;          // empty: no file written
  std::string request_id;
  uint64_t seed = 42;               // of the random input
  bool check = false;               // compare with the float64 reference
  int64_t top_k = 0;                // > 0: ask for the K largest of each row only
};

// Makes or reads the input, sends it, prints the summary, and writes and
// checks the result as asked. Returns the process's exit code
// (client/exit_codes.h): kExitUsage for an input it cannot make or read or an
// output it cannot write, kExitRpcFailed when the call fails or the answer is
// malformed, kExitCheckFailed when the check finds elements out of tolerance.
int RunCallMode(const CallModeOptions& options);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_CALL_MODE_H_
