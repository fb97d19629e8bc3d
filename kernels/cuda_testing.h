// Test helper shared by the CUDA kernels' tests: whether a device is there to
// test on. Header-only, for tests.
#ifndef SOFTMAX_KERNELS_CUDA_TESTING_H_
#define SOFTMAX_KERNELS_CUDA_TESTING_H_

#include <cuda_runtime_api.h>

#include <string>

namespace softmax {

// Returns true when the CUDA runtime sees a device. Otherwise sets *reason to
// the runtime's error string, or to `no_device` when it sees none, clears the
// runtime's last error (later calls do not see it) and returns false.
inline bool HaveCudaDevice(const char* no_device, std::string* reason) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    *reason = error != cudaSuccess ? cudaGetErrorString(error) : no_device;
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_TESTING_H_
