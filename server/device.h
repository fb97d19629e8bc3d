// Device selection: parses --device, probes for GPUs and creates the backends
// the scheduler drives. This is the one place a new backend plugs in.
//
// Thread-safety: call from main() before serving.
#ifndef SOFTMAX_SERVER_DEVICE_H_
#define SOFTMAX_SERVER_DEVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/cpu/cpu_backend.h"
#include "server/cuda/cuda_backend.h"
#include "server/scheduling/backend.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {

struct DeviceSpec {
  enum class Kind {
    kAuto,  // GPU 0 when one is usable, else the CPU
    kCpu,   // the CPU backend
    kCuda,  // the GPUs in `indices` (empty: every visible GPU); an error when absent
    kNone,  // no compute: echo inputs (transport ceiling)
  };
  Kind kind = Kind::kAuto;
  std::vector<int> indices;  // for kCuda; empty = all
};

// Parses "auto", "cpu", "none", "cuda" (= cuda:0), "cuda:N", "cuda:N,M,..."
// (distinct indices) or "cuda:all".
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// What the CUDA runtime says about the machine's GPUs.
struct CudaDevices {
  int count = 0;  // usable CUDA devices
  // True when the runtime failed for a reason other than "no device": the
  // driver is too old for the runtime, or its library is missing.
  bool driver_error = false;
  std::string detail;  // why `count` is 0
};

// Asks the CUDA runtime; {0, false, "built without CUDA"} in a build without it.
CudaDevices QueryCudaDevices();

// Number of usable CUDA devices; 0 when built without CUDA or when the
// driver reports none. `detail` (optional) receives the reason for 0.
int CudaDeviceCount(std::string* detail = nullptr);

// NVIDIA GPU device nodes (/dev/nvidia0, /dev/nvidia1, ...): GPUs the driver
// exposes to this process (a container sees only those given to it), whether
// or not CUDA can use them. 0 where there is no NVIDIA driver.
int NvidiaDeviceNodes();

// Why --device=auto serves on the CPU although it found a GPU. Each value's
// `CauseName` is the `cause` label of softmax_gpu_unusable.
enum class GpuUnusableCause {
  kNone,           // auto took a GPU, found none, or was not asked for
  kDriver,         // GPUs are present but the CUDA runtime refuses the driver
                   // (too old for this build's CUDA, or libcuda missing)
  kNoCudaBackend,  // GPUs are present but this build has no CUDA backend
  kBackendStart,   // the CUDA backend failed to start on GPU 0 (no kernels for
                   // its architecture, out of memory, ...)
};
absl::string_view CauseName(GpuUnusableCause cause);  // "driver", "no_cuda_backend", ...

struct BackendChoice {
  std::vector<std::unique_ptr<Backend>> backends;  // empty for kNone
  std::string device;                              // "cpu", "cuda:0", "cuda:0,1", "none"
  std::string description;  // for the start-up log, one line per backend
  std::vector<int> cuda_devices;  // the GPUs of the backends, if any
  // Set when --device=auto found a GPU it cannot use; `unusable_detail` then
  // names the cause in words, for the start-up warning.
  GpuUnusableCause unusable = GpuUnusableCause::kNone;
  std::string unusable_detail;
  // Empty where every GPU backend has the launch plan of the first (the same
  // kernel and geometry for every row, so the same bits whichever GPU
  // answers); else the first difference, in words (LaunchPlanDifference).
  std::string plans_difference;
};

// "" when every backend's DeviceInfo::launch_plan equals the first's, else
// which backend differs from the first and its first differing plan line.
std::string LaunchPlanDifference(const std::vector<std::unique_ptr<Backend>>& backends);

// How shared-memory regions reach `cuda_devices` (CudaMemoryMapper); null
// when there is none (no GPU, or a build without CUDA).
std::unique_ptr<DeviceMemoryMapper> CreateDeviceMemoryMapper(const std::vector<int>& cuda_devices);

// Everything a backend may need at construction.
struct BackendOptions {
  CpuBackendOptions cpu;
  // For the GPU backends; `device` is taken from the DeviceSpec.
  CudaBackendOptions cuda;
  // Called once if a GPU hits a fatal (sticky) error.
  CudaBackend::FaultHandler on_fault;
};

struct ServerOptions;

// The backends' options from the server's: a GPU's staging memory bounded by
// --max_batch_bytes, the testing fault injection, and `on_fault` for a
// sticky GPU error. The CPU backend takes every core the process may run
// on, and a GPU backend as much device memory as it needs (their defaults).
BackendOptions BackendOptionsFor(const ServerOptions& options,
                                 CudaBackend::FaultHandler on_fault);

// What CreateBackends learns about the machine, and how it starts a GPU
// backend: the real thing by default (SystemGpus), fakes in tests.
struct GpuEnvironment {
  std::function<CudaDevices()> query_cuda;
  std::function<int()> device_nodes;
  bool have_cuda_backend = false;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(int device,
                                                         const BackendOptions& options)>
      create_cuda_backend;
};
const GpuEnvironment& SystemGpus();

// Resolves `spec` to backends, one per GPU. FAILED_PRECONDITION naming the
// cause for --device=cuda... when the build has no CUDA backend, the driver
// is refused or a GPU is absent (softmax-server then exits 1); a GPU backend
// that fails to start fails the call with its own status. kAuto falls back to
// the CPU, saying why in `description`, and sets `unusable` when it found a
// GPU it cannot use (a GPU device node, or a CUDA device, is present).
absl::StatusOr<BackendChoice> CreateBackends(const DeviceSpec& spec,
                                             const BackendOptions& options,
                                             const GpuEnvironment& gpus = SystemGpus());

// Readiness: computes a softmax and a log-softmax of a small float32 tensor
// on `backend` (its slot 0, entered on a thread of its own, before the
// scheduler runs it) and checks both against the float64 reference. OK when
// the device answers right; INTERNAL naming the backend and what failed
// otherwise. softmax-server reports SERVING only after every backend passed.
// REQUIRES: no other thread uses `backend` yet.
absl::Status WarmUp(Backend& backend);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_DEVICE_H_
