// CudaMemoryMapper: how shared-memory regions reach the GPUs this server
// computes on (DeviceMemoryMapper, server/shm/shared_memory.h). CUDA IPC
// handles are opened on their device with peer access for the others; system
// regions are pinned and mapped into every GPU's address space.
//
// Thread-safety: thread-safe (CUDA's calls are; the current device is set
// on the calling thread).
#ifndef SOFTMAX_SERVER_CUDA_CUDA_MEMORY_MAPPER_H_
#define SOFTMAX_SERVER_CUDA_CUDA_MEMORY_MAPPER_H_

#include <vector>

#include "server/shm/shared_memory.h"

namespace softmax::server {

class CudaMemoryMapper final : public DeviceMemoryMapper {
 public:
  // `devices`: the GPUs served. Enables peer access between every pair that
  // supports it, so that a batch on one GPU may read a region of another.
  explicit CudaMemoryMapper(std::vector<int> devices);

  bool ServesDevice(int device) const override;
  std::string ServedDevices() const override;
  // INVALID_ARGUMENT for a handle of the wrong size or one CUDA cannot open
  // (not an IPC handle, memory of this process, freed by its owner).
  absl::StatusOr<void*> OpenIpcHandle(absl::string_view raw_handle, int device,
                                      int64_t* available) override;
  void CloseIpcHandle(void* pointer) override;
  bool RegisterHost(void* pointer, int64_t bytes) override;
  void UnregisterHost(void* pointer) override;

 private:
  const std::vector<int> devices_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_CUDA_CUDA_MEMORY_MAPPER_H_
