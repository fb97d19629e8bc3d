// The one way server code checks CUDA runtime calls: SOFTMAX_CUDA_STATUS turns
// a cudaError_t into an absl::Status naming the call, file and line, and
// clears the runtime's last-error slot where the error is not sticky.
//
// Codes: cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED; everything else ->
// INTERNAL. IsStickyCudaError tells whether the context is unusable from now
// on (the process must restart).
//
// Thread-safety: pure functions (the CUDA runtime's last error is per thread).
#ifndef SOFTMAX_SERVER_CUDA_CUDA_STATUS_H_
#define SOFTMAX_SERVER_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace softmax::server {

absl::Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line);

// True for errors after which the CUDA context cannot be used again
// (illegal address, launch failure, trap, ECC...).
bool IsStickyCudaError(cudaError_t error);

// The cudaError_t a CudaStatus() error was made from (cudaSuccess for OK or
// for a Status that did not come from CudaStatus).
cudaError_t CudaErrorOf(const absl::Status& status);

}  // namespace softmax::server

#define SOFTMAX_CUDA_STATUS(expr) \
  ::softmax::server::CudaStatus((expr), #expr, __FILE__, __LINE__)

// Returns the Status from the calling function when the CUDA call fails.
#define SOFTMAX_RETURN_IF_CUDA(expr)                                   \
  do {                                                                 \
    const ::absl::Status softmax_cuda_status_ = SOFTMAX_CUDA_STATUS(expr); \
    if (!softmax_cuda_status_.ok()) return softmax_cuda_status_;       \
  } while (false)

#endif  // SOFTMAX_SERVER_CUDA_CUDA_STATUS_H_
