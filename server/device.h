// Device selection: parses --device, probes for GPUs and creates the Backend
// the batcher drives. This is the one place a new backend plugs in.
//
// Thread-safety: call from main() before serving.
#ifndef SOFTMAX_SERVER_DEVICE_H_
#define SOFTMAX_SERVER_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/backend.h"
#include "server/cpu_backend.h"
#include "server/device_worker.h"

namespace softmax::server {

struct DeviceSpec {
  enum class Kind {
    kAuto,  // a GPU when one is usable, else the CPU
    kCpu,   // the CPU backend
    kCuda,  // GPU `index`; an error when there is none
    kNone,  // no compute: echo inputs (transport ceiling)
  };
  Kind kind = Kind::kAuto;
  int index = 0;  // for kCuda
};

// Parses "auto", "cpu", "none", "cuda" (= cuda:0) or "cuda:N".
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// Number of usable CUDA devices; 0 when built without CUDA or when the
// driver reports none. `detail` (optional) receives the reason for 0.
int CudaDeviceCount(std::string* detail = nullptr);

struct BackendChoice {
  std::unique_ptr<Backend> backend;  // null for kNone
  std::string device;                // "cpu", "cuda:0", "none"
  std::string description;           // one line for the start-up log
};

// Everything a backend may need at construction.
struct BackendOptions {
  CpuBackendOptions cpu;
  // For the GPU backend; `device` is taken from the DeviceSpec.
  DeviceWorkerOptions cuda;
  // Called once if the GPU hits a fatal (sticky) error.
  DeviceWorker::FaultHandler on_fault;
};

// Resolves `spec` to a backend. FAILED_PRECONDITION for --device=cuda when
// the build has no CUDA backend or the GPU is absent (softmax-server then
// exits 1); kAuto falls back to the CPU, saying why in `description`.
absl::StatusOr<BackendChoice> CreateBackend(const DeviceSpec& spec,
                                            const BackendOptions& options);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_DEVICE_H_
