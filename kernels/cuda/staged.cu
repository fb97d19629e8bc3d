// The staged kernels' executors and probes (executor.cuh): staged,
// split_staged and strided_staged, each probed only where clusters run.
#include <type_traits>

#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/staged.cuh"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// Probed at its largest share.
template <typename T>
cudaError_t ProbeSplitStaged(const ProbeTarget& target, int) {
  if (!target.clusters) return cudaSuccess;
  const void* split_staged = reinterpret_cast<const void*>(&SplitStagedKernel<T>);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      split_staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kSplitStagedPartBytes)));
  KernelProbe split_probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(split_staged, "split_staged", "split", target.dtype,
                                           target.multiprocessors, &split_probe, kStagedThreads,
                                           kSplitStagedPartBytes));
  if (split_probe.blocks_per_sm > 0) target.probes->push_back(split_probe);
  return cudaSuccess;
}

// Probed at the largest share; one entry per cluster size that fits at
// least once.
template <typename T>
cudaError_t ProbeStaged(const ProbeTarget& target, int) {
  if (!target.clusters) return cudaSuccess;
  const void* staged = reinterpret_cast<const void*>(&StagedKernel<T, kStagedMaxStages>);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxBytes)));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeClusters(staged, "staged", "staged", target.dtype,
                                             target.multiprocessors, kStagedMaxBytes,
                                             target.probes));
  // Its short-share instantiation runs the same geometries, shares of at most kStagedTargetBytes.
  const void* staged_short = reinterpret_cast<const void*>(&StagedKernel<T, kStagedShortStages>);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      staged_short, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedTargetBytes)));
  if (cudaFuncSetAttribute(staged_short, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
  }
  return cudaSuccess;
}

// Probed at its largest share and column pairs; one entry per cluster size
// that fits at least once.
template <typename T>
cudaError_t ProbeStridedStaged(const ProbeTarget& target, int) {
  if (!target.clusters) return cudaSuccess;
  const void* strided_staged =
      reinterpret_cast<const void*>(&StridedStagedKernel<T, kStridedTileVectors>);
  const size_t largest = static_cast<size_t>(kStridedStagedMaxBytes) + kStridedStagedSlotBytes;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      strided_staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(largest)));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeClusters(strided_staged, "strided_staged", "strided",
                                             target.dtype, target.multiprocessors, largest,
                                             target.probes));
  // Its wide tiles (float32) run clusters of up to kStridedWideMaxCluster,
  // shares of at most kStagedTargetBytes.
  if constexpr (std::is_same<T, float>::value) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        reinterpret_cast<const void*>(&StridedStagedKernel<T, kStridedWideTileVectors>),
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kStagedTargetBytes + StridedStagedSlotBytes(kStridedWideTileVectors))));
  }
  return cudaSuccess;
}

// float32 tiles of kStridedWideTileVectors run their own instantiation.
template <typename T>
cudaError_t ExecuteStridedStaged(const LaunchStep& step, const StepArguments& args,
                                 cudaStream_t stream) {
  if constexpr (std::is_same<T, float>::value) {
    if (args.strided.tile_vectors == kStridedWideTileVectors) {
      return LaunchStepKernel(StridedStagedKernel<T, kStridedWideTileVectors>, step, stream,
                              args.strided);
    }
  }
  return LaunchStepKernel(StridedStagedKernel<T, kStridedTileVectors>, step, stream,
                          args.strided);
}

}  // namespace

SOFTMAX_EXECUTOR(kStaged, table,
                 step.short_shares ? StagedKernel<T, kStagedShortStages>
                                   : StagedKernel<T, kStagedMaxStages>)
SOFTMAX_PROBE(kStaged, ProbeStaged)
SOFTMAX_EXECUTOR(kSplitStaged, split, SplitStagedKernel<T>)
SOFTMAX_PROBE(kSplitStaged, ProbeSplitStaged)
SOFTMAX_EXECUTE_STEP(kStridedStaged, ExecuteStridedStaged)
SOFTMAX_PROBE(kStridedStaged, ProbeStridedStaged)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
