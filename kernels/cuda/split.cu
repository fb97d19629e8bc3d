// The split kernels' executors and probes (executor.cuh).
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/split.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Between the passes (aligned rows): each row's partials merged once, by
// MergePartials as the unaligned rows' split_normalize merges them, into
// totals[row] for split_normalize.
__global__ void __launch_bounds__(kThreads) SplitMergeKernel(const SplitArgs a) {
  __shared__ float2 slots[kWarps];
  DependentsMayStart();
  WaitForPrevious();
  for (long long row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const MaxSum total = MergePartials(a.partials + row * a.parts, a.parts, a.scale, slots);
    if (threadIdx.x == 0) a.totals[row] = make_float2(total.m, total.d);
  }
}

SOFTMAX_EXECUTOR(kSplitFused, split,
                 step.vec ? SplitFusedKernel<T, true> : SplitFusedKernel<T, false>)
SOFTMAX_PROBE_ONE(kSplitFused, "split_fused", "split", SplitFusedKernel<T, true>)
SOFTMAX_EXECUTOR(kSplitStats, split,
                 step.vec ? SplitStatsKernel<T, true> : SplitStatsKernel<T, false>)
SOFTMAX_PROBE_ONE(kSplitStats, "split_stats", "split", SplitStatsKernel<T, true>)
SOFTMAX_EXECUTOR(kSplitMerge, split, SplitMergeKernel)
SOFTMAX_NO_PROBE(kSplitMerge)
SOFTMAX_EXECUTOR(kSplitNormalize, split, SplitNormalizeKernel<T>)
SOFTMAX_NO_PROBE(kSplitNormalize)
SOFTMAX_EXECUTOR(kSplitNormalizeUnits, split, SplitNormalizeUnitsKernel<T>)
SOFTMAX_PROBE_ONE(kSplitNormalizeUnits, "split_normalize_units", "split",
                  SplitNormalizeUnitsKernel<T>)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
