// GPU health metrics read through NVML when Prometheus scrapes: utilization,
// memory used and total, power draw and limit, temperature, SM clock and
// clock throttle reasons, one series per device the server computes on,
// labelled device="cuda:N" like every other per-device metric.
//
// NVML is loaded at run time with dlopen("libnvidia-ml.so.1"), never linked:
// the server starts and serves where the driver's library is missing (a CPU
// machine, a container without the NVIDIA runtime), and then this collector
// exports nothing. A reading a device does not support (power on some
// boards) is left out of that scrape rather than reported as 0.
//
// Which NVML device is cuda:N: entry N of CUDA_VISIBLE_DEVICES when set (an
// index, or a GPU-/MIG- UUID), else NVML index N. NVML numbers devices by PCI
// bus id; CUDA does too on a machine of one GPU model (CUDA_DEVICE_ORDER's
// default orders the fastest first and breaks ties by bus id); set
// CUDA_DEVICE_ORDER=PCI_BUS_ID where models are mixed.
//
// Thread-safety: every method may be called from any thread; scrapes are
// serialised by an internal mutex.
#ifndef SOFTMAX_SERVER_METRICS_NVML_COLLECTOR_H_
#define SOFTMAX_SERVER_METRICS_NVML_COLLECTOR_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace softmax::server {

// The NVML entry points the collector calls, with NVML's C signatures
// (nvml.h: nvmlReturn_t is an int, 0 = NVML_SUCCESS; nvmlDevice_t an opaque
// pointer). Filled from the library by dlsym, or by a test with fakes.
struct NvmlApi {
  using Device = struct NvmlDeviceOpaque*;
  struct Utilization {  // nvmlUtilization_t
    unsigned int gpu;     // percent of time a kernel ran, last sample period
    unsigned int memory;  // percent of time memory was read or written
  };
  struct Memory {  // nvmlMemory_t
    unsigned long long total;  // NOLINT(runtime/int): NVML's type
    unsigned long long free;   // NOLINT(runtime/int)
    unsigned long long used;   // NOLINT(runtime/int)
  };

  int (*init)() = nullptr;      // nvmlInit_v2
  int (*shutdown)() = nullptr;  // nvmlShutdown
  int (*handle_by_index)(unsigned int, Device*) = nullptr;  // nvmlDeviceGetHandleByIndex_v2
  int (*handle_by_uuid)(const char*, Device*) = nullptr;    // nvmlDeviceGetHandleByUUID
  int (*utilization)(Device, Utilization*) = nullptr;       // nvmlDeviceGetUtilizationRates
  int (*memory)(Device, Memory*) = nullptr;                 // nvmlDeviceGetMemoryInfo
  int (*power_milliwatts)(Device, unsigned int*) = nullptr;  // nvmlDeviceGetPowerUsage
  // nvmlDeviceGetEnforcedPowerLimit, milliwatts.
  int (*power_limit_milliwatts)(Device, unsigned int*) = nullptr;
  // nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU = 0, celsius).
  int (*temperature)(Device, int, unsigned int*) = nullptr;
  // nvmlDeviceGetClockInfo(device, NVML_CLOCK_SM = 1, MHz).
  int (*clock_mhz)(Device, int, unsigned int*) = nullptr;
  // nvmlDeviceGetCurrentClocksThrottleReasons: a bit mask.
  int (*throttle_reasons)(Device, unsigned long long*) = nullptr;  // NOLINT(runtime/int)
};

class NvmlCollector final : public prometheus::Collectable {
 public:
  static constexpr const char* kLibrary = "libnvidia-ml.so.1";

  // Loads nothing until SetDevices names a GPU; `library` is what dlopen is
  // given then.
  explicit NvmlCollector(std::string library = kLibrary);
  // Uses `api` instead of a library (tests). REQUIRES: every entry non-null.
  explicit NvmlCollector(const NvmlApi& api);
  // Shuts NVML down and unloads it if it was loaded.
  ~NvmlCollector() override;

  NvmlCollector(const NvmlCollector&) = delete;
  NvmlCollector& operator=(const NvmlCollector&) = delete;

  // The server's device labels; those of the form "cuda:N" are reported,
  // others ("cpu", "none") ignored. On the first call with a GPU, loads and
  // initialises NVML. OK when every GPU was found in NVML (or none was
  // named); otherwise the reason (library missing: UNAVAILABLE; a symbol or a
  // device missing: NOT_FOUND; NVML failing: INTERNAL), and the GPUs that
  // could not be resolved are left out. Never fatal: serving goes on.
  absl::Status SetDevices(const std::vector<std::string>& devices);

  // The GPU families of this scrape; empty without NVML or GPUs.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Gpu {
    std::string label;  // "cuda:N"
    NvmlApi::Device handle;
  };

  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::string library_;
  mutable absl::Mutex mutex_;
  void* handle_ ABSL_GUARDED_BY(mutex_) = nullptr;  // dlopen's, when loaded from a library
  NvmlApi api_ ABSL_GUARDED_BY(mutex_);
  bool have_api_ ABSL_GUARDED_BY(mutex_) = false;     // api_ filled
  bool initialised_ ABSL_GUARDED_BY(mutex_) = false;  // init() succeeded
  std::vector<Gpu> gpus_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_METRICS_NVML_COLLECTOR_H_
