#include "server/metrics/metrics.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/civetweb_stop.h"

// Set by server/CMakeLists.txt for this file only (a new revision recompiles
// one file): the CMake project version and `git describe` of the tree.
#ifndef SOFTMAX_VERSION
#define SOFTMAX_VERSION "unknown"
#endif
#ifndef SOFTMAX_GIT_REVISION
#define SOFTMAX_GIT_REVISION "unknown"
#endif

namespace softmax::server {
namespace {

// gRPC status code names, indexed by code (absl and gRPC number them alike).
constexpr const char* kCodeNames[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};
constexpr const char* kMethodNames[] = {"Softmax", "SoftmaxStream", "ModelInfer",
                                        "ModelStreamInfer", "http_infer"};

// 1, 2.5, 5 per decade from 10^first to 10^last inclusive. Parsed from text
// so each bound is the double nearest its decimal (and prints as such).
prometheus::Histogram::BucketBoundaries Decades(int first, int last) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (int exponent = first; exponent <= last; ++exponent) {
    for (const char* mantissa : {"1", "2.5", "5"}) {
      bounds.push_back(std::strtod(absl::StrCat(mantissa, "e", exponent).c_str(), nullptr));
      if (exponent == last) break;
    }
  }
  return bounds;
}

// base, base*factor, ... (count of them).
prometheus::Histogram::BucketBoundaries Exponential(double base, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (int i = 0; i < count; ++i, base *= factor) bounds.push_back(base);
  return bounds;
}

// Latency histograms: 10 us to 10 s.
prometheus::Histogram::BucketBoundaries SecondsBuckets() { return Decades(-5, 1); }
// Bandwidth histograms: 1 MB/s to 10 TB/s (an H200 peaks near 4.8 TB/s).
prometheus::Histogram::BucketBoundaries BandwidthBuckets() { return Decades(6, 13); }

// civetweb serves one connection per thread, for as long as the client
// takes to send its request: prometheus-cpp's 2 threads let two half-open
// connections stall every scrape. 64 threads (idle ones cost a stack of
// virtual memory) keep /metrics answering with 50 half-open connections
// held (tests/test_abuse.py), and a request not complete within 2 s (a
// scrape's request takes microseconds) frees its thread.
constexpr int kExposerThreads = 64;
constexpr int kExposerRequestTimeoutMs = 2000;

// Splits "host:port" at the last colon; the host keeps IPv6 brackets.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// Registers in `registry` the family that `builder` (prometheus::BuildCounter()
// and the like) builds, under `name` and `help`.
template <typename Builder>
auto& AddFamily(prometheus::Registry& registry, Builder builder, const std::string& name,
                const std::string& help) {
  return builder.Name(name).Help(help).Register(registry);
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels = {}) {
  return AddFamily(registry, prometheus::BuildGauge(), name, help).Add(labels);
}

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels = {}) {
  return AddFamily(registry, prometheus::BuildCounter(), name, help).Add(labels);
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return AddFamily(registry, prometheus::BuildHistogram(), name, help).Add({}, buckets);
}

}  // namespace

// Reads the backend's allocator statistics when scraped. Families with no
// samples (the CPU backend has no allocator) are left out.
class Metrics::MemoryCollectable final : public prometheus::Collectable {
 public:
  // REQUIRES: before the first scrape; the backends outlive this object.
  void SetBackends(std::vector<const Backend*> backends) { backends_ = std::move(backends); }

  std::vector<prometheus::MetricFamily> Collect() const override {
    // Each backend's statistics, labelled with its device.
    std::vector<std::pair<std::string, MemoryStats>> memory;
    for (const Backend* backend : backends_) {
      for (MemoryStats& stats : backend->Memory()) memory.emplace_back(backend->Name(), stats);
    }
    if (memory.empty()) return {};
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> families;
    auto add = [&](const char* name, const char* help, MetricType type,
                   int64_t MemoryStats::*field) {
      prometheus::MetricFamily family{name, help, type, {}};
      for (const auto& [device, stats] : memory) {
        prometheus::ClientMetric metric;
        metric.label.push_back({"device", device});
        metric.label.push_back({"memory", stats.memory});
        const double value = static_cast<double>(stats.*field);
        if (type == MetricType::Counter) {
          metric.counter.value = value;
        } else {
          metric.gauge.value = value;
        }
        family.metric.push_back(std::move(metric));
      }
      families.push_back(std::move(family));
    };
    add("softmax_allocator_in_use_bytes",
        "Bytes handed out by the caching allocator and not yet freed.",
        MetricType::Gauge, &MemoryStats::in_use_bytes);
    add("softmax_allocator_cached_bytes", "Bytes the caching allocator holds free for reuse.",
        MetricType::Gauge, &MemoryStats::cached_bytes);
    add("softmax_allocator_peak_bytes", "Highest softmax_allocator_in_use_bytes since start.",
        MetricType::Gauge, &MemoryStats::peak_bytes);
    add("softmax_allocator_requests_total", "Allocations asked of the caching allocator.",
        MetricType::Counter, &MemoryStats::allocations);
    add("softmax_allocator_cache_hits_total",
        "Allocations served from the allocator's cache, without a backing allocation.",
        MetricType::Counter, &MemoryStats::cache_hits);
    add("softmax_allocator_backing_allocations_total",
        "Backing allocations made (cudaMalloc / cudaHostAlloc); flat after warm-up.",
        MetricType::Counter, &MemoryStats::raw_allocations);
    prometheus::MetricFamily pinned{
        "softmax_pinned_staging_bytes",
        "Pinned host staging memory held (in use + cached of memory=\"pinned\").",
        MetricType::Gauge,
        {}};
    for (const auto& [device, stats] : memory) {
      if (stats.memory != "pinned") continue;
      prometheus::ClientMetric metric;
      metric.label.push_back({"device", device});
      metric.gauge.value = static_cast<double>(stats.in_use_bytes + stats.cached_bytes);
      pinned.metric.push_back(std::move(metric));
    }
    if (!pinned.metric.empty()) families.push_back(std::move(pinned));
    return families;
  }

 private:
  std::vector<const Backend*> backends_;
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      memory_(std::make_shared<MemoryCollectable>()),
      gpu_health_(std::make_shared<NvmlCollector>()) {
  prometheus::Registry& r = *registry_;
  requests_total_ = &AddFamily(r, prometheus::BuildCounter(), "softmax_requests_total",
                               "Requests answered (unary calls and stream messages), by method "
                               "and gRPC status code.");
  for (auto& per_method : request_counters_) {
    for (auto& counter : per_method) counter.store(nullptr);
  }
  auto& duration = AddFamily(r, prometheus::BuildHistogram(), "softmax_request_duration_seconds",
                             "Time from receiving a request to sending its response, by method.");
  for (int m = 0; m < kMethods; ++m) {
    request_duration_[m] = &duration.Add({{"method", kMethodNames[m]}}, SecondsBuckets());
    // OK exists from the start, so rate() over it has a baseline.
    RequestCounter(static_cast<RpcMethod>(m), absl::StatusCode::kOk);
  }
  request_bandwidth_ = &AddHistogram(
      r, "softmax_request_bandwidth_bytes_per_second",
      "Per OK request: input + output bytes over its latency.", BandwidthBuckets());
  queue_duration_ = &AddHistogram(r, "softmax_queue_duration_seconds",
                                  "Per request: time queued before its batch was submitted.",
                                  SecondsBuckets());
  compute_duration_ = &AddHistogram(r, "softmax_compute_duration_seconds",
                                    "Per request: compute time of the batch it rode in.",
                                    SecondsBuckets());

  batch_requests_family_ = &AddFamily(r, prometheus::BuildHistogram(), "softmax_batch_requests",
                                      "Requests per computed batch, by device.");
  batch_rows_family_ = &AddFamily(r, prometheus::BuildHistogram(), "softmax_batch_rows",
                                  "Rows per computed batch, by device.");
  batch_bandwidth_family_ =
      &AddFamily(r, prometheus::BuildHistogram(), "softmax_batch_bandwidth_bytes_per_second",
                 "Per OK batch, by device: bytes the kernels read and wrote over kernel time "
                 "(CUDA events; the CPU backend: over compute time).");
  batches_family_ = &AddFamily(r, prometheus::BuildCounter(), "softmax_batches_total",
                               "Batches computed, by device and outcome (ok, error).");
  kernel_launches_family_ =
      &AddFamily(r, prometheus::BuildCounter(), "softmax_kernel_launches_total",
                 "Kernel launches made, by device (0 on the CPU backend).");
  // Unlabelled until SetBackends names the devices.
  devices_.push_back(AddDeviceSeries({}));
  auto& dropped = AddFamily(r, prometheus::BuildCounter(), "softmax_dropped_requests_total",
                            "Queued requests dropped before compute, by reason.");
  dropped_cancelled_ = &dropped.Add({{"reason", "cancelled"}});
  dropped_deadline_ = &dropped.Add({{"reason", "deadline_exceeded"}});
  rejected_total_ = &AddCounter(r, "softmax_rejected_requests_total",
                                "Requests refused at admission because the queue was full.");

  queued_requests_ =
      &AddGauge(r, "softmax_queued_requests", "Requests waiting in the batcher's queue.");
  queued_bytes_ =
      &AddGauge(r, "softmax_queued_bytes", "Input bytes waiting in the batcher's queue.");
  queue_capacity_requests_ =
      &AddGauge(r, "softmax_queue_capacity_requests",
                "Admission limit on queued requests (--max_queued_requests).");
  queue_capacity_bytes_ =
      &AddGauge(r, "softmax_queue_capacity_bytes",
                "Admission limit on queued input bytes (half of --max_held_bytes).");
  {
    auto& regions = AddFamily(r, prometheus::BuildGauge(), "softmax_shared_memory_regions",
                              "Shared-memory regions registered, by kind (system, cuda).");
    auto& bytes = AddFamily(r, prometheus::BuildGauge(), "softmax_shared_memory_bytes",
                            "Bytes of the shared-memory regions registered, by kind.");
    for (int k = 0; k < 2; ++k) {
      const std::string kind = k == 0 ? "system" : "cuda";
      shared_memory_regions_[k] = &regions.Add({{"kind", kind}});
      shared_memory_bytes_[k] = &bytes.Add({{"kind", kind}});
    }
  }
  held_bytes_ = &AddGauge(r, "softmax_held_bytes",
                         "Tensor bytes (input + output) held by requests until answered.");
  held_bytes_limit_ = &AddGauge(r, "softmax_held_bytes_limit",
                               "The memory budget on held tensor bytes (--max_held_bytes).");
  serving_ = &AddGauge(r, "softmax_serving",
                       "1 while serving; 0 while starting, draining or after a device fault.");
  AddGauge(r, "softmax_build_info", "Constant 1, labelled with the build's version and revision.",
           {{"version", SOFTMAX_VERSION}, {"revision", SOFTMAX_GIT_REVISION}})
      .Set(1);
}

Metrics::~Metrics() { exposer_.reset(); }

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& address) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  if (address.empty()) return metrics;
  metrics->exposer_ = std::make_unique<MetricsExposer>(metrics.get(), address);
  if (absl::Status started = metrics->exposer_->Start(); !started.ok()) return started;
  return metrics;
}

std::string Metrics::BoundAddress() const {
  return exposer_ != nullptr ? exposer_->BoundAddress() : "off";
}

std::vector<std::shared_ptr<prometheus::Collectable>> Metrics::Collectables() const {
  return {registry_, memory_, gpu_health_};
}

MetricsExposer::MetricsExposer(const Metrics* metrics, std::string address)
    : metrics_(metrics), address_(std::move(address)) {}

MetricsExposer::~MetricsExposer() {
  JoinStop();
  Stop();
}

absl::Status MetricsExposer::Start() {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address_, "num_threads", std::to_string(kExposerThreads),
        "request_timeout_ms", std::to_string(kExposerRequestTimeoutMs)});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address_, ": ", e.what()));
  }
  for (const std::shared_ptr<prometheus::Collectable>& collectable : metrics_->Collectables()) {
    exposer_->RegisterCollectable(collectable);
  }
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics: no port bound for ", address_));
  }
  bound_address_ = absl::StrCat(HostOf(address_), ":", ports.front());
  return absl::OkStatus();
}

void MetricsExposer::Stop() {
  if (exposer_ == nullptr) return;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  StopCivetwebServer([this] { exposer_.reset(); }, ports.empty() ? 0 : ports.front());
}

Metrics::DeviceSeries Metrics::AddDeviceSeries(const prometheus::Labels& labels) {
  DeviceSeries series;
  series.batch_requests = &batch_requests_family_->Add(labels, Exponential(1, 2, 14));
  series.batch_rows = &batch_rows_family_->Add(labels, Exponential(1, 4, 13));
  series.batch_bandwidth = &batch_bandwidth_family_->Add(labels, BandwidthBuckets());
  prometheus::Labels ok = labels;
  ok["outcome"] = "ok";
  prometheus::Labels error = labels;
  error["outcome"] = "error";
  series.batches_ok = &batches_family_->Add(ok);
  series.batches_failed = &batches_family_->Add(error);
  series.kernel_launches = &kernel_launches_family_->Add(labels);
  return series;
}

void Metrics::SetBackends(const std::vector<const Backend*>& backends) {
  prometheus::Registry& r = *registry_;
  auto& device_info = AddFamily(r, prometheus::BuildGauge(), "softmax_device_info",
                                "Constant 1 per device the server computes on, labelled with "
                                "what it is (memory_bytes 0: host memory, not reported).");
  if (backends.empty()) {
    device_info
        .Add({{"device", "none"},
              {"name", "none"},
              {"compute_capability", ""},
              {"multiprocessors", "0"},
              {"memory_bytes", "0"}})
        .Set(1);
    return;
  }
  auto gauge_family = [&r](const char* name, const char* help) {
    return &AddFamily(r, prometheus::BuildGauge(), name, help);
  };
  prometheus::Family<prometheus::Gauge>* peak = nullptr;
  std::vector<DeviceSeries> devices;
  for (const Backend* backend : backends) {
    const std::string device = backend->Name();
    const DeviceInfo info = backend->Device();
    device_info
        .Add({{"device", device},
              {"name", info.name.empty() ? device : info.name},
              {"compute_capability", info.compute_capability},
              {"multiprocessors", absl::StrCat(info.multiprocessors)},
              {"memory_bytes", absl::StrCat(info.memory_bytes)}})
        .Set(1);
    if (info.peak_bandwidth_bytes_per_second > 0) {
      if (peak == nullptr) {
        peak = gauge_family(
            "softmax_device_peak_bandwidth_bytes_per_second",
            "The device's nominal peak memory bandwidth, read + write bytes per second.");
      }
      peak->Add({{"device", device}}).Set(info.peak_bandwidth_bytes_per_second);
    }
    if (!info.kernels.empty()) {
      if (occupancy_.blocks == nullptr) {
        occupancy_.blocks = gauge_family(
            "softmax_kernel_resident_blocks_per_sm",
            "Occupancy probe: resident blocks per SM, by device, kernel path and dtype.");
        occupancy_.registers = gauge_family(
            "softmax_kernel_registers_per_thread",
            "Occupancy probe: registers per thread, by device, kernel path and dtype.");
        occupancy_.shared = gauge_family(
            "softmax_kernel_shared_memory_bytes",
            "Occupancy probe: static shared memory per block, by device, kernel path and dtype.");
        occupancy_.grid = gauge_family(
            "softmax_kernel_grid_blocks",
            "Occupancy probe: persistent grid size in blocks, by device, kernel path and dtype.");
        occupancy_.threads = gauge_family(
            "softmax_kernel_threads_per_block",
            "Occupancy probe: threads per block, by device, kernel path and dtype.");
        occupancy_.cluster = gauge_family(
            "softmax_kernel_cluster_size",
            "Occupancy probe: thread-block cluster size, by device, kernel path and dtype.");
      }
      for (const KernelOccupancy& k : info.kernels) {
        const prometheus::Labels labels{{"device", device}, {"kernel", k.kernel}, {"dtype", k.dtype}};
        occupancy_.blocks->Add(labels).Set(k.blocks_per_sm);
        occupancy_.registers->Add(labels).Set(k.registers_per_thread);
        occupancy_.shared->Add(labels).Set(k.shared_bytes);
        occupancy_.grid->Add(labels).Set(k.grid);
        occupancy_.threads->Add(labels).Set(k.threads_per_block);
        occupancy_.cluster->Add(labels).Set(k.cluster_size);
      }
    }
    devices.push_back(AddDeviceSeries({{"device", device}}));
  }
  // The unlabelled series made at construction go; nothing was recorded yet.
  for (const DeviceSeries& old : devices_) {
    batch_requests_family_->Remove(old.batch_requests);
    batch_rows_family_->Remove(old.batch_rows);
    batch_bandwidth_family_->Remove(old.batch_bandwidth);
    batches_family_->Remove(old.batches_ok);
    batches_family_->Remove(old.batches_failed);
    kernel_launches_family_->Remove(old.kernel_launches);
  }
  devices_ = std::move(devices);
  memory_->SetBackends(backends);
  // Without NVML (no driver, no GPU) the GPU health families are simply
  // absent; that is not an error for the server.
  std::vector<std::string> names;
  for (const Backend* backend : backends) names.push_back(backend->Name());
  gpu_health_->SetDevices(names).IgnoreError();
}

void Metrics::SetQueueCapacity(int64_t requests, int64_t bytes) {
  queue_capacity_requests_->Set(static_cast<double>(requests));
  queue_capacity_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::SetSharedMemory(const std::string& kind, int64_t regions, int64_t bytes) {
  const int k = kind == "cuda" ? 1 : 0;
  shared_memory_regions_[k]->Set(static_cast<double>(regions));
  shared_memory_bytes_[k]->Set(static_cast<double>(bytes));
}

void Metrics::SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }

void Metrics::SetGpuUnusable(absl::string_view cause) {
  AddGauge(*registry_, "softmax_gpu_unusable",
           "1 when --device=auto found a GPU it cannot use and serves on the CPU; the cause "
           "label says why (the start-up warning gives the detail).",
           {{"cause", std::string(cause)}})
      .Set(1);
}

void Metrics::SetGpuPlansIdentical(bool identical) {
  AddGauge(*registry_, "softmax_gpu_plans_identical",
           "1 when every GPU of the server has the same launch plan, so that an answer has "
           "the same bits whichever GPU computes it; 0 when they differ (the start-up "
           "warning names the difference).")
      .Set(identical ? 1 : 0);
}

prometheus::Counter& Metrics::RequestCounter(RpcMethod method, absl::StatusCode code) {
  const int m = static_cast<int>(method);
  int c = static_cast<int>(code);
  if (c < 0 || c >= kCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  std::atomic<prometheus::Counter*>& slot = request_counters_[m][c];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // First request with this code: Family::Add is thread-safe and returns
    // the same child to racing callers, so the cache stays consistent.
    counter = &requests_total_->Add({{"method", kMethodNames[m]}, {"code", kCodeNames[c]}});
    slot.store(counter, std::memory_order_release);
  }
  return *counter;
}

void Metrics::RecordRequest(RpcMethod method, absl::StatusCode code, double seconds,
                            int64_t bytes) {
  RequestCounter(method, code).Increment();
  request_duration_[static_cast<int>(method)]->Observe(seconds);
  if (code == absl::StatusCode::kOk && bytes > 0 && seconds > 0) {
    request_bandwidth_->Observe(static_cast<double>(bytes) / seconds);
  }
}

void Metrics::RecordRequestTiming(const RequestTiming& timing) {
  queue_duration_->Observe(static_cast<double>(timing.queue_ns) * 1e-9);
  if (timing.batch_requests > 0) {
    compute_duration_->Observe(static_cast<double>(timing.compute_ns) * 1e-9);
  }
}

void Metrics::OnBatchCompleted(const BatchStats& stats) {
  const size_t index = stats.backend >= 0 && static_cast<size_t>(stats.backend) < devices_.size()
                           ? static_cast<size_t>(stats.backend)
                           : 0;
  const DeviceSeries& device = devices_[index];
  (stats.ok ? device.batches_ok : device.batches_failed)->Increment();
  device.batch_requests->Observe(stats.requests);
  device.batch_rows->Observe(static_cast<double>(stats.rows));
  if (stats.launches > 0) device.kernel_launches->Increment(stats.launches);
  if (stats.ok && stats.kernel_ns > 0 && stats.kernel_bytes > 0) {
    device.batch_bandwidth->Observe(static_cast<double>(stats.kernel_bytes) * 1e9 /
                                    static_cast<double>(stats.kernel_ns));
  }
}

void Metrics::OnRequestDropped(absl::StatusCode code) {
  (code == absl::StatusCode::kCancelled ? dropped_cancelled_ : dropped_deadline_)->Increment();
}

void Metrics::OnRequestRejected() { rejected_total_->Increment(); }

void Metrics::OnQueueDepth(int64_t requests, int64_t bytes) {
  queued_requests_->Set(static_cast<double>(requests));
  queued_bytes_->Set(static_cast<double>(bytes));
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<prometheus::MetricFamily> memory = memory_->Collect();
  for (auto& family : memory) families.push_back(std::move(family));
  std::vector<prometheus::MetricFamily> gpu_health = gpu_health_->Collect();
  for (auto& family : gpu_health) families.push_back(std::move(family));
  return families;
}

}  // namespace softmax::server
