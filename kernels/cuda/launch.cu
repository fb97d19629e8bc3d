// LaunchPlan::Create and LaunchSoftmax, which executes the schedule that
// plan.cc's PlanSchedule returns (every decision is made there). No kernel
// lives here: each family's translation unit (kernels/cuda/<family>.cu)
// defines the executor and the probe of its kernels (executor.cuh), which
// this file calls for every SoftmaxKernel value.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/plan.h"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {

cudaError_t ProbeKernel(const void* kernel, const std::string& name, const char* paths,
                        DType dtype, int multiprocessors, KernelProbe* probe, int threads,
                        size_t dynamic_shared) {
  cudaFuncAttributes attributes;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  int blocks = 0;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared));
  probe->kernel = name + "<" + DTypeName(dtype) + ">";
  probe->paths = paths;
  probe->dtype = dtype;
  probe->threads_per_block = threads;
  probe->registers_per_thread = attributes.numRegs;
  probe->local_bytes_per_thread = static_cast<int>(attributes.localSizeBytes);
  probe->static_shared_bytes = static_cast<int>(attributes.sharedSizeBytes);
  probe->blocks_per_sm = blocks;
  probe->cluster_size = 1;
  probe->max_active_clusters = 0;
  probe->grid = std::max(1, blocks) * multiprocessors;
  return cudaSuccess;
}

cudaError_t AppendProbe(const void* kernel, const char* name, const char* paths,
                        const ProbeTarget& target) {
  KernelProbe probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(kernel, name, paths, target.dtype, target.multiprocessors, &probe));
  target.probes->push_back(probe);
  return cudaSuccess;
}

int ActiveClusters(const void* kernel, int size, int threads, size_t dynamic_shared,
                   int multiprocessors) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(size * multiprocessors, 1, 1);
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = dynamic_shared;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int active = 0;
  if (cudaOccupancyMaxActiveClusters(&active, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    active = 0;
  }
  return active;
}

cudaError_t ProbeClusters(const void* kernel, const std::string& name, const char* paths,
                          DType dtype, int multiprocessors, size_t dynamic_shared,
                          std::vector<KernelProbe>* probes) {
  KernelProbe base;
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(kernel, name, paths, dtype, multiprocessors, &base,
                                           kStagedThreads, dynamic_shared));
  for (int size = 1; size <= kMaxClusterSize; size *= 2) {
    if (size > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                         1) != cudaSuccess) {
      cudaGetLastError();
      break;
    }
    const int active =
        ActiveClusters(kernel, size, kStagedThreads, dynamic_shared, multiprocessors);
    if (active <= 0) break;
    KernelProbe c = base;
    c.cluster_size = size;
    c.max_active_clusters = active;
    c.grid = active * size;
    probes->push_back(c);
  }
  return cudaSuccess;
}

cudaError_t ProbeTableKernel(const void* kernel, const char* name, int threads, size_t shared,
                             DType dtype, int multiprocessors, std::vector<KernelProbe>* probes) {
  int device = 0;
  int optin = 0;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  if (shared + attributes.sharedSizeBytes > static_cast<size_t>(optin)) return cudaSuccess;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  KernelProbe probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(kernel, name, name, dtype, multiprocessors, &probe, threads));
  probes->push_back(probe);
  return cudaSuccess;
}

namespace {

// Calls f(std::integral_constant<SoftmaxKernel, K>()) for K == kernel: one
// comparison per SoftmaxKernel value, so that every value's executor and
// probe must exist (they link from the families' translation units).
template <typename F, int... I>
cudaError_t WithKernel(SoftmaxKernel kernel, const F& f, std::integer_sequence<int, I...>) {
  cudaError_t error = cudaErrorInvalidValue;
  (void)((static_cast<int>(kernel) == I &&
          ((error = f(std::integral_constant<SoftmaxKernel, static_cast<SoftmaxKernel>(I)>())),
           true)) ||
         ...);
  return error;
}

template <typename F>
cudaError_t WithKernel(SoftmaxKernel kernel, const F& f) {
  return WithKernel(kernel, f, std::make_integer_sequence<int, kSoftmaxKernels>());
}

// Probes the kernels for element type T in ProbeOrder() (plan.cc): each
// family's occupancy entries in that order, the on-chip kernel's clusters
// bounding the plan's.
template <typename T>
cudaError_t ProbeTyped(DType dtype, int multiprocessors, bool clusters,
                       std::vector<KernelProbe>* probes, int* max_cluster) {
  const ProbeTarget target = {dtype, multiprocessors, clusters, probes, max_cluster};
  for (const ProbeCall& call : ProbeOrder()) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(WithKernel(call.kernel, [&](auto k) {
      return ProbeFamily<decltype(k)::value, T>(target, call.part);
    }));
  }
  return cudaSuccess;
}

// Copies a step's table into the kernel argument (inline) or into
// `table_scratch`, as the schedule says (LaunchStep::TableInScratch).
cudaError_t FillTable(const LaunchStep& step, void* table_scratch, cudaStream_t stream,
                      TableArgs* args) {
  std::memset(args, 0, sizeof(*args));
  const std::vector<RowSegment>& rows = step.table;
  args->count = static_cast<int>(rows.size());
  if (!step.TableInScratch()) {
    std::copy(rows.begin(), rows.end(), args->inline_segments);
    return cudaSuccess;
  }
  args->table = static_cast<const RowSegment*>(table_scratch);
  return cudaMemcpyAsync(table_scratch, rows.data(), rows.size() * sizeof(RowSegment),
                         cudaMemcpyHostToDevice, stream);
}

// Executes a schedule (PlanSchedule in plan.cc, where every decision is
// made): resolves scratch offsets into pointers, copies tables that do not
// travel inline, zeroes counters and launches each step with its kernel's
// executor (ExecuteStep), in order.
template <typename T>
cudaError_t Execute(const Schedule& schedule, char* scratch, cudaStream_t stream) {
  void* table_scratch = schedule.table_bytes > 0 ? scratch : nullptr;
  for (const LaunchStep& step : schedule.steps) {
    if (step.zero_bytes > 0) {
      SOFTMAX_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(scratch + step.counters_offset, 0, step.zero_bytes, stream));
    }
    StepArguments args;
    args.flat = step.flat;
    args.split = step.split;
    args.strided = step.strided;
    args.split.partials = args.strided.partials =
        reinterpret_cast<float2*>(scratch + step.partials_offset);
    args.split.totals = args.strided.finals =
        reinterpret_cast<float2*>(scratch + step.finals_offset);
    args.split.counters = args.strided.counters =
        reinterpret_cast<unsigned*>(scratch + step.counters_offset);
    if (!step.table.empty()) {
      SOFTMAX_CUDA_RETURN_IF_ERROR(FillTable(step, table_scratch, stream, &args.table));
      args.table.launch_cluster = step.table_word;
      args.table.prefetch_units = step.prefetch_units;
    }
    SOFTMAX_CUDA_RETURN_IF_ERROR(WithKernel(step.kernel, [&](auto k) {
      return ExecuteStep<decltype(k)::value, T>(step, args, stream);
    }));
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t ProbeKernels(DType dtype, int multiprocessors, bool clusters,
                         std::vector<KernelProbe>* probes, int* max_cluster) {
  switch (dtype) {
    case DType::kFloat32:
      return ProbeTyped<float>(dtype, multiprocessors, clusters, probes, max_cluster);
    case DType::kFloat16:
      return ProbeTyped<__half>(dtype, multiprocessors, clusters, probes, max_cluster);
    case DType::kBFloat16:
      return ProbeTyped<__nv_bfloat16>(dtype, multiprocessors, clusters, probes, max_cluster);
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail

// Probes the device with this file's kernels (plan.cc only reads plans).
cudaError_t LaunchPlan::Create(int device, LaunchPlan* plan) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return error;
  cudaDeviceProp prop;
  error = cudaGetDeviceProperties(&prop, device);
  if (error != cudaSuccess) return error;
  LaunchPlan p;
  p.device_ = device;
  p.device_name_ = prop.name;
  p.multiprocessors_ = prop.multiProcessorCount;
  p.l2_bytes_ = prop.l2CacheSize;
  p.clusters_supported_ = prop.major >= 9;
  p.max_cluster_size_ = detail::kMaxClusterSize;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    error = detail::ProbeKernels(dtype, p.multiprocessors_, p.clusters_supported_, &p.probes_,
                                 &p.max_cluster_size_);
    if (error != cudaSuccess) return error;
  }
  p.max_cluster_size_ = std::min(p.max_cluster_size_, detail::kMaxUsedClusterSize);
  if (!p.clusters_supported_) p.max_cluster_size_ = 1;
  p.IndexProbes();
  *plan = std::move(p);
  return cudaSuccess;
}

cudaError_t LaunchSoftmax(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          bool allow_flat, int* kernel_launches) {
  if (count < 0 || (count > 0 && segments == nullptr) || plan.multiprocessors() == 0) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (s.outer < 0 || s.inner < 0 || s.n < 0 || s.n >= (1LL << 31)) return cudaErrorInvalidValue;
    if (detail::Empty(s)) continue;
    if (s.input == nullptr || s.output == nullptr || !(s.temperature > 0.0f) ||
        !std::isfinite(s.temperature)) {
      return cudaErrorInvalidValue;
    }
  }
  detail::Schedule schedule;
  const cudaError_t planned =
      detail::PlanSchedule(plan, dtype, segments, count, allow_flat, &schedule);
  if (planned != cudaSuccess) return planned;
  if (schedule.scratch_bytes > scratch_bytes) return cudaErrorInvalidValue;
  char* bytes = static_cast<char*>(scratch);
  cudaError_t error = cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kFloat32: error = detail::Execute<float>(schedule, bytes, stream); break;
    case DType::kFloat16: error = detail::Execute<__half>(schedule, bytes, stream); break;
    case DType::kBFloat16: error = detail::Execute<__nv_bfloat16>(schedule, bytes, stream); break;
  }
  if (error == cudaSuccess && kernel_launches != nullptr) {
    *kernel_launches = static_cast<int>(schedule.steps.size());
  }
  return error;
}

}  // namespace gpu
}  // namespace softmax
