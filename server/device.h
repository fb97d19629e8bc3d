// Device selection: parses --device, probes for GPUs and creates the backends
// the scheduler drives. This is the one place a new backend plugs in.
//
// Thread-safety: call from main() before serving.
#ifndef SOFTMAX_SERVER_DEVICE_H_
#define SOFTMAX_SERVER_DEVICE_H_

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

// Number of usable CUDA devices; 0 when built without CUDA or when the
// driver reports none. `detail` (optional) receives the reason for 0.
int CudaDeviceCount(std::string* detail = nullptr);

struct BackendChoice {
  std::vector<std::unique_ptr<Backend>> backends;  // empty for kNone
  std::string device;                              // "cpu", "cuda:0", "cuda:0,1", "none"
  std::string description;  // for the start-up log, one line per backend
  std::vector<int> cuda_devices;  // the GPUs of the backends, if any
};

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

// Resolves `spec` to backends, one per GPU. FAILED_PRECONDITION for
// --device=cuda... when the build has no CUDA backend or a GPU is absent
// (softmax-server then exits 1); kAuto falls back to the CPU, saying why in
// `description`.
absl::StatusOr<BackendChoice> CreateBackends(const DeviceSpec& spec,
                                             const BackendOptions& options);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_DEVICE_H_
