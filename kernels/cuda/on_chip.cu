// The on-chip kernel's executor and probe (executor.cuh).
#include <algorithm>

#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/on_chip.cuh"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// Part 0: a block alone. Part 1 (after the table kernels): one entry per
// cluster size, from part 0's, up to the largest that fits at least once,
// which bounds the plan's cluster size.
template <typename T>
cudaError_t ProbeOnChip(const ProbeTarget& target, int part) {
  const void* on_chip = reinterpret_cast<const void*>(&OnChipKernel<T>);
  if (part == 0) return AppendProbe(on_chip, "on_chip", "warp,block", target);
  KernelProbe probe;
  for (const KernelProbe& p : *target.probes) {
    if (p.dtype == target.dtype && p.kernel.rfind("on_chip<", 0) == 0) {
      probe = p;  // part 0's entry: the first of this kernel and dtype
      break;
    }
  }
  int best = 1;
  if (target.clusters) {
    for (int size = 2; size <= kMaxClusterSize; size *= 2) {
      if (size > 8 && cudaFuncSetAttribute(on_chip, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                           1) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      const int active = ActiveClusters(on_chip, size, kThreads, 0, target.multiprocessors);
      if (active <= 0) break;
      KernelProbe c = probe;
      c.paths = "warp,block,cluster";
      c.cluster_size = size;
      c.max_active_clusters = active;
      c.grid = active * size;
      target.probes->push_back(c);
      best = size;
    }
  }
  *target.max_cluster = std::min(*target.max_cluster, best);
  return cudaSuccess;
}

}  // namespace

SOFTMAX_EXECUTOR(kOnChip, table, OnChipKernel<T>)
SOFTMAX_PROBE(kOnChip, ProbeOnChip)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
