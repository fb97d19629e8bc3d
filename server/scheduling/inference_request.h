// InferenceRequest: one request as every front-end hands it to the
// scheduler, whatever protocol it came by (softmax.v1 over gRPC, KServe
// over gRPC or HTTP). A front-end builds it from its own wire form, points
// its output sink at its own reply's buffers, submits it (server/rpc/
// dispatch.h validates it, Admission admits it) and, once its Responder is
// called, encodes its own reply from what the sink received. Nothing behind
// the front-ends knows which protocol a request came by.
//
//   front-end -> InferenceRequest + Responder -> validation -> Admission
//             -> (batcher, private to server/scheduling/) -> Responder
//
// Thread-safety: plain values; a request belongs to one call at a time.
#ifndef SOFTMAX_SERVER_SCHEDULING_INFERENCE_REQUEST_H_
#define SOFTMAX_SERVER_SCHEDULING_INFERENCE_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

// Per-request timing, reported to the Responder.
struct RequestTiming {
  int64_t queue_ns = 0;       // admission to the submit of its batch
  int64_t compute_ns = 0;     // the backend's time for its batch
  int64_t kernel_ns = 0;      // of which its kernels (BatchResult::kernel_ns)
  int64_t dispatch_ns = 0;    // submit to the start of that compute
  int32_t batch_requests = 0;
  int64_t batch_rows = 0;
};

// The input tensor's bytes: a view, and what keeps them alive.
struct InputTensor {
  const char* data = nullptr;
  int64_t bytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // the GPU of a kDevice input
  // In memory the server does not hold for the request (a caller's
  // shared-memory region, or a backend's staging whose budget was reserved
  // as it arrived): not counted against the memory budget again, and read
  // where it is (`memory`, `device`).
  bool external = false;
  // Optional: the string `data` points into (the call's own message
  // buffer), which echo may move into the output instead of copying it.
  std::string* buffer = nullptr;
  // With `buffer`: the batcher may move it into the output too
  // (Backend::ComputesInPlace), or free it once staged. Off for a pooled
  // buffer, which goes back to its pool when the call is done.
  bool buffer_is_movable = false;
  // Optional: keeps `data` alive until the request is answered (a
  // backend's staging, Backend::AllocateStaging, into which the data was
  // assembled; the batcher then computes there without another copy).
  std::shared_ptr<const void> staged;
};

// The K largest values of each row and their indices, when asked for.
struct TopKResult {
  std::string values;               // of the request's dtype, row-major
  std::string indices;              // int64, little-endian, as many
  std::vector<int64_t> dims;        // of both: the input's, the axis K long
};

// Where the answer goes; everything pointed to belongs to the front-end's
// call and must live until its Responder has run.
struct OutputSink {
  // The reply's own buffer, resized to the output's bytes (unless `region`).
  std::string* buffer = nullptr;
  // Optional: receives the output instead of `buffer` when the backend
  // lends it (OutputView); null: the output is always in `buffer`.
  OutputView* view = nullptr;
  // Optional: a caller's shared-memory region the output is written into
  // instead (then neither `buffer` nor `view` is touched).
  char* region = nullptr;
  int64_t region_bytes = 0;
  MemoryKind region_memory = MemoryKind::kHost;
  int region_device = -1;
  // Required with top_k > 0: where the top K goes (dispatch.h).
  TopKResult* top_k = nullptr;
};

// Fields validation (server/rpc/validation.h) derives from the request.
struct ValidatedTensor {
  bool valid = false;  // set by validation; Admission requires it
  int axis = 0;        // normalised to [0, rank) (0 for a scalar)
  // The problem as [outer, n, inner]. For a tensor with no elements, outer
  // is 0 and inner 1, so rows() == 0 and no row is ever computed.
  SoftmaxShape shape;
  SoftmaxOptions options;
  int64_t elements = 0;
  int64_t bytes = 0;  // elements * ItemSize(dtype) == input.bytes
};

struct InferenceRequest {
  // The caller's id, echoed on the answer; a view into the call's message.
  absl::string_view id;
  DType dtype = DType::kFloat32;  // the front-end checks its wire's dtype
  std::vector<int64_t> dims;   // the input's shape
  int64_t axis = -1;           // negative counts from the end
  std::optional<double> temperature;  // unset: 1
  bool log = false;            // log-softmax instead of softmax
  // 0: the whole output; K > 0: the K largest values of each row along the
  // axis and their indices, into output.top_k.
  int64_t top_k = 0;
  bool full_output = false;    // with top_k: the whole output too
  InputTensor input;
  OutputSink output;
  // Past this point the request is dropped before compute.
  std::chrono::system_clock::time_point deadline =
      std::chrono::system_clock::time_point::max();
  // Polled just before compute; may be empty.
  std::function<bool()> is_cancelled;
  ValidatedTensor tensor;  // filled by validation
};

// How a submitted request is answered: `done` exactly once, with its
// outcome (and, on OK, the batcher's timing; zero for refusals and echo).
struct Responder {
  std::function<void(const absl::Status&, const RequestTiming&)> done;
  // A gRPC unary call's: a refusal while draining is held across
  // grpc::Server::Shutdown's GOAWAY (Admission::HoldRefusals). Streams
  // answer in band and KServe HTTP sends its 503 at once (no GOAWAY).
  bool hold_refusals = false;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_INFERENCE_REQUEST_H_
