#include "server/metrics.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {

const char* CodeName(int code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code > 16) return "UNKNOWN";
  return kNames[code];
}

// Exponential buckets: start, start*factor, ... (count of them).
prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  double value = start;
  for (int i = 0; i < count; ++i, value *= factor) bounds.push_back(value);
  return bounds;
}

// Splits "host:port" at the last colon; the host keeps IPv6 brackets.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  requests_total_ = &prometheus::BuildCounter()
                         .Name("softmax_requests_total")
                         .Help("Softmax requests answered, by method and gRPC status code.")
                         .Register(*registry_);
  request_duration_ =
      &prometheus::BuildHistogram()
           .Name("softmax_request_duration_seconds")
           .Help("Time from receiving a request to finishing its response, by method.")
           .Register(*registry_);
  build_info_ = &prometheus::BuildGauge()
                     .Name("softmax_server_info")
                     .Help("Constant 1, labelled with the device backend in use.")
                     .Register(*registry_);
  auto& batch_requests = prometheus::BuildHistogram()
                             .Name("softmax_batch_requests")
                             .Help("Requests per computed batch.")
                             .Register(*registry_);
  batch_requests_ = &batch_requests.Add({}, Exponential(1, 2, 14));
  auto& batch_rows = prometheus::BuildHistogram()
                         .Name("softmax_batch_rows")
                         .Help("Rows per computed batch.")
                         .Register(*registry_);
  batch_rows_ = &batch_rows.Add({}, Exponential(1, 4, 12));
  auto& batch_compute = prometheus::BuildHistogram()
                            .Name("softmax_batch_compute_seconds")
                            .Help("Backend compute time per batch.")
                            .Register(*registry_);
  batch_compute_ = &batch_compute.Add({}, Exponential(1e-6, 4, 12));
  auto& batches = prometheus::BuildCounter()
                      .Name("softmax_batches_total")
                      .Help("Batches computed, by outcome.")
                      .Register(*registry_);
  batches_total_ = &batches.Add({{"outcome", "ok"}});
  batch_failures_total_ = &batches.Add({{"outcome", "error"}});
  auto& dropped = prometheus::BuildCounter()
                      .Name("softmax_dropped_requests_total")
                      .Help("Queued requests dropped before compute, by reason.")
                      .Register(*registry_);
  dropped_cancelled_ = &dropped.Add({{"reason", "cancelled"}});
  dropped_deadline_ = &dropped.Add({{"reason", "deadline_exceeded"}});
  rejected_total_ = &prometheus::BuildCounter()
                         .Name("softmax_rejected_requests_total")
                         .Help("Requests refused at admission because the queue was full.")
                         .Register(*registry_)
                         .Add({});
  auto& queue = prometheus::BuildGauge()
                    .Name("softmax_queue_depth")
                    .Help("Requests waiting in the batcher's queue.")
                    .Register(*registry_);
  queue_requests_ = &queue.Add({});
  queue_bytes_ = &prometheus::BuildGauge()
                      .Name("softmax_queue_bytes")
                      .Help("Input bytes waiting in the batcher's queue.")
                      .Register(*registry_)
                      .Add({});
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& address) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  if (address.empty()) return metrics;
  try {
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", e.what()));
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", address));
  }
  metrics->bound_address_ = absl::StrCat(HostOf(address), ":", ports.front());
  return metrics;
}

std::string Metrics::BoundAddress() const { return bound_address_; }

void Metrics::RecordRequest(absl::string_view method, int code, double seconds) {
  const std::string method_label(method);
  requests_total_->Add({{"method", method_label}, {"code", CodeName(code)}}).Increment();
  request_duration_
      ->Add({{"method", method_label}}, Exponential(1e-5, 2, 20))
      .Observe(seconds);
}

void Metrics::SetDevice(absl::string_view device) {
  build_info_->Add({{"device", std::string(device)}}).Set(1);
}

void Metrics::OnBatchCompleted(const BatchStats& stats) {
  (stats.ok ? batches_total_ : batch_failures_total_)->Increment();
  batch_requests_->Observe(stats.requests);
  batch_rows_->Observe(static_cast<double>(stats.rows));
  batch_compute_->Observe(static_cast<double>(stats.compute_ns) * 1e-9);
}

void Metrics::OnRequestDropped(absl::StatusCode code) {
  (code == absl::StatusCode::kCancelled ? dropped_cancelled_ : dropped_deadline_)->Increment();
}

void Metrics::OnRequestRejected() { rejected_total_->Increment(); }

void Metrics::OnQueueDepth(int64_t requests, int64_t bytes) {
  queue_requests_->Set(static_cast<double>(requests));
  queue_bytes_->Set(static_cast<double>(bytes));
}

}  // namespace softmax::server
