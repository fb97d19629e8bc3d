// The strided kernels' executors and probes (executor.cuh).
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/strided.cuh"

namespace softmax {
namespace gpu {
namespace detail {

SOFTMAX_EXECUTOR(kStridedStats, strided,
                 step.vec ? StridedStatsKernel<T, true> : StridedStatsKernel<T, false>)
SOFTMAX_PROBE_ONE(kStridedStats, "strided_stats", "strided", StridedStatsKernel<T, true>)
SOFTMAX_EXECUTOR(kStridedNormalize, strided,
                 step.vec ? StridedNormalizeKernel<T, true> : StridedNormalizeKernel<T, false>)
SOFTMAX_PROBE_ONE(kStridedNormalize, "strided_normalize", "strided",
                  StridedNormalizeKernel<T, true>)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
