// How a schedule's launch step runs and how the plan's probes are taken.
// launch.cu holds neither a kernel nor a family: it calls ExecuteStep<K, T>
// for each step and ProbeFamily<K, T> in ProbeOrder() (plan.cc), for every
// SoftmaxKernel value K and element type T (float, __half, __nv_bfloat16).
// This header declares both explicit specializations for each K of
// SOFTMAX_KERNEL_LIST (softmax_cuda.h) and each T, so every translation unit
// that calls one has seen its declaration first, as [temp.expl.spec]
// requires. Each family defines them for its kernels in its own translation
// unit (kernels/cuda/<family>.cu, built by a glob): SOFTMAX_EXECUTOR below,
// where one expression names the instantiation that runs a step of K (it
// decides nothing: the planner, plan.cc, filled the step), and
// SOFTMAX_PROBE or SOFTMAX_NO_PROBE. A kernel without them does not link.
#ifndef SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_
#define SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cuda/plan.h"
#include "kernels/softmax_cuda.h"

#define SOFTMAX_CUDA_RETURN_IF_ERROR(expr)    \
  do {                                        \
    const cudaError_t error_ = (expr);        \
    if (error_ != cudaSuccess) return error_; \
  } while (0)

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

// Runs a step of kernel K on elements of type T (float, __half,
// __nv_bfloat16): defined by K's family (SOFTMAX_EXECUTOR).
template <SoftmaxKernel K, typename T>
cudaError_t ExecuteStep(const LaunchStep& step, const StepArguments& args, cudaStream_t stream);

// What a family's probe is given: one element type's probes of the device.
struct ProbeTarget {
  DType dtype;
  int multiprocessors;
  bool clusters;                     // the device runs clusters (sm_90)
  std::vector<KernelProbe>* probes;  // the plan's lines, appended in ProbeOrder()
  int* max_cluster;                  // the plan's bound on cluster sizes
};

// Appends kernel K's probes for element type T, call `part` of K in
// ProbeOrder(): defined by K's family (SOFTMAX_PROBE, SOFTMAX_NO_PROBE).
template <SoftmaxKernel K, typename T>
cudaError_t ProbeFamily(const ProbeTarget& target, int part);

// The explicit specializations that the families define, declared for every
// kernel of the list and every element type.
#define SOFTMAX_DECLARE_KERNEL_FOR(K, T)                                                    \
  template <>                                                                               \
  cudaError_t ExecuteStep<SoftmaxKernel::K, T>(const LaunchStep& step,                      \
                                               const StepArguments& args,                   \
                                               cudaStream_t stream);                        \
  template <>                                                                               \
  cudaError_t ProbeFamily<SoftmaxKernel::K, T>(const ProbeTarget& target, int part);
#define SOFTMAX_DECLARE_KERNEL(K)                                                           \
  SOFTMAX_DECLARE_KERNEL_FOR(K, float)                                                      \
  SOFTMAX_DECLARE_KERNEL_FOR(K, __half)                                                     \
  SOFTMAX_DECLARE_KERNEL_FOR(K, __nv_bfloat16)
SOFTMAX_KERNEL_LIST(SOFTMAX_DECLARE_KERNEL)
#undef SOFTMAX_DECLARE_KERNEL
#undef SOFTMAX_DECLARE_KERNEL_FOR

// The probes' helpers (launch.cu). ProbeKernel fills *probe with a kernel's
// attributes and blocks per SM at `threads` and `dynamic_shared`, cluster
// size 1.
cudaError_t ProbeKernel(const void* kernel, const std::string& name, const char* paths,
                        DType dtype, int multiprocessors, KernelProbe* probe,
                        int threads = kThreads, size_t dynamic_shared = 0);
// ProbeKernel at kThreads threads, without dynamic shared memory; appends the entry.
cudaError_t AppendProbe(const void* kernel, const char* name, const char* paths,
                        const ProbeTarget& target);
// Clusters of `size` blocks of `kernel` that fit at once (0 when none or on error).
int ActiveClusters(const void* kernel, int size, int threads, size_t dynamic_shared,
                   int multiprocessors);
// Probes a kernel of kStagedThreads-thread blocks with `dynamic_shared` bytes
// each (its largest share) and appends one entry per cluster size, 1 up to
// kMaxClusterSize, at which at least one cluster fits.
cudaError_t ProbeClusters(const void* kernel, const std::string& name, const char* paths,
                          DType dtype, int multiprocessors, size_t dynamic_shared,
                          std::vector<KernelProbe>* probes);
// Probes a table kernel that takes up to `shared` bytes of dynamic shared
// memory and appends its entry, only where a block may have that much (the
// row_staged kernel's 128 KiB rows: not on GPUs of 99 KiB per block, where
// the planner sends those rows on).
cudaError_t ProbeTableKernel(const void* kernel, const char* name, int threads, size_t shared,
                             DType dtype, int multiprocessors, std::vector<KernelProbe>* probes);

// Defines ExecuteStep<SoftmaxKernel::K, T> for the three element types from
// a function template F<T> of ExecuteStep's parameters.
#define SOFTMAX_EXECUTE_STEP(K, F)                                                          \
  template <>                                                                               \
  cudaError_t ExecuteStep<SoftmaxKernel::K, float>(                                         \
      const LaunchStep& step, const StepArguments& args, cudaStream_t stream) {             \
    return F<float>(step, args, stream);                                                    \
  }                                                                                         \
  template <>                                                                               \
  cudaError_t ExecuteStep<SoftmaxKernel::K, __half>(                                        \
      const LaunchStep& step, const StepArguments& args, cudaStream_t stream) {             \
    return F<__half>(step, args, stream);                                                   \
  }                                                                                         \
  template <>                                                                               \
  cudaError_t ExecuteStep<SoftmaxKernel::K, __nv_bfloat16>(                                 \
      const LaunchStep& step, const StepArguments& args, cudaStream_t stream) {             \
    return F<__nv_bfloat16>(step, args, stream);                                            \
  }

// The executor of a kernel that takes args.ARGS: the trailing expression
// names the instantiation, from T (the element type) and `step`.
#define SOFTMAX_EXECUTOR(K, ARGS, ...)                                                      \
  template <typename T>                                                                     \
  cudaError_t Execute_##K(const LaunchStep& step, const StepArguments& args,                \
                          cudaStream_t stream) {                                            \
    return LaunchStepKernel(__VA_ARGS__, step, stream, args.ARGS);                          \
  }                                                                                         \
  SOFTMAX_EXECUTE_STEP(K, Execute_##K)

// Defines ProbeFamily<SoftmaxKernel::K, T> for the three element types from
// a function template F<T>(const ProbeTarget&, int part).
#define SOFTMAX_PROBE(K, F)                                                                 \
  template <>                                                                               \
  cudaError_t ProbeFamily<SoftmaxKernel::K, float>(const ProbeTarget& target, int part) {   \
    return F<float>(target, part);                                                          \
  }                                                                                         \
  template <>                                                                               \
  cudaError_t ProbeFamily<SoftmaxKernel::K, __half>(const ProbeTarget& target, int part) {  \
    return F<__half>(target, part);                                                         \
  }                                                                                         \
  template <>                                                                               \
  cudaError_t ProbeFamily<SoftmaxKernel::K, __nv_bfloat16>(const ProbeTarget& target,       \
                                                           int part) {                      \
    return F<__nv_bfloat16>(target, part);                                                  \
  }

// The probe of a kernel of one entry at kThreads threads (AppendProbe): the
// trailing expression names the instantiation probed, from T.
#define SOFTMAX_PROBE_ONE(K, NAME, PATHS, ...)                                              \
  template <typename T>                                                                     \
  cudaError_t Probe_##K(const ProbeTarget& target, int) {                                   \
    return AppendProbe(reinterpret_cast<const void*>(&__VA_ARGS__), NAME, PATHS, target);   \
  }                                                                                         \
  SOFTMAX_PROBE(K, Probe_##K)

// A kernel that needs no probe (not in ProbeOrder()).
template <typename T>
cudaError_t NoProbe(const ProbeTarget&, int) {
  return cudaSuccess;
}
#define SOFTMAX_NO_PROBE(K) SOFTMAX_PROBE(K, NoProbe)

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_EXECUTOR_CUH_
