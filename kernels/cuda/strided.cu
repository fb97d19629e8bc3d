// The strided kernels' executors and probes (executor.cuh).
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/strided.cuh"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

template <typename T>
cudaError_t ProbeStridedStats(const ProbeTarget& target, int) {
  return AppendProbe(reinterpret_cast<const void*>(&StridedStatsKernel<T, true>),
                     "strided_stats", "strided", target);
}

template <typename T>
cudaError_t ProbeStridedNormalize(const ProbeTarget& target, int) {
  return AppendProbe(reinterpret_cast<const void*>(&StridedNormalizeKernel<T, true>),
                     "strided_normalize", "strided", target);
}

}  // namespace

SOFTMAX_EXECUTOR(kStridedStats, strided,
                 step.vec ? StridedStatsKernel<T, true> : StridedStatsKernel<T, false>)
SOFTMAX_PROBE(kStridedStats, ProbeStridedStats)
SOFTMAX_EXECUTOR(kStridedNormalize, strided,
                 step.vec ? StridedNormalizeKernel<T, true> : StridedNormalizeKernel<T, false>)
SOFTMAX_PROBE(kStridedNormalize, ProbeStridedNormalize)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
