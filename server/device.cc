#include "server/device.h"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/cpu_softmax.h"
#include "server/logging/log.h"
#include "server/server_options.h"

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
  for (absl::string_view line : absl::StrSplit((*backend)->ProbeReport(), '\n', absl::SkipEmpty())) {
    logging::LogInfo(line);
  }
  return std::unique_ptr<Backend>(std::move(*backend));
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "--device=cuda:", device, ": this build has no CUDA backend; use --device=cpu"));
#endif
}

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

BackendOptions BackendOptionsFor(const ServerOptions& options,
                                 CudaBackend::FaultHandler on_fault) {
  BackendOptions backend_options;
  backend_options.cuda.max_staging_bytes = options.max_batch_bytes;
  backend_options.cuda.inject_fault_after_batches = options.inject_fault_after_batches;
  backend_options.on_fault = std::move(on_fault);
  return backend_options;
}

CudaDevices QueryCudaDevices() {
  CudaDevices devices;
#if SOFTMAX_HAVE_CUDA
  const cudaError_t error = cudaGetDeviceCount(&devices.count);
  if (error != cudaSuccess) {
    devices.count = 0;
    devices.driver_error = error != cudaErrorNoDevice;
    devices.detail = cudaGetErrorString(error);
  } else if (devices.count == 0) {
    devices.detail = "no CUDA devices";
  }
#else
  devices.detail = "built without CUDA";
#endif
  return devices;
}

int CudaDeviceCount(std::string* detail) {
  CudaDevices devices = QueryCudaDevices();
  if (detail != nullptr) *detail = std::move(devices.detail);
  return devices.count;
}

int NvidiaDeviceNodes() {
  DIR* dev = opendir("/dev");
  if (dev == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = readdir(dev)) {
    // nvidia0, nvidia1, ...; not nvidiactl, nvidia-uvm, nvidia-modeset.
    absl::string_view name = entry->d_name;
    int index = 0;
    if (absl::ConsumePrefix(&name, "nvidia") && absl::SimpleAtoi(name, &index)) ++count;
  }
  closedir(dev);
  return count;
}

absl::string_view CauseName(GpuUnusableCause cause) {
  switch (cause) {
    case GpuUnusableCause::kNone:
      return "none";
    case GpuUnusableCause::kDriver:
      return "driver";
    case GpuUnusableCause::kNoCudaBackend:
      return "no_cuda_backend";
    case GpuUnusableCause::kBackendStart:
      return "backend_start";
  }
  return "unknown";
}

const GpuEnvironment& SystemGpus() {
  static const GpuEnvironment* const kSystem = [] {
    auto* gpus = new GpuEnvironment;
    gpus->query_cuda = QueryCudaDevices;
    gpus->device_nodes = NvidiaDeviceNodes;
    gpus->have_cuda_backend = SOFTMAX_HAVE_CUDA != 0;
    gpus->create_cuda_backend = CreateCudaBackend;
    return gpus;
  }();
  return *kSystem;
}

std::unique_ptr<DeviceMemoryMapper> CreateDeviceMemoryMapper(
    const std::vector<int>& cuda_devices) {
#if SOFTMAX_HAVE_CUDA
  if (!cuda_devices.empty()) return std::make_unique<CudaMemoryMapper>(cuda_devices);
#endif
  return nullptr;
}

std::string LaunchPlanDifference(const std::vector<std::unique_ptr<Backend>>& backends) {
  if (backends.empty()) return "";
  const DeviceInfo first = backends[0]->Device();
  for (size_t i = 1; i < backends.size(); ++i) {
    const DeviceInfo other = backends[i]->Device();
    if (other.launch_plan == first.launch_plan) continue;
    const std::vector<absl::string_view> a = absl::StrSplit(first.launch_plan, '\n');
    const std::vector<absl::string_view> b = absl::StrSplit(other.launch_plan, '\n');
    size_t line = 0;
    while (line < a.size() && line < b.size() && a[line] == b[line]) ++line;
    const auto text = [line](const std::vector<absl::string_view>& lines) {
      return line < lines.size() ? absl::StrCat("'", absl::StripAsciiWhitespace(lines[line]), "'")
                                 : std::string("no line");
    };
    return absl::StrCat(backends[i]->Name(), "'s launch plan differs from ", backends[0]->Name(),
                        "'s: ", text(b), " against ", text(a));
  }
  return "";
}

absl::StatusOr<BackendChoice> CreateBackends(const DeviceSpec& spec,
                                             const BackendOptions& options,
                                             const GpuEnvironment& gpus) {
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
      if (!gpus.have_cuda_backend) {
        return absl::FailedPreconditionError(
            "--device=cuda: this build has no CUDA backend; use --device=cpu");
      }
      const CudaDevices cuda = gpus.query_cuda();
      const int count = cuda.count;
      if (count == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("--device=cuda: no usable GPU (", cuda.detail, "); use --device=cpu"));
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
        absl::StatusOr<std::unique_ptr<Backend>> backend =
            gpus.create_cuda_backend(index, options);
        if (!backend.ok()) return backend.status();
        lines.push_back((*backend)->Describe());
        names.push_back(absl::StrCat(index));
        choice.backends.push_back(std::move(*backend));
        choice.cuda_devices.push_back(index);
      }
      choice.device = absl::StrCat("cuda:", absl::StrJoin(names, ","));
      choice.description = absl::StrJoin(lines, "\n  ");
      choice.plans_difference = LaunchPlanDifference(choice.backends);
      return choice;
    }
    case DeviceSpec::Kind::kAuto: {
      // A GPU counts as found when CUDA reports one or the driver exposes a
      // device node; only then is serving on the CPU a fallback to warn about.
      const CudaDevices cuda = gpus.query_cuda();
      std::string detail = cuda.detail;
      if (cuda.count > 0 && gpus.have_cuda_backend) {
        absl::StatusOr<std::unique_ptr<Backend>> backend = gpus.create_cuda_backend(0, options);
        if (backend.ok()) {
          choice.description = absl::StrCat((*backend)->Describe(), " (auto)");
          choice.backends.push_back(std::move(*backend));
          choice.cuda_devices.push_back(0);
          choice.device = "cuda:0";
          return choice;
        }
        choice.unusable = GpuUnusableCause::kBackendStart;
        detail = absl::StrCat("the CUDA backend failed to start on GPU 0: ",
                              backend.status().message());
      } else {
        const int present = std::max(cuda.count, gpus.device_nodes());
        if (present > 0 && !gpus.have_cuda_backend) {
          choice.unusable = GpuUnusableCause::kNoCudaBackend;
          detail = absl::StrCat(present, " GPU(s) present but this build has no CUDA backend");
        } else if (present > 0 && cuda.driver_error) {
          choice.unusable = GpuUnusableCause::kDriver;
          detail = absl::StrCat(present, " GPU device node(s) present but the CUDA runtime "
                                "refuses the driver: ", cuda.detail);
        }
      }
      if (choice.unusable != GpuUnusableCause::kNone) choice.unusable_detail = detail;
      choice.backends.push_back(MakeCpu(options));
      choice.device = "cpu";
      choice.description = absl::StrCat(choice.backends[0]->Describe(), " (auto: ", detail, ")");
      return choice;
    }
  }
  return absl::InvalidArgumentError("--device: unknown kind");
}

absl::Status WarmUp(Backend& backend) {
  // Two rows of 1,000 (not a power of two: a vector path's tail is taken)
  // with a wide spread, so that a wrong max or sum shows.
  constexpr int64_t kRows = 2;
  constexpr int64_t kLength = 1000;
  std::vector<float> input(kRows * kLength);
  for (size_t i = 0; i < input.size(); ++i) {
    input[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 8.0);
  }
  absl::Status outcome;
  std::thread slot_thread([&] {
    backend.EnterSlotThread(0);
    for (const bool log : {false, true}) {
      std::vector<float> output(input.size(), std::nanf(""));
      Batch batch;
      Segment segment;
      segment.input = input.data();
      segment.output = output.data();
      segment.bytes = static_cast<int64_t>(input.size() * sizeof(float));
      segment.dtype = DType::kFloat32;
      segment.shape = SoftmaxShape{kRows, kLength, 1};
      segment.options.log = log;
      batch.segments.push_back(segment);
      batch.rows = kRows;
      batch.bytes = segment.bytes;
      BatchResult result = backend.Execute(0, batch);
      absl::Status status = result.segment_status.empty() ? result.status
                                                          : result.segment_status.front();
      if (!status.ok()) {
        outcome = absl::InternalError(absl::StrCat("warm-up on ", backend.Name(),
                                                   " failed: ", status.message()));
        return;
      }
      std::vector<double> expected(input.size());
      ReferenceSoftmax(input.data(), DType::kFloat32, segment.shape, segment.options,
                       expected.data());
      for (size_t i = 0; i < output.size(); ++i) {
        if (!WithinReferenceTolerance(output[i], expected[i], DType::kFloat32)) {
          outcome = absl::InternalError(absl::StrCat(
              "warm-up on ", backend.Name(), ": ", log ? "log-softmax" : "softmax",
              " element ", i, " is ", output[i], ", expected ", expected[i]));
          return;
        }
      }
    }
  });
  slot_thread.join();
  return outcome;
}

}  // namespace softmax::server
