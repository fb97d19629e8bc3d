// The flat kernels' executors and probes (executor.cuh).
#include "kernels/cuda/executor.cuh"
#include "kernels/cuda/flat.cuh"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// Flat kernel block sizes that FlatShapeOf returns.
constexpr int kFlatThreads[] = {64, 128, 256, 512};

template <typename T>
cudaError_t ProbeFlat(const ProbeTarget& target, int) {
  for (const int threads : kFlatThreads) {
    KernelProbe flat;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(
        reinterpret_cast<const void*>(&FlatKernel<T, true, false>), FlatProbeName(threads),
        "flat", target.dtype, target.multiprocessors, &flat, threads));
    target.probes->push_back(flat);
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t ProbeFlatTable(const ProbeTarget& target, int) {
  return ProbeTableKernel(reinterpret_cast<const void*>(&FlatTableKernel<T>), "flat_table",
                          kTableThreads, kTableMaxSharedBytes, target.dtype,
                          target.multiprocessors, target.probes);
}

}  // namespace

SOFTMAX_EXECUTOR(kFlat, flat,
                 step.vec ? (step.log ? FlatKernel<T, true, true> : FlatKernel<T, true, false>)
                          : (step.log ? FlatKernel<T, false, true> : FlatKernel<T, false, false>))
SOFTMAX_PROBE(kFlat, ProbeFlat)
SOFTMAX_EXECUTOR(kFlatTable, table, FlatTableKernel<T>)
SOFTMAX_PROBE(kFlatTable, ProbeFlatTable)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
