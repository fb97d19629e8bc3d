// Status helpers free of any transport.
//
// Thread-safety: macros over the caller's values.
#ifndef SOFTMAX_SERVER_RPC_STATUS_MACROS_H_
#define SOFTMAX_SERVER_RPC_STATUS_MACROS_H_

#include "absl/status/status.h"

// Returns from the calling function when `expr` (an absl::Status) is not OK.
// Abseil 20220623 has no RETURN_IF_ERROR of its own.
#define SOFTMAX_RETURN_IF_ERROR(expr)                   \
  do {                                                  \
    const ::absl::Status softmax_status_ = (expr);      \
    if (!softmax_status_.ok()) return softmax_status_;  \
  } while (false)

#endif  // SOFTMAX_SERVER_RPC_STATUS_MACROS_H_
