#include "server/cuda/cuda_memory_mapper.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cuda/cuda_status.h"

namespace softmax::server {

CudaMemoryMapper::CudaMemoryMapper(std::vector<int> devices) : devices_(std::move(devices)) {
  int current = 0;
  cudaGetDevice(&current);
  for (int a : devices_) {
    for (int b : devices_) {
      int can = 0;
      if (a == b || cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) continue;
      cudaSetDevice(a);
      // Already enabled is no error here.
      if (cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess) cudaGetLastError();
    }
  }
  cudaSetDevice(current);
}

bool CudaMemoryMapper::ServesDevice(int device) const {
  return std::find(devices_.begin(), devices_.end(), device) != devices_.end();
}

std::string CudaMemoryMapper::ServedDevices() const {
  return absl::StrCat("served: ", absl::StrJoin(devices_, ", ", [](std::string* out, int d) {
                        absl::StrAppend(out, "cuda:", d);
                      }));
}

namespace {

// The driver's cuMemGetAddressRange, found at run time (the runtime has no
// equivalent, and the driver library is not linked): the bytes from
// `pointer` to the end of its allocation, or -1.
int64_t BytesToEndOfAllocation(void* pointer) {
  using GetAddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);
  static GetAddressRange get = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetAddressRange>(nullptr);
    }
    return reinterpret_cast<GetAddressRange>(function);
  }();
  if (get == nullptr) return -1;
  unsigned long long base = 0;
  size_t size = 0;
  const auto address = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(pointer));
  if (get(&base, &size, address) != 0) return -1;
  return static_cast<int64_t>(base + size - address);
}

}  // namespace

absl::StatusOr<void*> CudaMemoryMapper::OpenIpcHandle(absl::string_view raw_handle, int device,
                                                      int64_t* available) {
  cudaIpcMemHandle_t handle;
  if (raw_handle.size() != sizeof(handle)) {
    return absl::InvalidArgumentError(absl::StrCat("raw_handle: expected the ", sizeof(handle),
                                                   " bytes of a cudaIpcMemHandle_t, got ",
                                                   raw_handle.size()));
  }
  std::memcpy(&handle, raw_handle.data(), sizeof(handle));
  absl::Status status = SOFTMAX_CUDA_STATUS(cudaSetDevice(device));
  void* pointer = nullptr;
  if (status.ok()) {
    status = SOFTMAX_CUDA_STATUS(
        cudaIpcOpenMemHandle(&pointer, handle, cudaIpcMemLazyEnablePeerAccess));
  }
  if (!status.ok()) {
    cudaGetLastError();  // not sticky: keep it out of the next launch's check
    return absl::InvalidArgumentError(
        absl::StrCat("raw_handle: CUDA cannot open it on GPU ", device, ": ", status.message()));
  }
  *available = BytesToEndOfAllocation(pointer);
  return pointer;
}

void CudaMemoryMapper::CloseIpcHandle(void* pointer) {
  if (cudaIpcCloseMemHandle(pointer) != cudaSuccess) cudaGetLastError();
}

bool CudaMemoryMapper::RegisterHost(void* pointer, int64_t bytes) {
  const cudaError_t error = cudaHostRegister(
      pointer, static_cast<size_t>(bytes), cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // The kernels use the host address itself (unified addressing); where a
  // device sees the memory elsewhere, copy through staging instead.
  for (int device : devices_) {
    cudaSetDevice(device);
    void* seen = nullptr;
    if (cudaHostGetDevicePointer(&seen, pointer, 0) != cudaSuccess || seen != pointer) {
      cudaGetLastError();
      cudaHostUnregister(pointer);
      return false;
    }
  }
  return true;
}

void CudaMemoryMapper::UnregisterHost(void* pointer) {
  if (cudaHostUnregister(pointer) != cudaSuccess) cudaGetLastError();
}

}  // namespace softmax::server
