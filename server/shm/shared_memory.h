// Shared-memory regions (Triton's system and CUDA shared-memory extensions):
// a caller on the same host registers memory it owns once, then names it in
// requests, and the server reads inputs from it and writes outputs into it
// instead of moving tensor bytes over the wire.
//
//   system: a POSIX shared-memory object (shm_open key), mapped once at
//           registration; on a GPU server also registered with CUDA (pinned
//           and mapped into every GPU's address space) so that the kernels
//           read and write it over the bus with no copy in host memory.
//   cuda:   device memory of another process, a cudaIpcMemHandle_t opened
//           once at registration on that device; the kernels read and write
//           it directly.
//
// A region's memory stays mapped while any request uses it: Resolve hands a
// request a Lease, and Unregister first removes the name (later requests get
// NOT_FOUND) and then waits until the region's last lease is released before
// unmapping, so no kernel ever touches memory the server gave back.
//
// Trust model: any caller that can reach the port may register any system
// shared-memory key it can name (the server opens it with its own rights) and
// any CUDA IPC handle; turn the extension off with --shared_memory=off, or
// restrict callers with mTLS / tokens. A caller that shrinks a system region
// under the server (ftruncate) can crash it; that is the caller's own memory.
//
// Thread-safety: all methods are thread-safe.
#ifndef SOFTMAX_SERVER_SHM_SHARED_MEMORY_H_
#define SOFTMAX_SERVER_SHM_SHARED_MEMORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

enum class SharedMemoryKind { kSystem = 0, kCuda = 1 };
const char* SharedMemoryKindName(SharedMemoryKind kind);  // "system" / "cuda"

// What --shared_memory allows.
enum class SharedMemoryMode { kOff, kSystem, kAll };
// "off" / "system" / "all"; INVALID_ARGUMENT otherwise.
absl::StatusOr<SharedMemoryMode> ParseSharedMemoryMode(absl::string_view text);

// How the server reaches the memory of the GPUs it computes on. Implemented
// by server/cuda/ (CudaMemoryMapper); null on a server without GPUs.
class DeviceMemoryMapper {
 public:
  virtual ~DeviceMemoryMapper() = default;
  // True when `device` is one of the GPUs this server computes on.
  virtual bool ServesDevice(int device) const = 0;
  // The GPUs served, for messages ("cuda:0, cuda:1").
  virtual std::string ServedDevices() const = 0;
  // Opens a cudaIpcMemHandle_t (its raw bytes) on `device`; the returned
  // pointer is valid on every GPU served that can access `device`.
  // `*available` receives the bytes from it to the end of its allocation
  // (-1 when CUDA cannot tell).
  virtual absl::StatusOr<void*> OpenIpcHandle(absl::string_view raw_handle, int device,
                                              int64_t* available) = 0;
  virtual void CloseIpcHandle(void* pointer) = 0;
  // Pins [pointer, pointer + bytes) and maps it into every GPU's address
  // space (portable, mapped); true when it did, false when the memory stays
  // unregistered (the GPUs then copy it through their staging).
  virtual bool RegisterHost(void* pointer, int64_t bytes) = 0;
  virtual void UnregisterHost(void* pointer) = 0;
};

// What Status reports of one region (Triton's RegionStatus fields).
struct SharedMemoryRegionStatus {
  std::string name;
  SharedMemoryKind kind = SharedMemoryKind::kSystem;
  std::string key;     // system
  int64_t offset = 0;  // system
  int64_t device = 0;  // cuda
  int64_t byte_size = 0;
};

// Part of a region a request reads or writes, checked to lie inside it.
struct SharedMemoryTensor {
  char* data = nullptr;
  int64_t bytes = 0;  // the request's shared_memory_byte_size
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // for kDevice
  // Keeps the region mapped; release once no kernel uses `data` any more.
  std::shared_ptr<const void> lease;
};

// Receives the registered regions and bytes of each kind (metrics).
using SharedMemoryObserver =
    std::function<void(SharedMemoryKind kind, int64_t regions, int64_t bytes)>;

class SharedMemoryManager {
 public:
  // `mapper` (may be null: no GPU) must outlive this object.
  SharedMemoryManager(SharedMemoryMode mode, DeviceMemoryMapper* mapper,
                      SharedMemoryObserver observer = nullptr);
  // Unregisters everything (waiting for leases, see Unregister).
  ~SharedMemoryManager();

  SharedMemoryManager(const SharedMemoryManager&) = delete;
  SharedMemoryManager& operator=(const SharedMemoryManager&) = delete;

  SharedMemoryMode mode() const { return mode_; }
  // Whether `kind` can be registered (the mode allows it).
  bool Enabled(SharedMemoryKind kind) const;

  // Maps [offset, offset + byte_size) of the POSIX shared-memory object
  // `key`. INVALID_ARGUMENT for a bad name, key, offset or size, or a range
  // beyond the object's size; NOT_FOUND when no object has that key;
  // ALREADY_EXISTS when the name is registered (of either kind);
  // UNIMPLEMENTED when the mode does not allow it.
  absl::Status RegisterSystem(const std::string& name, const std::string& key, int64_t offset,
                              int64_t byte_size);
  // Opens `raw_handle` (a cudaIpcMemHandle_t's bytes) on GPU `device`, for
  // byte_size bytes. INVALID_ARGUMENT for a bad handle, size or a device
  // this server does not compute on; errors as above otherwise.
  absl::Status RegisterCuda(const std::string& name, const std::string& raw_handle,
                            int64_t device, int64_t byte_size);
  // Unregisters region `name` of `kind` (every region of that kind when
  // empty): the name is free at once; returns once no request uses the
  // memory any more and it is unmapped. NOT_FOUND for an unknown name.
  absl::Status Unregister(SharedMemoryKind kind, const std::string& name);
  // The regions of `kind` (only `name` when not empty; NOT_FOUND when it is
  // not registered), ordered by name.
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> Status(SharedMemoryKind kind,
                                                               const std::string& name) const;

  // The part [offset, offset + byte_size) of region `name`, for a request's
  // tensor; `field` names the request field in messages. NOT_FOUND for an
  // unknown region; INVALID_ARGUMENT for a negative or out-of-range offset or
  // size.
  absl::StatusOr<SharedMemoryTensor> Resolve(const std::string& name, int64_t offset,
                                             int64_t byte_size, absl::string_view field) const;

 private:
  struct Region;

  absl::Status CheckNewName(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a mapped region under its name, or unmaps it when the name was
  // taken meanwhile (ALREADY_EXISTS).
  absl::Status Insert(std::shared_ptr<Region> region);

  const SharedMemoryMode mode_;
  DeviceMemoryMapper* const mapper_;
  const SharedMemoryObserver observer_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SHM_SHARED_MEMORY_H_
