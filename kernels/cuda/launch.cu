// The one translation unit that instantiates every kernel: the occupancy
// probe of each (ProbeKernels) and LaunchSoftmax, which executes the schedule
// that plan.cc's PlanSchedule returns (every decision is made there).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/flat.cuh"
#include "kernels/cuda/on_chip.cuh"
#include "kernels/cuda/plan.h"
#include "kernels/cuda/row_staged.cuh"
#include "kernels/cuda/split.cuh"
#include "kernels/cuda/staged.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

#define SOFTMAX_CUDA_RETURN_IF_ERROR(expr)    \
  do {                                        \
    const cudaError_t error_ = (expr);        \
    if (error_ != cudaSuccess) return error_; \
  } while (0)

// Flat kernel block sizes that FlatShapeOf returns.
constexpr int kFlatThreads[] = {64, 128, 256, 512};

cudaError_t ProbeKernel(const void* kernel, const std::string& name, const char* paths,
                        DType dtype, int multiprocessors, KernelProbe* probe,
                        int threads = kThreads, size_t dynamic_shared = 0) {
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

// Clusters of `size` blocks of `kernel` that fit at once (0 when none or on error).
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

// Probes a kernel of kStagedThreads-thread blocks with `dynamic_shared` bytes
// each (its largest share) and appends one entry per cluster size, 1 up to
// kMaxClusterSize, at which at least one cluster fits.
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

// Probes a table kernel that takes up to `shared` bytes of dynamic shared
// memory and appends its entry, only where a block may have that much (the
// row_staged kernel's 128 KiB rows: not on GPUs of 99 KiB per block, where
// the planner sends those rows on).
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

template <typename T>
cudaError_t ProbeTyped(DType dtype, int multiprocessors, bool clusters,
                       std::vector<KernelProbe>* probes, int* max_cluster) {
  const void* on_chip = reinterpret_cast<const void*>(&OnChipKernel<T>);
  KernelProbe probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(on_chip, "on_chip", "warp,block", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  for (const int threads : kFlatThreads) {
    KernelProbe flat;
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        ProbeKernel(reinterpret_cast<const void*>(&FlatKernel<T, true, false>),
                    FlatProbeName(threads), "flat", dtype, multiprocessors, &flat, threads));
    probes->push_back(flat);
  }
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeTableKernel(reinterpret_cast<const void*>(&FlatTableKernel<T>),
                                                "flat_table", kTableThreads, kTableMaxSharedBytes,
                                                dtype, multiprocessors, probes));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeTableKernel(reinterpret_cast<const void*>(&RowStagedKernel<T>),
                                                "row_staged", kRowStagedThreads,
                                                kRowStagedMaxShareBytes, dtype, multiprocessors,
                                                probes));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeTableKernel(reinterpret_cast<const void*>(&RowStagedKernel<T>),
                                                "row_staged.long", kRowStagedThreads,
                                                kRowStagedLongMaxShareBytes, dtype,
                                                multiprocessors, probes));
  int best = 1;
  if (clusters) {
    for (int size = 2; size <= kMaxClusterSize; size *= 2) {
      if (size > 8 && cudaFuncSetAttribute(on_chip, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                           1) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      const int active = ActiveClusters(on_chip, size, kThreads, 0, multiprocessors);
      if (active <= 0) break;
      KernelProbe c = probe;
      c.paths = "warp,block,cluster";
      c.cluster_size = size;
      c.max_active_clusters = active;
      c.grid = active * size;
      probes->push_back(c);
      best = size;
    }
    // split_staged: probed at its largest share.
    const void* split_staged = reinterpret_cast<const void*>(&SplitStagedKernel<T>);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        split_staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kSplitStagedPartBytes)));
    KernelProbe split_probe;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(split_staged, "split_staged", "split", dtype,
                                             multiprocessors, &split_probe, kStagedThreads,
                                             kSplitStagedPartBytes));
    if (split_probe.blocks_per_sm > 0) probes->push_back(split_probe);
    // Staged: probed at the largest share; one entry per cluster size that
    // fits at least once.
    const void* staged = reinterpret_cast<const void*>(&StagedKernel<T, kStagedMaxStages>);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxBytes)));
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeClusters(staged, "staged", "staged", dtype, multiprocessors,
                                               kStagedMaxBytes, probes));
    // Its short-share instantiation runs the same geometries, shares of at most kStagedTargetBytes.
    const void* staged_short = reinterpret_cast<const void*>(&StagedKernel<T, kStagedShortStages>);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        staged_short, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedTargetBytes)));
    if (cudaFuncSetAttribute(staged_short, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  if (clusters) {
    // strided_staged: probed at its largest share and column pairs; one
    // entry per cluster size that fits at least once.
    const void* strided_staged =
        reinterpret_cast<const void*>(&StridedStagedKernel<T, kStridedTileVectors>);
    const size_t largest = static_cast<size_t>(kStridedStagedMaxBytes) + kStridedStagedSlotBytes;
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        strided_staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(largest)));
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeClusters(strided_staged, "strided_staged", "strided", dtype,
                                               multiprocessors, largest, probes));
    // Its wide tiles (float32) run clusters of up to kStridedWideMaxCluster,
    // shares of at most kStagedTargetBytes.
    if constexpr (std::is_same<T, float>::value) {
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          reinterpret_cast<const void*>(&StridedStagedKernel<T, kStridedWideTileVectors>),
          cudaFuncAttributeMaxDynamicSharedMemorySize,
          static_cast<int>(kStagedTargetBytes + StridedStagedSlotBytes(kStridedWideTileVectors))));
    }
  }
  *max_cluster = std::min(*max_cluster, best);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(reinterpret_cast<const void*>(&SplitFusedKernel<T, true>),
                                           "split_fused", "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(reinterpret_cast<const void*>(&SplitStatsKernel<T, true>),
                                           "split_stats", "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&SplitNormalizeUnitsKernel<T>), "split_normalize_units",
                  "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&StridedStatsKernel<T, true>), "strided_stats",
                  "strided", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&StridedNormalizeKernel<T, true>),
                  "strided_normalize", "strided", dtype, multiprocessors, &probe));
  probes->push_back(probe);
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

// Runs a step with its kernel's Executor (each family's header holds its
// own): one comparison per SoftmaxKernel value.
template <typename T, int... I>
cudaError_t Dispatch(const LaunchStep& step, const StepArguments& args, cudaStream_t stream,
                     std::integer_sequence<int, I...>) {
  cudaError_t error = cudaErrorInvalidValue;
  (void)((static_cast<int>(step.kernel) == I &&
          ((error = Executor<static_cast<SoftmaxKernel>(I)>::template Run<T>(step, args, stream)),
           true)) ||
         ...);
  return error;
}

// Executes a schedule (PlanSchedule in plan.cc, where every decision is
// made): resolves scratch offsets into pointers, copies tables that do not
// travel inline, zeroes counters and launches each step with its kernel's
// Executor, in order.
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
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        Dispatch<T>(step, args, stream, std::make_integer_sequence<int, kSoftmaxKernels>()));
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
