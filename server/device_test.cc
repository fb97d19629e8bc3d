#include "server/device.h"

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

TEST(ParseDeviceSpecTest, NamesOneGpuSeveralOrAll) {
  absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec("cuda");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, DeviceSpec::Kind::kCuda);
  EXPECT_EQ(spec->indices, std::vector<int>{0});
  spec = ParseDeviceSpec("cuda:3");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->indices, std::vector<int>{3});
  spec = ParseDeviceSpec("cuda:0,2");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->indices, (std::vector<int>{0, 2}));
  spec = ParseDeviceSpec("cuda:all");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, DeviceSpec::Kind::kCuda);
  EXPECT_TRUE(spec->indices.empty());
  EXPECT_EQ(ParseDeviceSpec("auto")->kind, DeviceSpec::Kind::kAuto);
  EXPECT_EQ(ParseDeviceSpec("cpu")->kind, DeviceSpec::Kind::kCpu);
  EXPECT_EQ(ParseDeviceSpec("none")->kind, DeviceSpec::Kind::kNone);
}

TEST(ParseDeviceSpecTest, RejectsMalformedAndRepeatedIndices) {
  for (const char* text : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:0,", "cuda:0,0",
                           "cuda:1,2,1", "cuda:all,1", "CUDA:0"}) {
    absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(text);
    EXPECT_FALSE(spec.ok()) << text;
    if (!spec.ok()) {
      EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
      EXPECT_NE(spec.status().message().find("--device"), absl::string_view::npos);
    }
  }
}

TEST(CreateBackendsTest, CpuAndNoneNeedNoGpu) {
  BackendOptions options;
  options.cpu.threads = 2;
  absl::StatusOr<BackendChoice> cpu = CreateBackends(*ParseDeviceSpec("cpu"), options);
  ASSERT_TRUE(cpu.ok());
  ASSERT_EQ(cpu->backends.size(), 1u);
  EXPECT_EQ(cpu->backends[0]->Name(), "cpu");
  EXPECT_EQ(cpu->device, "cpu");
  absl::StatusOr<BackendChoice> none = CreateBackends(*ParseDeviceSpec("none"), options);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->backends.empty());
}

TEST(CreateBackendsTest, CudaWithoutAGpuIsAFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  BackendOptions options;
  for (const char* text : {"cuda", "cuda:all", "cuda:0,1"}) {
    absl::StatusOr<BackendChoice> choice = CreateBackends(*ParseDeviceSpec(text), options);
    EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition) << text;
  }
}

}  // namespace
}  // namespace softmax::server
