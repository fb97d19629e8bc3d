// The CUDA runtime's types that the kernels' API and the planner name
// (cudaError_t, cudaStream_t, float2): the runtime's own header where the
// CUDA toolkit is there, else stand-ins with the runtime's values, so that
// the planner (kernels/cuda/plan.cc, host C++) and its tests build without
// the toolkit. Only the planner links in such a build: no stream is used.
#ifndef SOFTMAX_KERNELS_CUDA_TYPES_H_
#define SOFTMAX_KERNELS_CUDA_TYPES_H_

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#else
enum cudaError_t : int { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef struct CUstream_st* cudaStream_t;
struct alignas(8) float2 {
  float x, y;
};
#endif

#endif  // SOFTMAX_KERNELS_CUDA_TYPES_H_
