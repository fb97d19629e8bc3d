// The exit codes of softmax-client, shared by its modes, and how a mode
// reports a failure on the way out.
//
//   0 success
//   1 the RPC failed (its status code and message are printed), or for health
//     the server is not SERVING, or for load the run could not be made, a
//     report could not be written, or --verify found a failed or mismatched
//     response
//   2 bad usage or unreadable input
//   3 call's --check found elements outside the tolerance
// (Abseil's parser exits 1 by itself on an unknown flag or a value of the
// wrong type.)
//
// Thread-safety: ExitWithStatus writes to std::cerr, which the caller shares.
#ifndef SOFTMAX_CLIENT_EXIT_CODES_H_
#define SOFTMAX_CLIENT_EXIT_CODES_H_

#include <iostream>

#include "absl/status/status.h"

namespace softmax::client {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCheckFailed = 3;

// Prints "softmax-client: CODE: message" for `status` to stderr and returns
// `exit_code`, for `return ExitWithStatus(kExitUsage, status);`.
inline int ExitWithStatus(int exit_code, const absl::Status& status) {
  std::cerr << "softmax-client: " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
  return exit_code;
}

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_EXIT_CODES_H_
