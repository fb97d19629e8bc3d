// FrontEnd: what every front-end (softmax.v1 and KServe over gRPC, KServe
// over HTTP) shares: the door into the scheduler (Admission) and the pieces
// of one server around it. The wiring (server/server.cc) makes one and hands
// it to each; the pointees must outlive every front-end.
//
// Thread-safety: read-only once built; the pointees are thread-safe.
#ifndef SOFTMAX_SERVER_RPC_FRONT_END_H_
#define SOFTMAX_SERVER_RPC_FRONT_END_H_

#include <chrono>
#include <cstddef>
#include <memory>

#include "server/rpc/tensor_buffer_pool.h"
#include "server/rpc/validation.h"
#include "server/scheduling/admission.h"

namespace softmax::server {

class Metrics;
class PrematureResetGuard;
class TokenAuthenticator;

// Idle capacity the front-ends keep for large tensors (TensorBufferPool): the
// buffers of eight 64 MiB calls, twice what 4 callers of 64 MiB tensors hold
// (one each on the echo and the CUDA backend). With the pool, H200, 4 such
// callers: 6.5 GB/s of payload on the echo, 5.9 on CUDA; without, 1.3 / 1.6.
inline constexpr size_t kIdleTensorBufferBytes = size_t{512} << 20;

struct FrontEnd {
  Admission* admission = nullptr;  // required
  Metrics* metrics = nullptr;      // may be null
  // When set (--auth_tokens_file), every call but the health checks must
  // carry one of its tokens, else it fails UNAUTHENTICATED.
  const TokenAuthenticator* authenticator = nullptr;
  // Calls reset before their message arrived, counted per connection
  // (gRPC front-ends); may be null.
  PrematureResetGuard* reset_guard = nullptr;
  // Where the calls' large tensor buffers come from and go back to.
  std::shared_ptr<TensorBufferPool> buffers =
      std::make_shared<TensorBufferPool>(kIdleTensorBufferBytes);
  RequestLimits limits;
  // Responses a stream may have unwritten (queued, computing or waiting to
  // be written) before it stops reading more requests.
  int max_stream_pending = 1024;
  // A stream open longer than this stops reading, answers what it has read
  // and ends with UNAVAILABLE ("reopen"), so that a long-lived stream moves
  // to a new connection (and perhaps a new replica) like a unary caller
  // does after the connection's max age. Messages the client sent that were
  // not read are not computed and may be sent again. 0: streams live on.
  std::chrono::milliseconds max_stream_age{0};
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_FRONT_END_H_
