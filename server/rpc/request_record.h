// RequestRecord: what one answered request leaves behind, the same for every
// front-end (softmax.v1 unary and stream, KServe gRPC unary and stream,
// KServe HTTP): one count, latency and bandwidth in the request metrics
// (softmax_requests_total{method,code} and its histograms), one line in the
// access log, and, for a request of a known KServe model, Triton's
// per-model statistics (success or failure, with the batcher's timing).
//
// A front-end fills one as the request arrives and writes it exactly once,
// when the answer is on its way, whichever way the request ended (refused,
// invalid, failed or answered); a stream writes one per request answered,
// none for a chunk taken into another request. Every record written is a
// response sent, so the request counters equal the responses.
//
// Thread-safety: WriteRequestRecord is thread-safe (its sinks are).
#ifndef SOFTMAX_SERVER_RPC_REQUEST_RECORD_H_
#define SOFTMAX_SERVER_RPC_REQUEST_RECORD_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metrics.h"
#include "server/rpc/kserve.h"
#include "server/scheduling/inference_request.h"

namespace softmax::server {

struct RequestRecord {
  explicit RequestRecord(RpcMethod method) : method(method) {}

  RpcMethod method;
  // When the request arrived: its latency runs from here to the write.
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  // The request's input bytes as received; its output is counted as large.
  int64_t data_bytes = 0;
  // The KServe model it named, once known (none for softmax.v1).
  std::optional<kserve::Model> model;
  // The batcher's timing (zero unless it reached the batcher); the
  // statistics read it on success.
  RequestTiming timing;
};

// Where records go. Each pointer may be null (no --metrics_address; a
// softmax.v1 front-end keeps no model statistics).
struct RecordSinks {
  Metrics* metrics = nullptr;
  kserve::ModelStatistics* statistics = nullptr;
};

// Writes `record` of a request that ended with `status` into `sinks` and
// the access log. `peer` names the caller; called only when the line is
// logged.
void WriteRequestRecord(const RequestRecord& record, const absl::Status& status,
                        const RecordSinks& sinks, absl::FunctionRef<std::string()> peer);

// The access log's name of `method` ("Softmax", "ModelInfer", "http_infer").
absl::string_view AccessLogName(RpcMethod method);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_REQUEST_RECORD_H_
