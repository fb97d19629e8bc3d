// Conversions between absl::Status (used everywhere inside the server) and
// grpc::Status (used only at the transport edge).
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_RPC_GRPC_STATUS_UTIL_H_
#define SOFTMAX_SERVER_RPC_GRPC_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace softmax::server {

// The one conversion from absl::Status to grpc::Status. The numeric codes are
// identical by design (both follow google.rpc.Code), so the code carries over
// unchanged; the message is copied.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_STATUS_UTIL_H_
