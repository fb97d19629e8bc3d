#include "server/device.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#if SOFTMAX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "server/cuda/cuda_memory_mapper.h"
#endif

namespace softmax::server {
namespace {

// The GPU backend's factory: a CudaBackend when the build has CUDA.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           const BackendOptions& options) {
#if SOFTMAX_HAVE_CUDA
  CudaBackendOptions cuda_options = options.cuda;
  cuda_options.device = device;
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      CudaBackend::Create(cuda_options, options.on_fault);
  if (!backend.ok()) return backend.status();
  std::fprintf(stderr, "softmax-server: %s", (*backend)->ProbeReport().c_str());
  return std::unique_ptr<Backend>(std::move(*backend));
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
    spec.indices = {0};
    return spec;
  }
  if (text == "cuda:all") {
    spec.kind = DeviceSpec::Kind::kCuda;
    return spec;
  }
  if (absl::StartsWith(text, "cuda:")) {
    spec.kind = DeviceSpec::Kind::kCuda;
    bool valid = true;
    for (absl::string_view part : absl::StrSplit(text.substr(5), ',')) {
      int index = -1;
      if (!absl::SimpleAtoi(part, &index) || index < 0 ||
          std::find(spec.indices.begin(), spec.indices.end(), index) != spec.indices.end()) {
        valid = false;
        break;
      }
      spec.indices.push_back(index);
    }
    if (valid && !spec.indices.empty()) return spec;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: expected auto, cpu, cuda, cuda:N, cuda:N,M,... (distinct), cuda:all or none, "
      "got \"", text, "\""));
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

std::unique_ptr<DeviceMemoryMapper> CreateDeviceMemoryMapper(
    const std::vector<int>& cuda_devices) {
#if SOFTMAX_HAVE_CUDA
  if (!cuda_devices.empty()) return std::make_unique<CudaMemoryMapper>(cuda_devices);
#endif
  return nullptr;
}

absl::StatusOr<BackendChoice> CreateBackends(const DeviceSpec& spec,
                                             const BackendOptions& options) {
  BackendChoice choice;
  switch (spec.kind) {
    case DeviceSpec::Kind::kNone:
      choice.device = "none";
      choice.description = "none (echo: inputs returned unchanged, no compute)";
      return choice;
    case DeviceSpec::Kind::kCpu:
      choice.backends.push_back(MakeCpu(options));
      choice.device = "cpu";
      choice.description = absl::StrCat(choice.backends[0]->Describe(), " (requested)");
      return choice;
    case DeviceSpec::Kind::kCuda: {
      std::string detail;
      const int count = CudaDeviceCount(&detail);
      if (count == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("--device=cuda: no usable GPU (", detail, "); use --device=cpu"));
      }
      std::vector<int> indices = spec.indices;
      if (indices.empty()) {
        for (int i = 0; i < count; ++i) indices.push_back(i);
      }
      std::vector<std::string> names;
      std::vector<std::string> lines;
      for (int index : indices) {
        if (index >= count) {
          return absl::FailedPreconditionError(absl::StrCat(
              "--device=cuda:", index, ": only ", count, " GPU(s) visible"));
        }
        absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(index, options);
        if (!backend.ok()) return backend.status();
        lines.push_back((*backend)->Describe());
        names.push_back(absl::StrCat(index));
        choice.backends.push_back(std::move(*backend));
        choice.cuda_devices.push_back(index);
      }
      choice.device = absl::StrCat("cuda:", absl::StrJoin(names, ","));
      choice.description = absl::StrJoin(lines, "\n  ");
      return choice;
    }
    case DeviceSpec::Kind::kAuto: {
      std::string detail;
      const int count = CudaDeviceCount(&detail);
      if (count > 0 && HaveCudaBackend()) {
        absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0, options);
        if (!backend.ok()) return backend.status();
        choice.description = absl::StrCat((*backend)->Describe(), " (auto)");
        choice.backends.push_back(std::move(*backend));
        choice.cuda_devices.push_back(0);
        choice.device = "cuda:0";
        return choice;
      }
      if (count > 0) detail = absl::StrCat(count, " GPU(s) present but no CUDA backend built in");
      choice.backends.push_back(MakeCpu(options));
      choice.device = "cpu";
      choice.description = absl::StrCat(choice.backends[0]->Describe(), " (auto: ", detail, ")");
      return choice;
    }
  }
  return absl::InvalidArgumentError("--device: unknown kind");
}

}  // namespace softmax::server
