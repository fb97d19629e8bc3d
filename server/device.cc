#include "server/device.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#if SOFTMAX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace softmax::server {
namespace {

// The GPU backend's factory: a DeviceWorker when the build has CUDA.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           const BackendOptions& options) {
#if SOFTMAX_HAVE_CUDA
  DeviceWorkerOptions worker_options = options.cuda;
  worker_options.device = device;
  absl::StatusOr<std::unique_ptr<DeviceWorker>> worker =
      DeviceWorker::Create(worker_options, options.on_fault);
  if (!worker.ok()) return worker.status();
  std::fprintf(stderr, "softmax-server: %s", (*worker)->ProbeReport().c_str());
  return std::unique_ptr<Backend>(std::move(*worker));
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "--device=cuda:", device, ": this build has no CUDA backend; use --device=cpu"));
#endif
}

bool HaveCudaBackend() { return SOFTMAX_HAVE_CUDA != 0; }

std::unique_ptr<Backend> MakeCpu(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options.cpu);
}

}  // namespace

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  if (text == "auto") return spec;
  if (text == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  if (text == "none") {
    spec.kind = DeviceSpec::Kind::kNone;
    return spec;
  }
  if (text == "cuda") {
    spec.kind = DeviceSpec::Kind::kCuda;
    return spec;
  }
  if (absl::StartsWith(text, "cuda:")) {
    int index = -1;
    if (absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
      spec.kind = DeviceSpec::Kind::kCuda;
      spec.index = index;
      return spec;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: expected auto, cpu, cuda, cuda:N or none, got \"", text, "\""));
}

int CudaDeviceCount(std::string* detail) {
#if SOFTMAX_HAVE_CUDA
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    if (detail != nullptr) *detail = cudaGetErrorString(error);
    return 0;
  }
  if (count == 0 && detail != nullptr) *detail = "no CUDA devices";
  return count;
#else
  if (detail != nullptr) *detail = "built without CUDA";
  return 0;
#endif
}

absl::StatusOr<BackendChoice> CreateBackend(const DeviceSpec& spec,
                                            const BackendOptions& options) {
  BackendChoice choice;
  switch (spec.kind) {
    case DeviceSpec::Kind::kNone:
      choice.device = "none";
      choice.description = "none (echo: inputs returned unchanged, no compute)";
      return choice;
    case DeviceSpec::Kind::kCpu:
      choice.backend = MakeCpu(options);
      choice.device = "cpu";
      choice.description = absl::StrCat(choice.backend->Describe(), " (requested)");
      return choice;
    case DeviceSpec::Kind::kCuda: {
      std::string detail;
      const int count = CudaDeviceCount(&detail);
      if (count == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--device=cuda:", spec.index, ": no usable GPU (", detail, "); use --device=cpu"));
      }
      if (spec.index >= count) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--device=cuda:", spec.index, ": only ", count, " GPU(s) visible"));
      }
      absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(spec.index, options);
      if (!backend.ok()) return backend.status();
      choice.backend = std::move(*backend);
      choice.device = absl::StrCat("cuda:", spec.index);
      choice.description = choice.backend->Describe();
      return choice;
    }
    case DeviceSpec::Kind::kAuto: {
      std::string detail;
      const int count = CudaDeviceCount(&detail);
      if (count > 0 && HaveCudaBackend()) {
        absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0, options);
        if (!backend.ok()) return backend.status();
        choice.backend = std::move(*backend);
        choice.device = "cuda:0";
        choice.description = absl::StrCat(choice.backend->Describe(), " (auto)");
        return choice;
      }
      if (count > 0) detail = absl::StrCat(count, " GPU(s) present but no CUDA backend built in");
      choice.backend = MakeCpu(options);
      choice.device = "cpu";
      choice.description = absl::StrCat(choice.backend->Describe(), " (auto: ", detail, ")");
      return choice;
    }
  }
  return absl::InvalidArgumentError("--device: unknown kind");
}

}  // namespace softmax::server
