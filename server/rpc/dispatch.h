// From a validated-to-be softmax.v1 request to Admission: the one path every
// front-end's request takes (softmax.v1 unary and stream, KServe gRPC and
// HTTP, whose requests are mapped onto softmax.v1 messages by kserve.h).
//
// Thread-safety: the functions are thread-safe; each call's messages belong
// to that call.
#ifndef SOFTMAX_SERVER_RPC_DISPATCH_H_
#define SOFTMAX_SERVER_RPC_DISPATCH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "server/rpc/front_end.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/scheduling/backend.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::server {

// Tensors a request keeps outside its messages (shared-memory regions,
// server/shm/): the input is read from `input` instead of
// request.input().data(), the output written into `output` instead of the
// response. Both stay valid until the request is answered.
struct ExternalTensors {
  const char* input = nullptr;  // null: the input is in the request
  int64_t input_bytes = 0;
  MemoryKind input_memory = MemoryKind::kHost;
  int input_device = -1;
  char* output = nullptr;  // null: the output goes into the response
  int64_t output_bytes = 0;
  MemoryKind output_memory = MemoryKind::kHost;
  int output_device = -1;
  // With `input`: the input is in a backend's staging (AllocateStaging),
  // kept alive by this, and is computed there without another copy; the
  // answer is then a view of that memory, so Dispatch needs a `view`.
  std::shared_ptr<const void> input_staged;
};

// Validates `*request` and hands it to `front_end.admission`. Returns an
// error (done not called) for a bad request or a refusal (Admission::Admit);
// otherwise `done` is called exactly once with the outcome, possibly before
// Dispatch returns. On success `response` holds request_id, output and
// timing; for a request with top_k, the top K selected from the output
// (top_k.h) on the thread that calls `done`, and the output only with
// full_output (`view` is then emptied too). Both messages must live until
// `done` has run. Once accepted, the request's input data may be moved into
// the response's output: callers must not read request->input().data()
// after an OK return.
// `view` (may be null) receives the output instead of the response when
// the backend lends it (see WorkItem::output_view); it must live as long.
// `external` (may be null) places the input or output outside the
// messages; a region too small for the output is INVALID_ARGUMENT.
// `held` receives the request's share of the memory budget: the caller
// keeps it until the response is sent (null: it is given back once `done`
// has run); when `*held` is already set it is the share reserved earlier.
absl::Status Dispatch(const FrontEnd& front_end, v1::SoftmaxRequest* request,
                      v1::SoftmaxResponse* response, OutputView* view,
                      std::chrono::system_clock::time_point deadline,
                      std::function<bool()> is_cancelled,
                      std::function<void(const absl::Status&)> done,
                      const ExternalTensors* external = nullptr,
                      std::shared_ptr<const void>* held = nullptr);

// Gives a finished call's large strings back to `pool`.
void RecycleBuffers(TensorBufferPool* pool, v1::SoftmaxRequest* request,
                    v1::SoftmaxResponse* response);

// An output left in the response's own string (echo, CPU backend) is sent
// by reference when it is large, as views are, instead of being copied into
// a newly allocated message buffer: a no-op when `view` already holds one.
void LendLargeOutput(const std::shared_ptr<TensorBufferPool>& pool,
                     v1::SoftmaxResponse* response, OutputView* view);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_DISPATCH_H_
