#include "server/rpc/request_record.h"

#include "server/logging/log.h"

namespace softmax::server {

absl::string_view AccessLogName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kSoftmax: return "Softmax";
    case RpcMethod::kSoftmaxStream: return "SoftmaxStream";
    case RpcMethod::kModelInfer: return "ModelInfer";
    case RpcMethod::kModelStreamInfer: return "ModelStreamInfer";
    case RpcMethod::kHttpInfer: return "http_infer";
  }
  return "unknown";
}

void WriteRequestRecord(const RequestRecord& record, const absl::Status& status,
                        const RecordSinks& sinks, absl::FunctionRef<std::string()> peer) {
  const int64_t elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - record.start)
                                 .count();
  if (record.model.has_value() && sinks.statistics != nullptr) {
    if (status.ok()) {
      sinks.statistics->RecordSuccess(*record.model, elapsed_ns, record.timing);
    } else {
      sinks.statistics->RecordFailure(*record.model, elapsed_ns);
    }
  }
  const double seconds = static_cast<double>(elapsed_ns) * 1e-9;
  const int64_t bytes = 2 * record.data_bytes;
  if (sinks.metrics != nullptr) {
    sinks.metrics->RecordRequest(record.method, status.code(), seconds, bytes);
  }
  logging::LogAccess(AccessLogName(record.method), status.code(), bytes, seconds, peer);
}

}  // namespace softmax::server
