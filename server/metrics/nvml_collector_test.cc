#include "server/metrics/nvml_collector.h"

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

// A fake NVML of three devices, 0..2; device 1 has no power sensor. Handles
// are the device's index + 1 cast to a pointer.
struct FakeNvml {
  static inline int init_calls = 0;
  static inline int shutdown_calls = 0;
  static inline std::vector<std::string> uuid_lookups;

  static NvmlApi::Device Handle(unsigned int index) {
    return reinterpret_cast<NvmlApi::Device>(static_cast<uintptr_t>(index + 1));
  }
  static unsigned int Index(NvmlApi::Device device) {
    return static_cast<unsigned int>(reinterpret_cast<uintptr_t>(device) - 1);
  }

  static NvmlApi Api() {
    NvmlApi api;
    api.init = [] { ++init_calls; return 0; };
    api.shutdown = [] { ++shutdown_calls; return 0; };
    api.handle_by_index = [](unsigned int index, NvmlApi::Device* out) {
      if (index > 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
      *out = Handle(index);
      return 0;
    };
    api.handle_by_uuid = [](const char* uuid, NvmlApi::Device* out) {
      uuid_lookups.push_back(uuid);
      if (std::string(uuid) != "GPU-2222") return 6;  // NVML_ERROR_NOT_FOUND
      *out = Handle(2);
      return 0;
    };
    api.utilization = [](NvmlApi::Device d, NvmlApi::Utilization* u) {
      u->gpu = 10 * (Index(d) + 1);
      u->memory = 5;
      return 0;
    };
    api.memory = [](NvmlApi::Device d, NvmlApi::Memory* m) {
      m->total = 1000;
      m->used = 100 * (Index(d) + 1);
      m->free = m->total - m->used;
      return 0;
    };
    api.power_milliwatts = [](NvmlApi::Device d, unsigned int* mw) {
      if (Index(d) == 1) return 3;  // NVML_ERROR_NOT_SUPPORTED
      *mw = 250500;
      return 0;
    };
    api.power_limit_milliwatts = [](NvmlApi::Device, unsigned int* mw) {
      *mw = 700000;
      return 0;
    };
    api.temperature = [](NvmlApi::Device d, int sensor, unsigned int* c) {
      if (sensor != 0) return 2;
      *c = 40 + Index(d);
      return 0;
    };
    api.clock_mhz = [](NvmlApi::Device, int clock, unsigned int* mhz) {
      if (clock != 1) return 2;
      *mhz = 1980;
      return 0;
    };
    api.throttle_reasons = [](NvmlApi::Device, unsigned long long* reasons) {  // NOLINT
      *reasons = 0x4 | 0x40;  // sw_power_cap, hw_thermal_slowdown
      return 0;
    };
    return api;
  }
};

// family name -> {label text -> value}, label text "device" or "device/reason".
std::map<std::string, std::map<std::string, double>> Values(
    const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, std::map<std::string, double>> out;
  for (const auto& family : families) {
    EXPECT_EQ(family.type, prometheus::MetricType::Gauge) << family.name;
    for (const auto& metric : family.metric) {
      std::string key;
      for (const auto& label : metric.label) key += (key.empty() ? "" : "/") + label.value;
      out[family.name][key] = metric.gauge.value;
    }
  }
  return out;
}

TEST(NvmlCollectorTest, WithoutTheLibraryExportsNothingAndDoesNotFail) {
  NvmlCollector collector("libnvidia-ml-not-here.so.1");
  const absl::Status status = collector.SetDevices({"cuda:0", "cuda:1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(collector.Collect().empty());
  // Asking again retries the load and still fails softly.
  EXPECT_FALSE(collector.SetDevices({"cuda:0"}).ok());
  EXPECT_TRUE(collector.Collect().empty());
}

TEST(NvmlCollectorTest, TheRealLibraryWhereverItIs) {
  // On a machine without the NVIDIA driver (CI) this is the case above with
  // the real library name; on a GPU machine cuda:0 is exported.
  NvmlCollector collector;
  const absl::Status status = collector.SetDevices({"cuda:0"});
  if (!status.ok()) {
    EXPECT_TRUE(collector.Collect().empty()) << status;
  } else {
    EXPECT_FALSE(collector.Collect().empty());
  }
}

TEST(NvmlCollectorTest, CpuAndNoneDevicesLoadNothing) {
  NvmlCollector collector("libnvidia-ml-not-here.so.1");
  EXPECT_TRUE(collector.SetDevices({"cpu"}).ok());
  EXPECT_TRUE(collector.SetDevices({}).ok());
  EXPECT_TRUE(collector.Collect().empty());
}

TEST(NvmlCollectorTest, ExportsEveryReadingPerDeviceInBaseUnits) {
  unsetenv("CUDA_VISIBLE_DEVICES");
  FakeNvml::init_calls = FakeNvml::shutdown_calls = 0;
  {
    NvmlCollector collector(FakeNvml::Api());
    ASSERT_TRUE(collector.SetDevices({"cuda:0", "cuda:1", "cpu"}).ok());
    const auto values = Values(collector.Collect());
    using Series = std::map<std::string, double>;
    const std::map<std::string, Series> expected = {
        {"softmax_gpu_utilization_ratio", {{"cuda:0", 0.1}, {"cuda:1", 0.2}}},
        {"softmax_gpu_memory_utilization_ratio", {{"cuda:0", 0.05}, {"cuda:1", 0.05}}},
        {"softmax_gpu_memory_used_bytes", {{"cuda:0", 100}, {"cuda:1", 200}}},
        {"softmax_gpu_memory_total_bytes", {{"cuda:0", 1000}, {"cuda:1", 1000}}},
        // Device 1 has no power sensor: left out, not reported as 0.
        {"softmax_gpu_power_watts", {{"cuda:0", 250.5}}},
        {"softmax_gpu_power_limit_watts", {{"cuda:0", 700}, {"cuda:1", 700}}},
        {"softmax_gpu_temperature_celsius", {{"cuda:0", 40}, {"cuda:1", 41}}},
        {"softmax_gpu_sm_clock_hertz", {{"cuda:0", 1.98e9}, {"cuda:1", 1.98e9}}},
    };
    for (const auto& [name, series] : expected) EXPECT_EQ(values.at(name), series) << name;
    const Series& throttle = values.at("softmax_gpu_clock_throttle_reasons");
    EXPECT_EQ(throttle.size(), 2u * 9u);
    EXPECT_EQ(throttle.at("cuda:0/sw_power_cap"), 1);
    EXPECT_EQ(throttle.at("cuda:1/hw_thermal_slowdown"), 1);
    EXPECT_EQ(throttle.at("cuda:0/gpu_idle"), 0);
    EXPECT_EQ(throttle.at("cuda:1/hw_slowdown"), 0);
    EXPECT_EQ(values.size(), 9u);
    EXPECT_EQ(FakeNvml::init_calls, 1);
  }
  EXPECT_EQ(FakeNvml::shutdown_calls, 1);
}

TEST(NvmlCollectorTest, CudaVisibleDevicesMapsOrdinalsToNvmlDevices) {
  FakeNvml::uuid_lookups.clear();
  setenv("CUDA_VISIBLE_DEVICES", "2, GPU-2222,GPU-missing", 1);
  NvmlCollector collector(FakeNvml::Api());
  const absl::Status status = collector.SetDevices({"cuda:0", "cuda:1", "cuda:2"});
  unsetenv("CUDA_VISIBLE_DEVICES");
  // cuda:2 is a UUID NVML does not know: reported, and left out.
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find("cuda:2"), std::string::npos) << status;
  EXPECT_EQ(FakeNvml::uuid_lookups, (std::vector<std::string>{"GPU-2222", "GPU-missing"}));
  // cuda:0 is NVML index 2 and cuda:1 is GPU-2222, also index 2: 42 degrees.
  const auto values = Values(collector.Collect());
  EXPECT_EQ(values.at("softmax_gpu_temperature_celsius"),
            (std::map<std::string, double>{{"cuda:0", 42}, {"cuda:1", 42}}));
}

TEST(NvmlCollectorTest, AnIndexNvmlDoesNotHaveIsLeftOut) {
  unsetenv("CUDA_VISIBLE_DEVICES");
  NvmlCollector collector(FakeNvml::Api());
  EXPECT_EQ(collector.SetDevices({"cuda:0", "cuda:7"}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Values(collector.Collect()).at("softmax_gpu_memory_used_bytes"),
            (std::map<std::string, double>{{"cuda:0", 100}}));
}

}  // namespace
}  // namespace softmax::server
