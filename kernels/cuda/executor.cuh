// How a schedule's launch step runs (launch.cu executes schedules with it):
// LaunchStepKernel launches a kernel in a step's geometry, and Executor<K>,
// specialized by the header of K's family next to its kernel, picks the
// instantiation that runs a step of K. launch.cu dispatches every
// SoftmaxKernel value to its Executor: a kernel without one does not compile.
//
// A specialization (SOFTMAX_EXECUTOR, below, where one expression names
// the instantiation) declares
//   template <typename T>
//   static cudaError_t Run(const LaunchStep& step, const StepArguments& args,
//                          cudaStream_t stream);
// and decides nothing: the planner (plan.cc) filled the step.
#ifndef SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_
#define SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_

#include <cuda_runtime.h>

#include "kernels/cuda/plan.h"

namespace softmax {
namespace gpu {
namespace detail {

// A step's arguments as its kernel takes them (KernelInfo::args says
// which): the table filled (inline or in scratch), scratch offsets turned
// into pointers.
struct StepArguments {
  FlatArgs flat;
  TableArgs table;
  SplitArgs split;
  StridedArgs strided;
};

// Launches `kernel` with a step's geometry: its grid, block, dynamic shared
// memory, cluster dimension (when set), cooperative attribute (when set:
// every block resident at once, which the split kernels' waits rely on) and
// programmatic overlap with the step before (when set).
template <typename Args>
cudaError_t LaunchStepKernel(void (*kernel)(Args), const LaunchStep& step, cudaStream_t stream,
                             const Args& args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(step.grid, 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(step.threads), 1, 1);
  config.dynamicSmemBytes = step.shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[3];
  unsigned count = 0;
  if (step.cluster > 0) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(step.cluster);
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (step.cooperative) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count].val.cooperative = 1;
    ++count;
  }
  if (step.overlap_previous) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, args);
  if (error != cudaSuccess) return error;
  return cudaGetLastError();
}

// Specialized for each SoftmaxKernel value by its family's header.
template <SoftmaxKernel K>
struct Executor;

// Specializes Executor<SoftmaxKernel::K> for a kernel that takes
// args.ARGS: the trailing expression names the instantiation, from T (the
// element type) and `step`.
#define SOFTMAX_EXECUTOR(K, ARGS, ...)                                                    \
  template <>                                                                             \
  struct Executor<SoftmaxKernel::K> {                                                     \
    template <typename T>                                                                 \
    static cudaError_t Run(const LaunchStep& step, const StepArguments& args,             \
                           cudaStream_t stream) {                                         \
      return LaunchStepKernel(__VA_ARGS__, step, stream, args.ARGS);                      \
    }                                                                                     \
  }

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_
