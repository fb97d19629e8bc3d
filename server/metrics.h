// Prometheus metrics for the server: a registry, the HTTP exposer serving
// /metrics, and typed recording methods so call sites never touch
// prometheus-cpp directly. Names follow Prometheus conventions (base units,
// `_seconds`, `_bytes`, `_total`).
//
// Thread-safety: every method may be called from any thread.
#ifndef SOFTMAX_SERVER_METRICS_H_
#define SOFTMAX_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/batcher.h"

namespace softmax::server {

class Metrics final : public BatcherObserver {
 public:
  // Creates the metrics; when `address` (host:port, port 0 picks a free one)
  // is non-empty, also serves them at http://address/metrics. UNAVAILABLE
  // when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& address);
  ~Metrics() override;

  // host:port actually bound, or "off" when not exposed.
  std::string BoundAddress() const;

  // One finished RPC (unary) or one response on a stream. `method` is
  // "Softmax" or "SoftmaxStream"; `code` a grpc::StatusCode value.
  void RecordRequest(absl::string_view method, int code, double seconds);

  // The device backend chosen at start ("cpu", "cuda:0", "none").
  void SetDevice(absl::string_view device);

  // BatcherObserver.
  void OnBatchCompleted(const BatchStats& stats) override;
  void OnRequestDropped(absl::StatusCode code) override;
  void OnRequestRejected() override;
  void OnQueueDepth(int64_t requests, int64_t bytes) override;

  prometheus::Registry& registry() { return *registry_; }

 private:
  Metrics();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_ = "off";

  prometheus::Family<prometheus::Counter>* requests_total_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  prometheus::Family<prometheus::Gauge>* build_info_;
  prometheus::Histogram* batch_requests_;
  prometheus::Histogram* batch_rows_;
  prometheus::Histogram* batch_compute_;
  prometheus::Counter* batches_total_;
  prometheus::Counter* batch_failures_total_;
  prometheus::Counter* dropped_cancelled_;
  prometheus::Counter* dropped_deadline_;
  prometheus::Counter* rejected_total_;
  prometheus::Gauge* queue_requests_;
  prometheus::Gauge* queue_bytes_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_METRICS_H_
