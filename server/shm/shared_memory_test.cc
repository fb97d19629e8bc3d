#include "server/shm/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace softmax::server {
namespace {

using ::testing::HasSubstr;

// A POSIX shared-memory object of `bytes`, filled with 0, 1, 2, ...
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes)
      : key_(absl::StrCat("/softmax-shm-test-", getpid(), "-", counter_++)), bytes_(bytes) {
    const int fd = shm_open(key_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    data_ = static_cast<unsigned char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    for (int64_t i = 0; i < bytes; ++i) data_[i] = static_cast<unsigned char>(i);
  }
  ~ShmObject() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  unsigned char* data() { return data_; }

 private:
  static inline std::atomic<int> counter_{0};
  std::string key_;
  int64_t bytes_;
  unsigned char* data_ = nullptr;
};

// Serves GPU 0 with "device memory" from the host, and counts calls.
class FakeMapper : public DeviceMemoryMapper {
 public:
  bool ServesDevice(int device) const override { return device == 0; }
  std::string ServedDevices() const override { return "cuda:0"; }
  absl::StatusOr<void*> OpenIpcHandle(absl::string_view raw, int device,
                                      int64_t* available) override {
    if (raw.size() != 64) return absl::InvalidArgumentError("raw_handle: expected 64 bytes");
    ++opened;
    *available = sizeof(memory);
    return static_cast<void*>(memory);
  }
  void CloseIpcHandle(void* pointer) override { ++closed; }
  bool RegisterHost(void* pointer, int64_t bytes) override {
    ++host_registered;
    return register_host;
  }
  void UnregisterHost(void* pointer) override { ++host_unregistered; }

  bool register_host = true;
  int opened = 0, closed = 0, host_registered = 0, host_unregistered = 0;
  alignas(256) char memory[4096] = {};
};

TEST(SharedMemoryTest, ParsesTheMode) {
  EXPECT_EQ(*ParseSharedMemoryMode("off"), SharedMemoryMode::kOff);
  EXPECT_EQ(*ParseSharedMemoryMode("system"), SharedMemoryMode::kSystem);
  EXPECT_EQ(*ParseSharedMemoryMode("all"), SharedMemoryMode::kAll);
  EXPECT_EQ(ParseSharedMemoryMode("cuda").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryTest, RegistersResolvesAndReportsASystemRegion) {
  ShmObject object(10000);
  int64_t observed_regions = -1, observed_bytes = -1;
  SharedMemoryManager manager(SharedMemoryMode::kAll, nullptr,
                              [&](SharedMemoryKind kind, int64_t regions, int64_t bytes) {
                                if (kind != SharedMemoryKind::kSystem) return;
                                observed_regions = regions;
                                observed_bytes = bytes;
                              });
  EXPECT_EQ(observed_regions, 0);
  // An offset that is not page-aligned: the mapping still starts there.
  ASSERT_TRUE(manager.RegisterSystem("in", object.key(), 4097, 5000).ok());
  EXPECT_EQ(observed_regions, 1);
  EXPECT_EQ(observed_bytes, 5000);

  absl::StatusOr<SharedMemoryTensor> tensor = manager.Resolve("in", 3, 100, "inputs[0]");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->memory, MemoryKind::kHost);  // no GPU: not registered with one
  EXPECT_EQ(static_cast<unsigned char>(tensor->data[0]), static_cast<unsigned char>(4097 + 3));
  // Written through the region, seen by the owner.
  tensor->data[1] = 42;
  EXPECT_EQ(object.data()[4097 + 4], 42);

  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> status =
      manager.Status(SharedMemoryKind::kSystem, "");
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->size(), 1u);
  EXPECT_EQ((*status)[0].name, "in");
  EXPECT_EQ((*status)[0].key, object.key());
  EXPECT_EQ((*status)[0].offset, 4097);
  EXPECT_EQ((*status)[0].byte_size, 5000);
  EXPECT_EQ(manager.Status(SharedMemoryKind::kCuda, "").value().size(), 0u);
  EXPECT_EQ(manager.Status(SharedMemoryKind::kSystem, "other").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SharedMemoryTest, RefusesBadRegistrations) {
  ShmObject object(4096);
  SharedMemoryManager manager(SharedMemoryMode::kAll, nullptr);
  auto code = [](const absl::Status& status) { return status.code(); };
  EXPECT_EQ(code(manager.RegisterSystem("", object.key(), 0, 16)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(manager.RegisterSystem("a", "/softmax-no-such-key", 0, 16)),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(code(manager.RegisterSystem("a", "/a/b", 0, 16)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(manager.RegisterSystem("a", object.key(), -1, 16)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(manager.RegisterSystem("a", object.key(), 0, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(manager.RegisterSystem("a", object.key(), INT64_MAX, 16)),
            absl::StatusCode::kInvalidArgument);
  const absl::Status beyond = manager.RegisterSystem("a", object.key(), 4000, 97);
  EXPECT_EQ(code(beyond), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(beyond.message()), HasSubstr("beyond the 4096 bytes"));
  ASSERT_TRUE(manager.RegisterSystem("a", object.key(), 0, 4096).ok());
  EXPECT_EQ(code(manager.RegisterSystem("a", object.key(), 0, 16)),
            absl::StatusCode::kAlreadyExists);
  // No GPU: CUDA memory cannot be opened.
  EXPECT_EQ(code(manager.RegisterCuda("c", std::string(64, '\0'), 0, 16)),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryTest, ChecksEveryTensorAgainstItsRegion) {
  ShmObject object(1024);
  SharedMemoryManager manager(SharedMemoryMode::kSystem, nullptr);
  ASSERT_TRUE(manager.RegisterSystem("r", object.key(), 0, 1024).ok());
  auto code = [&](const std::string& name, int64_t offset, int64_t bytes) {
    return manager.Resolve(name, offset, bytes, "inputs[0]").status().code();
  };
  EXPECT_EQ(code("r", 0, 1024), absl::StatusCode::kOk);
  EXPECT_EQ(code("r", 1000, 24), absl::StatusCode::kOk);
  EXPECT_EQ(code("nope", 0, 4), absl::StatusCode::kNotFound);
  EXPECT_EQ(code("r", -4, 4), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("r", 1024, 4), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("r", 1000, 25), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("r", 8, INT64_MAX), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("r", 0, -1), absl::StatusCode::kInvalidArgument);
  const absl::Status past = manager.Resolve("r", 1000, 25, "outputs[0]").status();
  EXPECT_THAT(std::string(past.message()), HasSubstr("outputs[0].shared_memory_byte_size"));
}

TEST(SharedMemoryTest, UnregisterWaitsForTheRequestsUsingTheRegion) {
  ShmObject object(4096);
  FakeMapper mapper;
  SharedMemoryManager manager(SharedMemoryMode::kAll, &mapper);
  ASSERT_TRUE(manager.RegisterSystem("r", object.key(), 0, 4096).ok());
  EXPECT_EQ(mapper.host_registered, 1);
  absl::StatusOr<SharedMemoryTensor> tensor = manager.Resolve("r", 0, 64, "inputs[0]");
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->memory, MemoryKind::kMappedHost);

  std::atomic<bool> returned{false};
  std::thread unregister([&] {
    EXPECT_TRUE(manager.Unregister(SharedMemoryKind::kSystem, "r").ok());
    returned = true;
  });
  // The name is gone at once; the memory stays until the lease is released.
  for (int i = 0; i < 1000 && manager.Resolve("r", 0, 64, "x").ok(); ++i) usleep(1000);
  EXPECT_EQ(manager.Resolve("r", 0, 64, "x").status().code(), absl::StatusCode::kNotFound);
  usleep(50 * 1000);
  EXPECT_FALSE(returned.load());
  EXPECT_EQ(mapper.host_unregistered, 0);
  tensor->data[0] = 7;  // still mapped
  tensor->lease.reset();
  unregister.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(mapper.host_unregistered, 1);
  // The name can be registered again.
  EXPECT_TRUE(manager.RegisterSystem("r", object.key(), 0, 16).ok());
  EXPECT_EQ(manager.Unregister(SharedMemoryKind::kSystem, "other").code(),
            absl::StatusCode::kNotFound);
}

TEST(SharedMemoryTest, OpensCudaRegionsOnServedDevicesOnly) {
  FakeMapper mapper;
  int64_t cuda_regions = -1;
  SharedMemoryManager manager(SharedMemoryMode::kAll, &mapper,
                              [&](SharedMemoryKind kind, int64_t regions, int64_t) {
                                if (kind == SharedMemoryKind::kCuda) cuda_regions = regions;
                              });
  const std::string handle(64, '\1');
  EXPECT_EQ(manager.RegisterCuda("c", handle, 1, 1024).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.RegisterCuda("c", "short", 0, 1024).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.RegisterCuda("c", handle, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  // Larger than the allocation behind the handle.
  EXPECT_EQ(manager.RegisterCuda("c", handle, 0, 4097).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mapper.closed, 1);
  mapper.closed = 0;
  ASSERT_TRUE(manager.RegisterCuda("c", handle, 0, 1024).ok());
  EXPECT_EQ(cuda_regions, 1);
  absl::StatusOr<SharedMemoryTensor> tensor = manager.Resolve("c", 256, 512, "inputs[0]");
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->memory, MemoryKind::kDevice);
  EXPECT_EQ(tensor->device, 0);
  EXPECT_EQ(tensor->data, mapper.memory + 256);
  // A CUDA tensor the kernels could not load with vector instructions.
  EXPECT_EQ(manager.Resolve("c", 4, 16, "inputs[0]").status().code(),
            absl::StatusCode::kInvalidArgument);
  tensor->lease.reset();
  // Unregister with no name: every region of the kind.
  EXPECT_TRUE(manager.Unregister(SharedMemoryKind::kCuda, "").ok());
  EXPECT_EQ(mapper.closed, 1);
  EXPECT_EQ(cuda_regions, 0);
}

TEST(SharedMemoryTest, TheModeTurnsKindsOff) {
  ShmObject object(4096);
  FakeMapper mapper;
  SharedMemoryManager off(SharedMemoryMode::kOff, &mapper);
  EXPECT_EQ(off.RegisterSystem("r", object.key(), 0, 16).code(),
            absl::StatusCode::kUnimplemented);
  SharedMemoryManager system(SharedMemoryMode::kSystem, &mapper);
  EXPECT_TRUE(system.RegisterSystem("r", object.key(), 0, 16).ok());
  EXPECT_EQ(system.RegisterCuda("c", std::string(64, '\0'), 0, 16).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace softmax::server
