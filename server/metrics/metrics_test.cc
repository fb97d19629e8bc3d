// Metrics: recorded values land in Collect() (what /metrics serves) with the
// right names, labels, counts and bucket placement; allocator figures come
// from the backend at collection time.
#include "server/metrics/metrics.h"

#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

const MetricFamily* FindFamily(const std::vector<MetricFamily>& families,
                               const std::string& name) {
  for (const MetricFamily& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

// The sample of `name` whose labels are exactly `labels`; fails the test
// (and returns null) when absent.
const ClientMetric* Find(const std::vector<MetricFamily>& families, const std::string& name,
                         const std::map<std::string, std::string>& labels = {}) {
  const MetricFamily* family = FindFamily(families, name);
  if (family == nullptr) {
    ADD_FAILURE() << "no family " << name;
    return nullptr;
  }
  for (const ClientMetric& metric : family->metric) {
    std::map<std::string, std::string> have;
    for (const auto& label : metric.label) have[label.name] = label.value;
    if (have == labels) return &metric;
  }
  ADD_FAILURE() << "no sample of " << name << " with the labels asked for";
  return nullptr;
}

double CounterValue(const std::vector<MetricFamily>& families, const std::string& name,
                    const std::map<std::string, std::string>& labels = {}) {
  const ClientMetric* metric = Find(families, name, labels);
  return metric == nullptr ? -1 : metric->counter.value;
}

double GaugeValue(const std::vector<MetricFamily>& families, const std::string& name,
                  const std::map<std::string, std::string>& labels = {}) {
  const ClientMetric* metric = Find(families, name, labels);
  return metric == nullptr ? -1 : metric->gauge.value;
}

// Cumulative count of the bucket whose upper bound is `le` (within 1 ppm).
int64_t BucketCount(const ClientMetric& metric, double le) {
  for (const auto& bucket : metric.histogram.bucket) {
    if (std::abs(bucket.upper_bound - le) <= 1e-6 * le) {
      return static_cast<int64_t>(bucket.cumulative_count);
    }
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return -1;
}

std::unique_ptr<Metrics> NewMetrics() {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return std::move(*metrics);
}

// What a GPU-like fake backend describes: two kernel rows of the occupancy
// probe.
DeviceInfo FakeGpu() {
  DeviceInfo info;
  info.name = "Fake H200";
  info.compute_capability = "9.0";
  info.multiprocessors = 132;
  info.memory_bytes = int64_t{150} << 30;
  info.peak_bandwidth_bytes_per_second = 4.8e12;
  // kernel, dtype, threads per block, registers per thread, shared bytes,
  // blocks per SM, cluster size, grid.
  info.kernels = {
      KernelOccupancy{"row_per_warp", "float32", 256, 32, 0, 8, 1, 1056},
      KernelOccupancy{"cluster_row/cluster4", "bfloat16", 1024, 40, 49152, 1, 4, 132},
  };
  return info;
}

testing::FakeBackendOptions Named(const std::string& name) {
  testing::FakeBackendOptions options;
  options.name = name;
  return options;
}

TEST(MetricsTest, RequestsCountByMethodAndCode) {
  auto metrics = NewMetrics();
  for (int i = 0; i < 3; ++i) {
    metrics->RecordRequest(RpcMethod::kSoftmax, absl::StatusCode::kOk, 0.001, 8192);
  }
  metrics->RecordRequest(RpcMethod::kSoftmax, absl::StatusCode::kInvalidArgument, 0.0001, 0);
  for (int i = 0; i < 2; ++i) {
    metrics->RecordRequest(RpcMethod::kSoftmaxStream, absl::StatusCode::kInvalidArgument,
                           0.0001, 0);
  }
  metrics->RecordRequest(RpcMethod::kSoftmaxStream, absl::StatusCode::kUnavailable, 0.0001, 0);
  const auto families = metrics->Collect();
  auto requests = [&families](const std::string& method, const std::string& code) {
    return CounterValue(families, "softmax_requests_total", {{"method", method}, {"code", code}});
  };
  EXPECT_EQ(requests("Softmax", "OK"), 3);
  EXPECT_EQ(requests("Softmax", "INVALID_ARGUMENT"), 1);
  EXPECT_EQ(requests("SoftmaxStream", "INVALID_ARGUMENT"), 2);
  EXPECT_EQ(requests("SoftmaxStream", "UNAVAILABLE"), 1);
  // OK of every method exists from the start; other codes only once seen.
  EXPECT_EQ(requests("SoftmaxStream", "OK"), 0);
  for (const char* method : {"ModelInfer", "ModelStreamInfer", "http_infer"}) {
    EXPECT_EQ(requests(method, "OK"), 0) << method;
  }
  EXPECT_EQ(FindFamily(families, "softmax_requests_total")->metric.size(), 8u);

  const ClientMetric* unary =
      Find(families, "softmax_request_duration_seconds", {{"method", "Softmax"}});
  ASSERT_NE(unary, nullptr);
  EXPECT_EQ(unary->histogram.sample_count, 4u);
  EXPECT_NEAR(unary->histogram.sample_sum, 0.0031, 1e-12);
  EXPECT_EQ(BucketCount(*unary, 5e-5), 0);
  EXPECT_EQ(BucketCount(*unary, 1e-4), 1);  // le is inclusive
  EXPECT_EQ(BucketCount(*unary, 1e-3), 4);
  EXPECT_EQ(BucketCount(*unary, 10), 4);
  const ClientMetric* stream =
      Find(families, "softmax_request_duration_seconds", {{"method", "SoftmaxStream"}});
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(stream->histogram.sample_count, 3u);

  // Bandwidth only for OK requests that moved bytes: 8192 B / 1 ms.
  const ClientMetric* bandwidth = Find(families, "softmax_request_bandwidth_bytes_per_second");
  ASSERT_NE(bandwidth, nullptr);
  EXPECT_EQ(bandwidth->histogram.sample_count, 3u);
  EXPECT_NEAR(bandwidth->histogram.sample_sum, 3 * 8.192e6, 1);
  EXPECT_EQ(BucketCount(*bandwidth, 5e6), 0);
  EXPECT_EQ(BucketCount(*bandwidth, 1e7), 3);
}

TEST(MetricsTest, LatencyBucketsSpanTenMicrosecondsToTenSeconds) {
  auto metrics = NewMetrics();
  metrics->RecordRequest(RpcMethod::kSoftmax, absl::StatusCode::kOk, 20.0, 0);  // past the last
  const auto families = metrics->Collect();
  const ClientMetric* unary =
      Find(families, "softmax_request_duration_seconds", {{"method", "Softmax"}});
  ASSERT_NE(unary, nullptr);
  const auto& buckets = unary->histogram.bucket;
  ASSERT_GE(buckets.size(), 3u);
  EXPECT_DOUBLE_EQ(buckets.front().upper_bound, 1e-5);
  EXPECT_DOUBLE_EQ(buckets[1].upper_bound, 2.5e-5);
  EXPECT_DOUBLE_EQ(buckets[buckets.size() - 2].upper_bound, 10);
  EXPECT_TRUE(std::isinf(buckets.back().upper_bound));
  EXPECT_EQ(BucketCount(*unary, 10), 0);
  EXPECT_EQ(buckets.back().cumulative_count, 1u);
  // Bounds print as the decimals they stand for.
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, families);
  EXPECT_NE(text.str().find(
                "softmax_request_duration_seconds_bucket{method=\"Softmax\",le=\"2.5e-05\"}"),
            std::string::npos)
      << text.str();
}

TEST(MetricsTest, QueueAndComputeTimePerRequest) {
  auto metrics = NewMetrics();
  RequestTiming computed;
  computed.queue_ns = 2'000'000;  // 2 ms
  computed.compute_ns = 30'000;   // 30 us
  computed.batch_requests = 4;
  computed.batch_rows = 16;
  metrics->RecordRequestTiming(computed);
  metrics->RecordRequestTiming(computed);
  RequestTiming dropped;  // left the queue without a batch
  dropped.queue_ns = 7'000'000'000;
  metrics->RecordRequestTiming(dropped);
  const auto families = metrics->Collect();
  const ClientMetric* queue = Find(families, "softmax_queue_duration_seconds");
  const ClientMetric* compute = Find(families, "softmax_compute_duration_seconds");
  ASSERT_NE(queue, nullptr);
  ASSERT_NE(compute, nullptr);
  EXPECT_EQ(queue->histogram.sample_count, 3u);
  EXPECT_EQ(BucketCount(*queue, 1e-3), 0);
  EXPECT_EQ(BucketCount(*queue, 2.5e-3), 2);
  EXPECT_EQ(BucketCount(*queue, 5), 2);
  EXPECT_EQ(BucketCount(*queue, 10), 3);
  EXPECT_EQ(compute->histogram.sample_count, 2u);
  EXPECT_EQ(BucketCount(*compute, 2.5e-5), 0);
  EXPECT_EQ(BucketCount(*compute, 5e-5), 2);
  EXPECT_NEAR(compute->histogram.sample_sum, 60e-6, 1e-12);
}

TEST(MetricsTest, BatchesSizesLaunchesAndBandwidth) {
  auto metrics = NewMetrics();
  BatchStats ok;
  ok.requests = 3;
  ok.rows = 10;
  ok.bytes = 4096;
  ok.compute_ns = 2'000'000'000;
  ok.kernel_ns = 1'000'000'000;
  ok.kernel_bytes = 4'000'000'000;  // 4 GB/s
  ok.launches = 2;
  metrics->OnBatchCompleted(ok);
  BatchStats failed = ok;
  failed.ok = false;
  failed.requests = 1;
  failed.rows = 1;
  failed.launches = 1;
  metrics->OnBatchCompleted(failed);
  const auto families = metrics->Collect();
  EXPECT_EQ(CounterValue(families, "softmax_batches_total", {{"outcome", "ok"}}), 1);
  EXPECT_EQ(CounterValue(families, "softmax_batches_total", {{"outcome", "error"}}), 1);
  EXPECT_EQ(CounterValue(families, "softmax_kernel_launches_total"), 3);
  const ClientMetric* requests = Find(families, "softmax_batch_requests");
  const ClientMetric* rows = Find(families, "softmax_batch_rows");
  const ClientMetric* bandwidth = Find(families, "softmax_batch_bandwidth_bytes_per_second");
  ASSERT_NE(requests, nullptr);
  ASSERT_NE(rows, nullptr);
  ASSERT_NE(bandwidth, nullptr);
  EXPECT_EQ(requests->histogram.sample_count, 2u);
  EXPECT_EQ(requests->histogram.sample_sum, 4);
  EXPECT_EQ(BucketCount(*requests, 2), 1);
  EXPECT_EQ(BucketCount(*requests, 4), 2);
  EXPECT_EQ(rows->histogram.sample_sum, 11);
  EXPECT_EQ(BucketCount(*rows, 4), 1);
  EXPECT_EQ(BucketCount(*rows, 16), 2);
  // Only the OK batch has a bandwidth.
  EXPECT_EQ(bandwidth->histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(bandwidth->histogram.sample_sum, 4e9);
  EXPECT_EQ(BucketCount(*bandwidth, 2.5e9), 0);
  EXPECT_EQ(BucketCount(*bandwidth, 5e9), 1);
}

TEST(MetricsTest, QueueAdmissionAndServingGauges) {
  auto metrics = NewMetrics();
  metrics->SetQueueCapacity(8192, int64_t{4} << 30);
  metrics->OnQueueDepth(5, 5000);
  metrics->OnQueueDepth(3, 3000);
  metrics->OnRequestRejected();
  metrics->OnRequestDropped(absl::StatusCode::kCancelled);
  metrics->OnRequestDropped(absl::StatusCode::kDeadlineExceeded);
  metrics->OnRequestDropped(absl::StatusCode::kDeadlineExceeded);
  auto families = metrics->Collect();
  EXPECT_EQ(GaugeValue(families, "softmax_queued_requests"), 3);
  EXPECT_EQ(GaugeValue(families, "softmax_queued_bytes"), 3000);
  EXPECT_EQ(GaugeValue(families, "softmax_queue_capacity_requests"), 8192);
  EXPECT_EQ(GaugeValue(families, "softmax_queue_capacity_bytes"), 4294967296.0);
  EXPECT_EQ(CounterValue(families, "softmax_rejected_requests_total"), 1);
  EXPECT_EQ(CounterValue(families, "softmax_dropped_requests_total", {{"reason", "cancelled"}}), 1);
  EXPECT_EQ(CounterValue(families, "softmax_dropped_requests_total",
                         {{"reason", "deadline_exceeded"}}), 2);
  EXPECT_EQ(GaugeValue(families, "softmax_serving"), 0);  // not yet listening
  metrics->SetServing(true);
  EXPECT_EQ(GaugeValue(metrics->Collect(), "softmax_serving"), 1);
  metrics->SetServing(false);
  EXPECT_EQ(GaugeValue(metrics->Collect(), "softmax_serving"), 0);
  const ClientMetric* build = Find(families, "softmax_build_info",
                                   {{"version", SOFTMAX_TEST_VERSION},
                                    {"revision", SOFTMAX_TEST_GIT_REVISION}});
  ASSERT_NE(build, nullptr);
  EXPECT_EQ(build->gauge.value, 1);
}

TEST(MetricsTest, GpuUnusableOnlyWhenAutoFellBackWithTheCause) {
  auto metrics = NewMetrics();
  EXPECT_EQ(FindFamily(metrics->Collect(), "softmax_gpu_unusable"), nullptr);
  metrics->SetGpuUnusable("driver");
  const auto families = metrics->Collect();
  EXPECT_EQ(GaugeValue(families, "softmax_gpu_unusable", {{"cause", "driver"}}), 1);
  EXPECT_EQ(FindFamily(families, "softmax_gpu_unusable")->metric.size(), 1u);
}

TEST(MetricsTest, GpuPlansIdenticalOnlyWithAGpuBackend) {
  for (const bool identical : {true, false}) {
    auto metrics = NewMetrics();
    EXPECT_EQ(FindFamily(metrics->Collect(), "softmax_gpu_plans_identical"), nullptr);
    metrics->SetGpuPlansIdentical(identical);
    EXPECT_EQ(GaugeValue(metrics->Collect(), "softmax_gpu_plans_identical"), identical ? 1 : 0);
  }
}

TEST(MetricsTest, DeviceInfoOccupancyAndAllocatorFromTheBackend) {
  testing::FakeBackend backend(Named("cuda:0"));
  backend.set_device(FakeGpu());
  std::vector<MemoryStats> memory = {{"device", 1024, 4096, 8192, 10, 7, 3},
                                     {"pinned", 512, 256, 768, 4, 2, 2}};
  backend.set_memory(memory);
  auto metrics = NewMetrics();
  metrics->SetBackends({&backend});
  auto families = metrics->Collect();
  const ClientMetric* info = Find(families, "softmax_device_info",
                                  {{"device", "cuda:0"},
                                   {"name", "Fake H200"},
                                   {"compute_capability", "9.0"},
                                   {"multiprocessors", "132"},
                                   {"memory_bytes", "161061273600"}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->gauge.value, 1);
  EXPECT_EQ(GaugeValue(families, "softmax_device_peak_bandwidth_bytes_per_second",
                       {{"device", "cuda:0"}}), 4.8e12);

  const std::map<std::string, std::string> warp{
      {"device", "cuda:0"}, {"kernel", "row_per_warp"}, {"dtype", "float32"}};
  const std::map<std::string, std::string> cluster{
      {"device", "cuda:0"}, {"kernel", "cluster_row/cluster4"}, {"dtype", "bfloat16"}};
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_resident_blocks_per_sm", warp), 8);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_registers_per_thread", warp), 32);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_grid_blocks", warp), 1056);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_threads_per_block", cluster), 1024);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_shared_memory_bytes", cluster), 49152);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_cluster_size", cluster), 4);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_resident_blocks_per_sm", cluster), 1);

  const std::map<std::string, std::string> device_memory{{"device", "cuda:0"},
                                                         {"memory", "device"}};
  const std::map<std::string, std::string> pinned_memory{{"device", "cuda:0"},
                                                         {"memory", "pinned"}};
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_in_use_bytes", device_memory), 1024);
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_cached_bytes", device_memory), 4096);
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_peak_bytes", pinned_memory), 768);
  EXPECT_EQ(CounterValue(families, "softmax_allocator_requests_total", device_memory), 10);
  EXPECT_EQ(CounterValue(families, "softmax_allocator_cache_hits_total", device_memory), 7);
  EXPECT_EQ(
      CounterValue(families, "softmax_allocator_backing_allocations_total", pinned_memory), 2);
  EXPECT_EQ(GaugeValue(families, "softmax_pinned_staging_bytes", {{"device", "cuda:0"}}), 768);
  EXPECT_EQ(FindFamily(families, "softmax_allocator_requests_total")->type, MetricType::Counter);
  EXPECT_EQ(FindFamily(families, "softmax_allocator_in_use_bytes")->type, MetricType::Gauge);

  // Read at collection time: a change in the backend shows at the next scrape.
  memory[0].in_use_bytes = 0;
  memory[0].allocations = 11;
  memory[0].cache_hits = 8;
  backend.set_memory(memory);
  families = metrics->Collect();
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_in_use_bytes", device_memory), 0);
  EXPECT_EQ(CounterValue(families, "softmax_allocator_requests_total", device_memory), 11);
  EXPECT_EQ(CounterValue(families, "softmax_allocator_cache_hits_total", device_memory), 8);
  EXPECT_EQ(
      CounterValue(families, "softmax_allocator_backing_allocations_total", device_memory), 3);
}

TEST(MetricsTest, BackendWithoutAllocatorOrPeakExportsNeither) {
  testing::FakeBackend backend(Named("cpu"));
  DeviceInfo info;
  info.name = "Some CPU";
  info.multiprocessors = 2;
  backend.set_device(info);
  auto metrics = NewMetrics();
  metrics->SetBackends({&backend});
  const auto families = metrics->Collect();
  EXPECT_EQ(GaugeValue(families, "softmax_device_info",
                       {{"device", "cpu"}, {"name", "Some CPU"}, {"compute_capability", ""},
                        {"multiprocessors", "2"}, {"memory_bytes", "0"}}), 1);
  EXPECT_EQ(FindFamily(families, "softmax_device_peak_bandwidth_bytes_per_second"), nullptr);
  EXPECT_EQ(FindFamily(families, "softmax_allocator_in_use_bytes"), nullptr);
  EXPECT_EQ(FindFamily(families, "softmax_pinned_staging_bytes"), nullptr);
  EXPECT_EQ(FindFamily(families, "softmax_kernel_grid_blocks"), nullptr);
}

// With several backends (two GPUs here), batch metrics carry the `device`
// label of the backend that ran each batch (BatchStats::backend, in the
// order given to SetBackends), and allocator figures that of their backend.
TEST(MetricsTest, BatchAndAllocatorMetricsCarryTheDeviceOfTheirBackend) {
  testing::FakeBackend gpu0(Named("cuda:0")), gpu1(Named("cuda:1"));
  gpu0.set_device(FakeGpu());
  gpu1.set_device(FakeGpu());
  gpu0.set_memory({{"device", 100, 0, 100, 1, 0, 1}, {"pinned", 10, 0, 10, 1, 0, 1}});
  gpu1.set_memory({{"device", 200, 0, 200, 2, 0, 2}, {"pinned", 20, 5, 20, 2, 0, 2}});
  auto metrics = NewMetrics();
  metrics->SetBackends({&gpu0, &gpu1});
  BatchStats on0;
  on0.backend = 0;
  on0.requests = 2;
  on0.rows = 3;
  on0.launches = 1;
  on0.kernel_ns = 1'000'000;
  on0.kernel_bytes = 1'000'000;
  BatchStats on1 = on0;
  on1.backend = 1;
  on1.requests = 7;
  on1.rows = 9;
  on1.launches = 4;
  BatchStats failed_on1 = on1;
  failed_on1.ok = false;
  metrics->OnBatchCompleted(on0);
  metrics->OnBatchCompleted(on1);
  metrics->OnBatchCompleted(on1);
  metrics->OnBatchCompleted(failed_on1);
  const auto families = metrics->Collect();
  auto batches = [&families](const std::string& device, const std::string& outcome) {
    return CounterValue(families, "softmax_batches_total",
                        {{"device", device}, {"outcome", outcome}});
  };
  EXPECT_EQ(batches("cuda:0", "ok"), 1);
  EXPECT_EQ(batches("cuda:0", "error"), 0);
  EXPECT_EQ(batches("cuda:1", "ok"), 2);
  EXPECT_EQ(batches("cuda:1", "error"), 1);
  EXPECT_EQ(CounterValue(families, "softmax_kernel_launches_total", {{"device", "cuda:0"}}), 1);
  EXPECT_EQ(CounterValue(families, "softmax_kernel_launches_total", {{"device", "cuda:1"}}), 12);
  const ClientMetric* requests0 = Find(families, "softmax_batch_requests", {{"device", "cuda:0"}});
  const ClientMetric* requests1 = Find(families, "softmax_batch_requests", {{"device", "cuda:1"}});
  ASSERT_NE(requests0, nullptr);
  ASSERT_NE(requests1, nullptr);
  EXPECT_EQ(requests0->histogram.sample_count, 1u);
  EXPECT_EQ(requests0->histogram.sample_sum, 2);
  EXPECT_EQ(requests1->histogram.sample_count, 3u);
  EXPECT_EQ(requests1->histogram.sample_sum, 21);
  const ClientMetric* rows1 = Find(families, "softmax_batch_rows", {{"device", "cuda:1"}});
  ASSERT_NE(rows1, nullptr);
  EXPECT_EQ(rows1->histogram.sample_sum, 27);
  const ClientMetric* bandwidth0 =
      Find(families, "softmax_batch_bandwidth_bytes_per_second", {{"device", "cuda:0"}});
  const ClientMetric* bandwidth1 =
      Find(families, "softmax_batch_bandwidth_bytes_per_second", {{"device", "cuda:1"}});
  ASSERT_NE(bandwidth0, nullptr);
  ASSERT_NE(bandwidth1, nullptr);
  EXPECT_EQ(bandwidth0->histogram.sample_count, 1u);
  EXPECT_EQ(bandwidth1->histogram.sample_count, 2u);  // OK batches only
  // No unlabelled batch series is left beside the devices'.
  for (const char* name : {"softmax_batch_requests", "softmax_batch_rows",
                           "softmax_batch_bandwidth_bytes_per_second",
                           "softmax_kernel_launches_total"}) {
    const MetricFamily* family = FindFamily(families, name);
    ASSERT_NE(family, nullptr) << name;
    EXPECT_EQ(family->metric.size(), 2u) << name;
    for (const ClientMetric& metric : family->metric) {
      ASSERT_FALSE(metric.label.empty()) << name;
      EXPECT_EQ(metric.label[0].name, "device") << name;
    }
  }
  EXPECT_EQ(FindFamily(families, "softmax_batches_total")->metric.size(), 4u);
  // Allocators, per device and memory.
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_in_use_bytes",
                       {{"device", "cuda:0"}, {"memory", "device"}}), 100);
  EXPECT_EQ(GaugeValue(families, "softmax_allocator_in_use_bytes",
                       {{"device", "cuda:1"}, {"memory", "device"}}), 200);
  EXPECT_EQ(CounterValue(families, "softmax_allocator_requests_total",
                         {{"device", "cuda:1"}, {"memory", "pinned"}}), 2);
  EXPECT_EQ(FindFamily(families, "softmax_allocator_in_use_bytes")->metric.size(), 4u);
  EXPECT_EQ(GaugeValue(families, "softmax_pinned_staging_bytes", {{"device", "cuda:0"}}), 10);
  EXPECT_EQ(GaugeValue(families, "softmax_pinned_staging_bytes", {{"device", "cuda:1"}}), 25);
  // Device info and peak bandwidth, one sample per device.
  EXPECT_EQ(FindFamily(families, "softmax_device_info")->metric.size(), 2u);
  EXPECT_EQ(GaugeValue(families, "softmax_device_peak_bandwidth_bytes_per_second",
                       {{"device", "cuda:1"}}), 4.8e12);
  EXPECT_EQ(GaugeValue(families, "softmax_kernel_grid_blocks",
                       {{"device", "cuda:1"}, {"kernel", "row_per_warp"}, {"dtype", "float32"}}),
            1056);
}

// Before SetBackends (and with --device=none, which sets none) batch
// metrics have no device label; no backends: device "none".
TEST(MetricsTest, WithoutBackendsBatchMetricsAreUnlabelledAndTheDeviceIsNone) {
  auto metrics = NewMetrics();
  BatchStats stats;
  stats.requests = 1;
  stats.rows = 1;
  metrics->OnBatchCompleted(stats);
  auto families = metrics->Collect();
  EXPECT_EQ(CounterValue(families, "softmax_batches_total", {{"outcome", "ok"}}), 1);
  metrics->SetBackends({});
  families = metrics->Collect();
  EXPECT_EQ(GaugeValue(families, "softmax_device_info",
                       {{"device", "none"}, {"name", "none"}, {"compute_capability", ""},
                        {"multiprocessors", "0"}, {"memory_bytes", "0"}}), 1);
  EXPECT_EQ(FindFamily(families, "softmax_allocator_in_use_bytes"), nullptr);
}

TEST(MetricsTest, ExposerBindsAFreePort) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const std::string bound = (*metrics)->BoundAddress();
  ASSERT_EQ(bound.rfind("127.0.0.1:", 0), 0u) << bound;
  EXPECT_GT(std::stoi(bound.substr(10)), 0);
  EXPECT_EQ(NewMetrics()->BoundAddress(), "off");
}

}  // namespace
}  // namespace softmax::server
