// Prometheus metrics for the server: a registry, the HTTP exposer serving
// /metrics (MetricsExposer, a Listener), and typed recording methods so call sites never touch
// prometheus-cpp directly. Names follow Prometheus conventions (base units,
// `_seconds`, `_bytes`, `_total`, one unit per metric); the full list, with
// what each measures, is in docs/metrics.md, and
// deploy/prometheus/alerts.yml and the Grafana dashboard depend on them.
//
// Cost: per-request recording touches only label children created ahead of
// time (or once, on first use of a status code) and cached in atomics; no
// label strings are built per request. Allocator figures are not recorded at
// all on the hot path: a Collectable reads Backend::Memory() when Prometheus
// scrapes.
//
// Thread-safety: every method may be called from any thread. SetBackends,
// SetQueueCapacity are meant for start-up.
#ifndef SOFTMAX_SERVER_METRICS_METRICS_H_
#define SOFTMAX_SERVER_METRICS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/listener.h"
#include "server/metrics/nvml_collector.h"
#include "server/scheduling/backend.h"
#include "server/scheduling/batcher.h"

namespace softmax::server {

// The RPC a request arrived on: the `method` label of the request metrics.
enum class RpcMethod {
  kSoftmax = 0,        // unary softmax.v1.SoftmaxService/Softmax
  kSoftmaxStream = 1,  // one request (message) on SoftmaxStream
  // The Open Inference Protocol (KServe v2), server/rpc/kserve_*.
  kModelInfer = 2,        // unary inference.GRPCInferenceService/ModelInfer
  kModelStreamInfer = 3,  // one request (message) on ModelStreamInfer
  kHttpInfer = 4,         // POST /v2/models/{model}/infer
};

class MetricsExposer;

class Metrics final : public BatcherObserver {
 public:
  // Creates the metrics; when `address` (host:port, port 0 picks a free one)
  // is non-empty, also serves them at http://address/metrics. UNAVAILABLE
  // when the address cannot be bound. (softmax-server creates no Metrics at
  // all when --metrics_address is empty, so nothing is recorded; an empty
  // address here gives an unexposed instance, which Server exposes through
  // a MetricsExposer of its own.)
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& address);
  // Stops the exposer before anything it reads is destroyed.
  ~Metrics() override;

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // host:port Create's exposer bound, or "off" without one.
  std::string BoundAddress() const;
  // What a scrape collects: the registry and the scrape-time collectors.
  std::vector<std::shared_ptr<prometheus::Collectable>> Collectables() const;

  // The backends chosen at start, in the scheduler's order (BatchStats::
  // backend indexes them); empty for --device=none. Each one's Name() is the
  // `device` label of its softmax_device_info, peak bandwidth gauge
  // (exported only when known), occupancy gauges, batch metrics and, at
  // every scrape, allocator figures and, for GPUs, NVML's health readings
  // (nvml_collector.h). Before this call batch metrics carry no device label.
  // REQUIRES: the backends outlive this object; called at most once, before
  // serving.
  void SetBackends(const std::vector<const Backend*>& backends);

  // The batcher's admission bounds (softmax_queue_capacity_*).
  void SetQueueCapacity(int64_t requests, int64_t bytes);

  // softmax_shared_memory_regions / _bytes{kind}: the shared-memory regions
  // registered ("system" or "cuda") and the bytes they span.
  void SetSharedMemory(const std::string& kind, int64_t regions, int64_t bytes);

  // softmax_held_bytes: tensor bytes requests hold until answered (the
  // memory budget); softmax_held_bytes_limit: --max_held_bytes (0: none).
  void SetHeldBytes(int64_t bytes) { held_bytes_->Set(static_cast<double>(bytes)); }
  void SetHeldBytesLimit(int64_t bytes) { held_bytes_limit_->Set(static_cast<double>(bytes)); }

  // softmax_serving: true once listening, false from the start of draining
  // or after a device fault.
  void SetServing(bool serving);

  // softmax_gpu_unusable{cause} = 1: --device=auto found a GPU it cannot use
  // (`cause`: "driver", "no_cuda_backend", "backend_start"; see
  // GpuUnusableCause in server/device.h) and serves on the CPU. Not exported
  // otherwise. REQUIRES: called at most once, before serving.
  void SetGpuUnusable(absl::string_view cause);

  // softmax_gpu_plans_identical: 1 when every GPU of the server has the same
  // launch plan (answers bit-identical whichever GPU computes them; always
  // for one GPU), 0 when they differ. Not exported without a GPU backend.
  // REQUIRES: called at most once, before serving.
  void SetGpuPlansIdentical(bool identical);

  // One finished RPC (unary) or one response on a stream: counts it by
  // method and status code, and observes its latency (received to response
  // sent). `bytes` is what the request moved in and out (input + output
  // data); for an OK request with bytes > 0 it also observes the request's
  // bandwidth, bytes / seconds.
  void RecordRequest(RpcMethod method, absl::StatusCode code, double seconds, int64_t bytes);

  // A request leaving the batcher: its queue time always; the compute time
  // of its batch when it rode in one (timing.batch_requests > 0; requests
  // dropped while queued have none).
  void RecordRequestTiming(const RequestTiming& timing);

  // BatcherObserver.
  void OnBatchCompleted(const BatchStats& stats) override;
  void OnRequestDropped(absl::StatusCode code) override;
  void OnRequestRejected() override;
  void OnQueueDepth(int64_t requests, int64_t bytes) override;

  // Everything /metrics serves (the registry, the allocator and the NVML
  // collectables), whether or not an exposer runs.
  std::vector<prometheus::MetricFamily> Collect() const;

  prometheus::Registry& registry() { return *registry_; }

 private:
  class MemoryCollectable;
  static constexpr int kMethods = 5;
  static constexpr int kCodes = 17;  // grpc::StatusCode OK .. UNAUTHENTICATED

  // The batch metrics of one device.
  struct DeviceSeries {
    prometheus::Histogram* batch_requests = nullptr;
    prometheus::Histogram* batch_rows = nullptr;
    prometheus::Histogram* batch_bandwidth = nullptr;
    prometheus::Counter* batches_ok = nullptr;
    prometheus::Counter* batches_failed = nullptr;
    prometheus::Counter* kernel_launches = nullptr;
  };
  // The occupancy probe's gauge families, made with the first GPU.
  struct OccupancyFamilies {
    prometheus::Family<prometheus::Gauge>* blocks = nullptr;
    prometheus::Family<prometheus::Gauge>* registers = nullptr;
    prometheus::Family<prometheus::Gauge>* shared = nullptr;
    prometheus::Family<prometheus::Gauge>* grid = nullptr;
    prometheus::Family<prometheus::Gauge>* threads = nullptr;
    prometheus::Family<prometheus::Gauge>* cluster = nullptr;
  };

  Metrics();
  prometheus::Counter& RequestCounter(RpcMethod method, absl::StatusCode code);
  DeviceSeries AddDeviceSeries(const prometheus::Labels& labels);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<MemoryCollectable> memory_;
  std::shared_ptr<NvmlCollector> gpu_health_;

  prometheus::Family<prometheus::Counter>* requests_total_;
  std::array<std::array<std::atomic<prometheus::Counter*>, kCodes>, kMethods> request_counters_;
  std::array<prometheus::Histogram*, kMethods> request_duration_;
  prometheus::Histogram* request_bandwidth_;
  prometheus::Histogram* queue_duration_;
  prometheus::Histogram* compute_duration_;

  prometheus::Family<prometheus::Histogram>* batch_requests_family_;
  prometheus::Family<prometheus::Histogram>* batch_rows_family_;
  prometheus::Family<prometheus::Histogram>* batch_bandwidth_family_;
  prometheus::Family<prometheus::Counter>* batches_family_;
  prometheus::Family<prometheus::Counter>* kernel_launches_family_;
  // Per backend, in the scheduler's order; written only before serving.
  std::vector<DeviceSeries> devices_;
  OccupancyFamilies occupancy_;
  prometheus::Counter* dropped_cancelled_;
  prometheus::Counter* dropped_deadline_;
  prometheus::Counter* rejected_total_;

  prometheus::Gauge* queued_requests_;
  prometheus::Gauge* queued_bytes_;
  prometheus::Gauge* queue_capacity_requests_;
  prometheus::Gauge* queue_capacity_bytes_;
  prometheus::Gauge* serving_;
  prometheus::Gauge* held_bytes_ = nullptr;
  prometheus::Gauge* held_bytes_limit_ = nullptr;
  // softmax_shared_memory_{regions,bytes}: [0] system, [1] cuda.
  prometheus::Gauge* shared_memory_regions_[2] = {};
  prometheus::Gauge* shared_memory_bytes_[2] = {};

  // Declared last: destroyed first, so no scrape runs while the members it
  // reads are torn down.
  std::unique_ptr<MetricsExposer> exposer_;
};

// Serves a Metrics' collectables at http://address/metrics: a Listener whose
// stop is civetweb's (StoppedByOneCall: the port closes, a scrape being
// answered finishes; about a second). Recording goes on whether or not it
// serves.
class MetricsExposer final : public StoppedByOneCall {
 public:
  // `metrics` must outlive the exposer. `address`: host:port, port 0 picks
  // a free one.
  MetricsExposer(const Metrics* metrics, std::string address);
  ~MetricsExposer() override;

  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  const char* name() const override { return "metrics"; }
  // UNAVAILABLE when the address cannot be bound.
  absl::Status Start() override;
  std::string BoundAddress() const override { return bound_address_; }

 private:
  void Stop() override;

  const Metrics* const metrics_;
  const std::string address_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_METRICS_METRICS_H_
