#include "server/shm/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {

// Longest region name and key accepted: names are echoed in messages and
// metrics-free; keys are POSIX names (NAME_MAX is 255).
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxKeyBytes = 255;
// What the GPU kernels need of a tensor's address (vector loads).
constexpr int64_t kDeviceAlignment = 16;

// a + b, false when it overflows or either is negative.
bool AddChecked(int64_t a, int64_t b, int64_t* sum) {
  if (a < 0 || b < 0) return false;
  return !__builtin_add_overflow(a, b, sum);
}

}  // namespace

const char* SharedMemoryKindName(SharedMemoryKind kind) {
  return kind == SharedMemoryKind::kCuda ? "cuda" : "system";
}

absl::StatusOr<SharedMemoryMode> ParseSharedMemoryMode(absl::string_view text) {
  if (text == "off") return SharedMemoryMode::kOff;
  if (text == "system") return SharedMemoryMode::kSystem;
  if (text == "all") return SharedMemoryMode::kAll;
  return absl::InvalidArgumentError(
      absl::StrCat("--shared_memory: expected off, system or all, got \"", text, "\""));
}

// One registered region. `base` is the start of the registered range
// (mapping + the offset's remainder within its page, or the IPC pointer).
struct SharedMemoryManager::Region {
  SharedMemoryRegionStatus status;
  char* base = nullptr;
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;
  void* mapping = nullptr;  // system: the mmap'ed pages
  size_t mapping_bytes = 0;
  bool host_registered = false;  // system: registered with CUDA
  DeviceMemoryMapper* mapper = nullptr;

  absl::Mutex mu;
  int leases ABSL_GUARDED_BY(mu) = 0;

  // Waits for the last lease, then unmaps. Called once, after the region
  // left the manager's map (no new lease can be taken).
  void WaitAndRelease() {
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](int* leases) { return *leases == 0; }, &leases));
    }
    if (status.kind == SharedMemoryKind::kSystem) {
      if (host_registered) mapper->UnregisterHost(mapping);
      if (mapping != nullptr) munmap(mapping, mapping_bytes);
    } else if (base != nullptr) {
      mapper->CloseIpcHandle(base);
    }
    base = nullptr;
  }
};

SharedMemoryManager::SharedMemoryManager(SharedMemoryMode mode, DeviceMemoryMapper* mapper,
                                         SharedMemoryObserver observer)
    : mode_(mode), mapper_(mapper), observer_(std::move(observer)) {
  absl::MutexLock lock(&mu_);
  Publish();
}

SharedMemoryManager::~SharedMemoryManager() {
  Unregister(SharedMemoryKind::kSystem, "").IgnoreError();
  Unregister(SharedMemoryKind::kCuda, "").IgnoreError();
}

bool SharedMemoryManager::Enabled(SharedMemoryKind kind) const {
  if (kind == SharedMemoryKind::kSystem) return mode_ != SharedMemoryMode::kOff;
  return mode_ == SharedMemoryMode::kAll;
}

absl::Status SharedMemoryManager::CheckNewName(const std::string& name) const {
  if (name.empty()) return absl::InvalidArgumentError("name: a region needs a name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: ", name.size(), " bytes; at most ", kMaxNameBytes));
  }
  if (auto it = regions_.find(name); it != regions_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shared memory region \"", name, "\" is already registered (",
        SharedMemoryKindName(it->second->status.kind), "); unregister it first"));
  }
  return absl::OkStatus();
}

void SharedMemoryManager::Publish() {
  if (!observer_) return;
  int64_t regions[2] = {0, 0};
  int64_t bytes[2] = {0, 0};
  for (const auto& [name, region] : regions_) {
    const int k = static_cast<int>(region->status.kind);
    ++regions[k];
    bytes[k] += region->status.byte_size;
  }
  observer_(SharedMemoryKind::kSystem, regions[0], bytes[0]);
  observer_(SharedMemoryKind::kCuda, regions[1], bytes[1]);
}

absl::Status SharedMemoryManager::Insert(std::shared_ptr<Region> region) {
  absl::MutexLock lock(&mu_);
  const std::string& name = region->status.name;
  if (absl::Status status = CheckNewName(name); !status.ok()) {
    // Registered by another call while this one mapped it.
    region->WaitAndRelease();
    return status;
  }
  regions_[name] = std::move(region);
  Publish();
  return absl::OkStatus();
}

absl::Status SharedMemoryManager::RegisterSystem(const std::string& name, const std::string& key,
                                                 int64_t offset, int64_t byte_size) {
  if (!Enabled(SharedMemoryKind::kSystem)) {
    return absl::UnimplementedError(
        "system shared memory is turned off on this server (--shared_memory=off)");
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status status = CheckNewName(name); !status.ok()) return status;
  }
  if (key.empty() || key.size() > kMaxKeyBytes || key.find('\0') != std::string::npos ||
      key.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key: expected a POSIX shared-memory name (\"/name\", at most ", kMaxKeyBytes,
        " bytes, no other '/')"));
  }
  int64_t end = 0;
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset: must be >= 0, got ", offset));
  }
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("byte_size: must be > 0, got ", byte_size));
  }
  if (!AddChecked(offset, byte_size, &end)) {
    return absl::InvalidArgumentError("offset + byte_size: overflows");
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("key: no shared-memory object \"", key, "\" on this host"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("key: cannot open \"", key, "\": ", std::strerror(error)));
  }
  struct stat info;
  if (fstat(fd, &info) != 0 || info.st_size < end) {
    const int64_t size = fstat(fd, &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "offset + byte_size: ", end, " bytes, beyond the ", size, " bytes of \"", key, "\""));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t aligned = offset / page * page;
  auto region = std::make_shared<Region>();
  region->mapper = mapper_;
  region->mapping_bytes = static_cast<size_t>(end - aligned);
  void* mapping = mmap(nullptr, region->mapping_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(aligned));
  const int map_error = errno;
  close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: cannot map \"", key, "\": ", std::strerror(map_error)));
  }
  region->mapping = mapping;
  region->base = static_cast<char*>(mapping) + (offset - aligned);
  region->status = {name, SharedMemoryKind::kSystem, key, offset, 0, byte_size};
  if (mapper_ != nullptr && mapper_->RegisterHost(mapping, static_cast<int64_t>(
                                                               region->mapping_bytes))) {
    region->host_registered = true;
    region->memory = MemoryKind::kMappedHost;
  }
  return Insert(std::move(region));
}

absl::Status SharedMemoryManager::RegisterCuda(const std::string& name,
                                               const std::string& raw_handle, int64_t device,
                                               int64_t byte_size) {
  if (!Enabled(SharedMemoryKind::kCuda)) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA shared memory is turned off on this server (--shared_memory=",
        mode_ == SharedMemoryMode::kOff ? "off" : "system", ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status status = CheckNewName(name); !status.ok()) return status;
  }
  if (mapper_ == nullptr) {
    return absl::InvalidArgumentError(
        "device_id: this server computes on no GPU, so it cannot open CUDA memory");
  }
  if (device < 0 || device > INT32_MAX || !mapper_->ServesDevice(static_cast<int>(device))) {
    return absl::InvalidArgumentError(absl::StrCat("device_id: GPU ", device,
                                                   " is not one this server computes on (",
                                                   mapper_->ServedDevices(), ")"));
  }
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("byte_size: must be > 0, got ", byte_size));
  }
  int64_t available = -1;
  absl::StatusOr<void*> pointer =
      mapper_->OpenIpcHandle(raw_handle, static_cast<int>(device), &available);
  if (!pointer.ok()) return pointer.status();
  auto region = std::make_shared<Region>();
  region->mapper = mapper_;
  region->base = static_cast<char*>(*pointer);
  if (available >= 0 && byte_size > available) {
    mapper_->CloseIpcHandle(*pointer);
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: ", byte_size, " bytes, but the allocation behind raw_handle holds ",
        available));
  }
  region->memory = MemoryKind::kDevice;
  region->device = static_cast<int>(device);
  region->status = {name, SharedMemoryKind::kCuda, "", 0, device, byte_size};
  return Insert(std::move(region));
}

absl::Status SharedMemoryManager::Unregister(SharedMemoryKind kind, const std::string& name) {
  std::vector<std::shared_ptr<Region>> removed;
  {
    absl::MutexLock lock(&mu_);
    if (name.empty()) {
      for (auto it = regions_.begin(); it != regions_.end();) {
        if (it->second->status.kind == kind) {
          removed.push_back(std::move(it->second));
          it = regions_.erase(it);
        } else {
          ++it;
        }
      }
    } else {
      auto it = regions_.find(name);
      if (it == regions_.end() || it->second->status.kind != kind) {
        return absl::NotFoundError(absl::StrCat("no ", SharedMemoryKindName(kind),
                                                " shared memory region \"", name, "\""));
      }
      removed.push_back(std::move(it->second));
      regions_.erase(it);
    }
    Publish();
  }
  // The requests in flight on these regions finish first (compute is bounded
  // by their deadlines); nothing unmaps memory a kernel still reads.
  for (const auto& region : removed) region->WaitAndRelease();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryManager::Status(
    SharedMemoryKind kind, const std::string& name) const {
  absl::MutexLock lock(&mu_);
  std::vector<SharedMemoryRegionStatus> out;
  for (const auto& [region_name, region] : regions_) {
    if (region->status.kind != kind) continue;
    if (!name.empty() && region_name != name) continue;
    out.push_back(region->status);
  }
  if (!name.empty() && out.empty()) {
    return absl::NotFoundError(absl::StrCat("no ", SharedMemoryKindName(kind),
                                            " shared memory region \"", name, "\""));
  }
  return out;
}

absl::StatusOr<SharedMemoryTensor> SharedMemoryManager::Resolve(const std::string& name,
                                                                int64_t offset,
                                                                int64_t byte_size,
                                                                absl::string_view field) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat(field, ".shared_memory_region: no region \"", name, "\" is registered"));
  }
  const std::shared_ptr<Region>& region = it->second;
  const int64_t size = region->status.byte_size;
  int64_t end = 0;
  if (offset < 0 || offset >= size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shared_memory_offset: ", offset,
                                                   " is outside region \"", name, "\" (",
                                                   size, " bytes)"));
  }
  if (byte_size < 0 || !AddChecked(offset, byte_size, &end) || end > size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shared_memory_byte_size: ", byte_size, " bytes at offset ", offset,
        " run past the end of region \"", name, "\" (", size, " bytes)"));
  }
  SharedMemoryTensor tensor;
  tensor.data = region->base + offset;
  tensor.bytes = byte_size;
  tensor.memory = region->memory;
  tensor.device = region->device;
  if (tensor.memory != MemoryKind::kHost &&
      reinterpret_cast<uintptr_t>(tensor.data) % kDeviceAlignment != 0) {
    if (tensor.memory == MemoryKind::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".shared_memory_offset: ", offset, " leaves the tensor at an address the GPU ",
          "cannot read; use a multiple of ", kDeviceAlignment, " bytes"));
    }
    // The GPUs copy it through their staging instead.
    tensor.memory = MemoryKind::kHost;
  }
  {
    absl::MutexLock region_lock(&region->mu);
    ++region->leases;
  }
  tensor.lease = std::shared_ptr<const void>(region.get(), [region](const void*) {
    absl::MutexLock region_lock(&region->mu);
    --region->leases;
  });
  return tensor;
}

}  // namespace softmax::server
