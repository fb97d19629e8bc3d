// Conversions between absl::Status (used everywhere inside the server) and
// grpc::Status (used only at the transport edge).
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_RPC_STATUS_UTIL_H_
#define SOFTMAX_SERVER_RPC_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace softmax::server {

// The one conversion from absl::Status to grpc::Status. The numeric codes are
// identical by design (both follow google.rpc.Code), so the code carries over
// unchanged; the message is copied.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace softmax::server

// Returns from the calling function when `expr` (an absl::Status) is not OK.
// Abseil 20220623 has no RETURN_IF_ERROR of its own.
#define SOFTMAX_RETURN_IF_ERROR(expr)                   \
  do {                                                  \
    const ::absl::Status softmax_status_ = (expr);      \
    if (!softmax_status_.ok()) return softmax_status_;  \
  } while (false)

#endif  // SOFTMAX_SERVER_RPC_STATUS_UTIL_H_
