#include "server/metrics/nvml_collector.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace softmax::server {
namespace {

constexpr int kNvmlSuccess = 0;
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM

// nvmlClocksThrottleReason* bits (nvml.h), by the `reason` label they get.
constexpr std::pair<const char*, unsigned long long> kThrottleReasons[] = {  // NOLINT
    {"gpu_idle", 0x1},
    {"applications_clocks_setting", 0x2},
    {"sw_power_cap", 0x4},
    {"hw_slowdown", 0x8},
    {"sync_boost", 0x10},
    {"sw_thermal_slowdown", 0x20},
    {"hw_thermal_slowdown", 0x40},
    {"hw_power_brake_slowdown", 0x80},
    {"display_clock_setting", 0x100},
};

template <typename Function>
bool Resolve(void* library, const char* symbol, Function*& out) {
  out = reinterpret_cast<Function*>(dlsym(library, symbol));
  return out != nullptr;
}

prometheus::ClientMetric Sample(const std::string& device, double value) {
  prometheus::ClientMetric metric;
  metric.label.push_back({"device", device});
  metric.gauge.value = value;
  return metric;
}

}  // namespace

NvmlCollector::NvmlCollector(std::string library) : library_(std::move(library)) {}

NvmlCollector::NvmlCollector(const NvmlApi& api) : api_(api), have_api_(true) {}

NvmlCollector::~NvmlCollector() {
  absl::MutexLock lock(&mutex_);
  if (initialised_) api_.shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

absl::Status NvmlCollector::Load() {
  if (initialised_) return absl::OkStatus();
  if (!have_api_) {
    handle_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* error = dlerror();
      return absl::UnavailableError(
          absl::StrCat("NVML not loaded (", error ? error : library_, "): no GPU metrics"));
    }
    NvmlApi api;
    const bool resolved =
        Resolve(handle_, "nvmlInit_v2", api.init) &&
        Resolve(handle_, "nvmlShutdown", api.shutdown) &&
        Resolve(handle_, "nvmlDeviceGetHandleByIndex_v2", api.handle_by_index) &&
        Resolve(handle_, "nvmlDeviceGetHandleByUUID", api.handle_by_uuid) &&
        Resolve(handle_, "nvmlDeviceGetUtilizationRates", api.utilization) &&
        Resolve(handle_, "nvmlDeviceGetMemoryInfo", api.memory) &&
        Resolve(handle_, "nvmlDeviceGetPowerUsage", api.power_milliwatts) &&
        Resolve(handle_, "nvmlDeviceGetEnforcedPowerLimit", api.power_limit_milliwatts) &&
        Resolve(handle_, "nvmlDeviceGetTemperature", api.temperature) &&
        Resolve(handle_, "nvmlDeviceGetClockInfo", api.clock_mhz) &&
        Resolve(handle_, "nvmlDeviceGetCurrentClocksThrottleReasons", api.throttle_reasons);
    if (!resolved) {
      dlclose(handle_);
      handle_ = nullptr;
      return absl::NotFoundError(
          absl::StrCat(library_, " lacks an NVML entry point: no GPU metrics"));
    }
    api_ = api;
    have_api_ = true;
  }
  const int code = api_.init();
  if (code != kNvmlSuccess) {
    return absl::InternalError(absl::StrCat("nvmlInit failed with NVML error ", code));
  }
  initialised_ = true;
  return absl::OkStatus();
}

absl::Status NvmlCollector::SetDevices(const std::vector<std::string>& devices) {
  std::vector<std::pair<std::string, int>> wanted;  // label, CUDA ordinal
  for (const std::string& device : devices) {
    absl::string_view rest = device;
    int ordinal = 0;
    if (absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &ordinal) && ordinal >= 0) {
      wanted.emplace_back(device, ordinal);
    }
  }
  absl::MutexLock lock(&mutex_);
  gpus_.clear();
  if (wanted.empty()) return absl::OkStatus();
  absl::Status status = Load();
  if (!status.ok()) return status;

  std::vector<std::string> visible;
  if (const char* env = std::getenv("CUDA_VISIBLE_DEVICES"); env != nullptr) {
    visible = absl::StrSplit(env, ',', absl::SkipWhitespace());
  }
  for (const auto& [label, ordinal] : wanted) {
    NvmlApi::Device handle = nullptr;
    int code = -1;
    unsigned int index = static_cast<unsigned int>(ordinal);
    if (static_cast<size_t>(ordinal) < visible.size()) {
      const std::string entry(absl::StripAsciiWhitespace(visible[ordinal]));
      if (absl::StartsWith(entry, "GPU-") || absl::StartsWith(entry, "MIG-")) {
        code = api_.handle_by_uuid(entry.c_str(), &handle);
      } else if (absl::SimpleAtoi(entry, &index)) {
        code = api_.handle_by_index(index, &handle);
      }
    } else {
      code = api_.handle_by_index(index, &handle);
    }
    if (code != kNvmlSuccess) {
      status.Update(absl::NotFoundError(
          absl::StrCat("NVML has no device for ", label, " (NVML error ", code, ")")));
      continue;
    }
    gpus_.push_back({label, handle});
  }
  return status;
}

std::vector<prometheus::MetricFamily> NvmlCollector::Collect() const {
  absl::MutexLock lock(&mutex_);
  if (gpus_.empty()) return {};
  using prometheus::MetricType;
  prometheus::MetricFamily utilization{
      "softmax_gpu_utilization_ratio",
      "Fraction of the last NVML sample period (1/6 s to 1 s) in which a kernel ran on the GPU.",
      MetricType::Gauge, {}};
  prometheus::MetricFamily memory_utilization{
      "softmax_gpu_memory_utilization_ratio",
      "Fraction of the last NVML sample period in which device memory was read or written.",
      MetricType::Gauge, {}};
  prometheus::MetricFamily memory_used{
      "softmax_gpu_memory_used_bytes",
      "Device memory in use by every process on the GPU (NVML).", MetricType::Gauge, {}};
  prometheus::MetricFamily memory_total{
      "softmax_gpu_memory_total_bytes", "Device memory on the GPU (NVML).", MetricType::Gauge,
      {}};
  prometheus::MetricFamily power{"softmax_gpu_power_watts", "Power draw of the GPU board.",
                                 MetricType::Gauge, {}};
  prometheus::MetricFamily power_limit{
      "softmax_gpu_power_limit_watts", "Power limit the driver enforces on the GPU board.",
      MetricType::Gauge, {}};
  prometheus::MetricFamily temperature{"softmax_gpu_temperature_celsius",
                                       "GPU core temperature.", MetricType::Gauge, {}};
  prometheus::MetricFamily clock{"softmax_gpu_sm_clock_hertz", "Current SM clock.",
                                 MetricType::Gauge, {}};
  prometheus::MetricFamily throttle{
      "softmax_gpu_clock_throttle_reasons",
      "1 for each reason that holds the GPU's clocks down now (NVML clock throttle reasons; "
      "gpu_idle is benign).",
      MetricType::Gauge, {}};

  for (const Gpu& gpu : gpus_) {
    NvmlApi::Utilization rates{};
    if (api_.utilization(gpu.handle, &rates) == kNvmlSuccess) {
      utilization.metric.push_back(Sample(gpu.label, rates.gpu / 100.0));
      memory_utilization.metric.push_back(Sample(gpu.label, rates.memory / 100.0));
    }
    NvmlApi::Memory bytes{};
    if (api_.memory(gpu.handle, &bytes) == kNvmlSuccess) {
      memory_used.metric.push_back(Sample(gpu.label, static_cast<double>(bytes.used)));
      memory_total.metric.push_back(Sample(gpu.label, static_cast<double>(bytes.total)));
    }
    unsigned int value = 0;
    if (api_.power_milliwatts(gpu.handle, &value) == kNvmlSuccess) {
      power.metric.push_back(Sample(gpu.label, value / 1000.0));
    }
    if (api_.power_limit_milliwatts(gpu.handle, &value) == kNvmlSuccess) {
      power_limit.metric.push_back(Sample(gpu.label, value / 1000.0));
    }
    if (api_.temperature(gpu.handle, kTemperatureGpu, &value) == kNvmlSuccess) {
      temperature.metric.push_back(Sample(gpu.label, value));
    }
    if (api_.clock_mhz(gpu.handle, kClockSm, &value) == kNvmlSuccess) {
      clock.metric.push_back(Sample(gpu.label, value * 1e6));
    }
    unsigned long long reasons = 0;  // NOLINT(runtime/int): NVML's type
    if (api_.throttle_reasons(gpu.handle, &reasons) == kNvmlSuccess) {
      for (const auto& [name, bit] : kThrottleReasons) {
        prometheus::ClientMetric metric = Sample(gpu.label, (reasons & bit) != 0 ? 1 : 0);
        metric.label.push_back({"reason", name});
        throttle.metric.push_back(std::move(metric));
      }
    }
  }
  std::vector<prometheus::MetricFamily> families;
  for (prometheus::MetricFamily* family :
       {&utilization, &memory_utilization, &memory_used, &memory_total, &power, &power_limit,
        &temperature, &clock, &throttle}) {
    if (!family->metric.empty()) families.push_back(std::move(*family));
  }
  return families;
}

}  // namespace softmax::server
