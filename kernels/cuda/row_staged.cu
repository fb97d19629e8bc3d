// The row_staged kernel's executor and probe (executor.cuh).
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/row_staged.cuh"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// Its rows of up to 128 KiB, then (where a block may have 220 KiB) its long rows.
template <typename T>
cudaError_t ProbeRowStaged(const ProbeTarget& target, int) {
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeTableKernel(reinterpret_cast<const void*>(&RowStagedKernel<T>),
                                                "row_staged", kRowStagedThreads,
                                                kRowStagedMaxShareBytes, target.dtype,
                                                target.multiprocessors, target.probes));
  return ProbeTableKernel(reinterpret_cast<const void*>(&RowStagedKernel<T>), "row_staged.long",
                          kRowStagedThreads, kRowStagedLongMaxShareBytes, target.dtype,
                          target.multiprocessors, target.probes);
}

}  // namespace

SOFTMAX_EXECUTOR(kRowStaged, table, RowStagedKernel<T>)
SOFTMAX_PROBE(kRowStaged, ProbeRowStaged)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
