// C entry points over softmax_cuda.h, built into libsoftmax_kernels_c.so for
// callers outside C++ (the Python benchmark loads it with ctypes and passes
// device pointers from torch tensors).
//
// Thread-safety: every function may be called from any thread; the launch
// plan of each device is built once, on first use, under a mutex.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/softmax_cuda.h"

extern "C" {

// One segment; mirrors softmax::gpu::SoftmaxSegment with C types.
struct SoftmaxCSegment {
  uint64_t input;   // device pointer
  uint64_t output;  // device pointer
  int64_t outer;
  int64_t n;
  int64_t inner;
  float temperature;
  int32_t log;
};

// One top-K segment; mirrors softmax::gpu::TopKSegment with C types.
struct SoftmaxCTopKSegment {
  uint64_t input;    // device pointer
  uint64_t values;   // device pointer, outer * k * inner elements of the dtype
  uint64_t indices;  // device pointer, outer * k * inner int64
  int64_t outer;
  int64_t n;
  int64_t inner;
  int64_t k;
  float temperature;
  int32_t log;
};

}  // extern "C"

namespace {

// Returns the plan of the current device, building it on first use; null on error.
const softmax::gpu::LaunchPlan* CurrentPlan(cudaError_t* error) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<softmax::gpu::LaunchPlan>> plans;
  int device = 0;
  *error = cudaGetDevice(&device);
  if (*error != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(device);
  if (it != plans.end()) return it->second.get();
  auto plan = std::make_unique<softmax::gpu::LaunchPlan>();
  *error = softmax::gpu::LaunchPlan::Create(device, plan.get());
  if (*error != cudaSuccess) return nullptr;
  return (plans[device] = std::move(plan)).get();
}

std::vector<softmax::gpu::SoftmaxSegment> Convert(const SoftmaxCSegment* segments, int count) {
  std::vector<softmax::gpu::SoftmaxSegment> out(count > 0 ? count : 0);
  for (int i = 0; i < count; ++i) {
    out[i].input = reinterpret_cast<const void*>(segments[i].input);
    out[i].output = reinterpret_cast<void*>(segments[i].output);
    out[i].outer = segments[i].outer;
    out[i].n = segments[i].n;
    out[i].inner = segments[i].inner;
    out[i].temperature = segments[i].temperature;
    out[i].log = segments[i].log != 0;
  }
  return out;
}

// Writes `text` NUL-terminated into buffer (truncated to `size`) and returns
// its full length.
int CopyOut(const std::string& text, char* buffer, size_t size) {
  if (buffer != nullptr && size > 0) {
    const size_t n = text.size() < size - 1 ? text.size() : size - 1;
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return static_cast<int>(text.size());
}

// The text `describe` (softmax::gpu::LaunchKernels or LaunchSchedule) makes
// of these segments on the current device's plan, flat kernel allowed,
// written as CopyOut does, or -(cudaError_t) on error.
using Describe = std::string (*)(const softmax::gpu::LaunchPlan&, softmax::DType,
                                 const softmax::gpu::SoftmaxSegment*, int, bool);
int DescribeLaunch(int dtype, const SoftmaxCSegment* segments, int count, char* buffer,
                   size_t size, Describe describe) {
  if (dtype < 1 || dtype > 3) return -static_cast<int>(cudaErrorInvalidValue);
  cudaError_t error;
  const softmax::gpu::LaunchPlan* plan = CurrentPlan(&error);
  if (plan == nullptr) return -static_cast<int>(error);
  const auto converted = Convert(segments, count);
  return CopyOut(
      describe(*plan, static_cast<softmax::DType>(dtype), converted.data(), count, true),
      buffer, size);
}

}  // namespace

extern "C" {

// Writes the current device's launch plan (NUL-terminated, truncated to
// `size`) and returns its full length, or -(cudaError_t) on error.
int softmax_plan_string(char* buffer, size_t size) {
  cudaError_t error;
  const softmax::gpu::LaunchPlan* plan = CurrentPlan(&error);
  if (plan == nullptr) return -static_cast<int>(error);
  const std::string text = plan->ToString();
  return CopyOut(text, buffer, size);
}

// Scratch bytes for these segments (dtype: 1 float32, 2 float16, 3 bfloat16),
// or 0 on error (see softmax_plan_string for the error).
size_t softmax_scratch_bytes(int dtype, const SoftmaxCSegment* segments, int count) {
  cudaError_t error;
  const softmax::gpu::LaunchPlan* plan = CurrentPlan(&error);
  if (plan == nullptr) return 0;
  const auto converted = Convert(segments, count);
  return softmax::gpu::SoftmaxScratchBytes(*plan, static_cast<softmax::DType>(dtype),
                                           converted.data(), count);
}

// Path index (softmax::gpu::SoftmaxPath) that a segment takes, or -1.
int softmax_path(int dtype, const SoftmaxCSegment* segment) {
  cudaError_t error;
  const softmax::gpu::LaunchPlan* plan = CurrentPlan(&error);
  if (plan == nullptr || segment == nullptr) return -1;
  const auto converted = Convert(segment, 1);
  return static_cast<int>(
      softmax::gpu::ChoosePath(*plan, static_cast<softmax::DType>(dtype), converted[0]));
}

// Writes the kernels a launch of these segments runs (see
// softmax::gpu::LaunchKernels; NUL-terminated, truncated to `size`) and
// returns the full length, or -(cudaError_t) on error.
int softmax_launch_kernels(int dtype, const SoftmaxCSegment* segments, int count, char* buffer,
                           size_t size) {
  return DescribeLaunch(dtype, segments, count, buffer, size, softmax::gpu::LaunchKernels);
}

// Writes the launches of these segments, one line each (see
// softmax::gpu::LaunchSchedule; NUL-terminated, truncated to `size`) and
// returns the full length, or -(cudaError_t) on error.
int softmax_launch_schedule(int dtype, const SoftmaxCSegment* segments, int count, char* buffer,
                            size_t size) {
  return DescribeLaunch(dtype, segments, count, buffer, size, softmax::gpu::LaunchSchedule);
}

// Enqueues the segments on `stream` (a cudaStream_t; null = legacy default
// stream). Returns a cudaError_t value (0 on success).
int softmax_launch(int dtype, const SoftmaxCSegment* segments, int count, void* scratch,
                   size_t scratch_bytes, void* stream) {
  if (dtype < 1 || dtype > 3) return static_cast<int>(cudaErrorInvalidValue);
  cudaError_t error;
  const softmax::gpu::LaunchPlan* plan = CurrentPlan(&error);
  if (plan == nullptr) return static_cast<int>(error);
  const auto converted = Convert(segments, count);
  return static_cast<int>(softmax::gpu::LaunchSoftmax(
      *plan, static_cast<softmax::DType>(dtype), converted.data(), count, scratch, scratch_bytes,
      static_cast<cudaStream_t>(stream)));
}

namespace {
std::vector<softmax::gpu::TopKSegment> ConvertTopK(const SoftmaxCTopKSegment* segments, int count) {
  std::vector<softmax::gpu::TopKSegment> out(count > 0 ? count : 0);
  for (int i = 0; i < count; ++i) {
    const SoftmaxCTopKSegment& c = segments[i];
    softmax::gpu::TopKSegment& s = out[i];
    s.input = reinterpret_cast<const void*>(static_cast<uintptr_t>(c.input));
    s.values = reinterpret_cast<void*>(static_cast<uintptr_t>(c.values));
    s.indices = reinterpret_cast<int64_t*>(static_cast<uintptr_t>(c.indices));
    s.outer = c.outer;
    s.n = c.n;
    s.inner = c.inner;
    s.k = c.k;
    s.temperature = c.temperature;
    s.log = c.log != 0;
  }
  return out;
}
}  // namespace

// SoftmaxTopKScratchBytes (dtype: 1 float32, 2 float16, 3 bfloat16).
size_t softmax_top_k_scratch_bytes(int dtype, const SoftmaxCTopKSegment* segments, int count) {
  if (dtype < 1 || dtype > 3 || segments == nullptr) return 0;
  const auto converted = ConvertTopK(segments, count);
  return softmax::gpu::SoftmaxTopKScratchBytes(static_cast<softmax::DType>(dtype), converted.data(),
                                               count);
}

// LaunchSoftmaxTopK; returns the cudaError_t value.
int softmax_top_k_launch(int dtype, const SoftmaxCTopKSegment* segments, int count, void* scratch,
                         size_t scratch_bytes, void* stream) {
  if (dtype < 1 || dtype > 3 || (count > 0 && segments == nullptr)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const auto converted = ConvertTopK(segments, count);
  return static_cast<int>(softmax::gpu::LaunchSoftmaxTopK(
      static_cast<softmax::DType>(dtype), converted.data(), count, scratch, scratch_bytes,
      static_cast<cudaStream_t>(stream)));
}

}  // extern "C"
