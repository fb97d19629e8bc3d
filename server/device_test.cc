#include "server/device.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "server/testing/test_backends.h"

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

// A machine as CreateBackends sees it: what the CUDA runtime reports, how many
// GPU device nodes exist, and a GPU backend that starts (a FakeBackend named
// cuda:N) or fails with `start_error`.
GpuEnvironment FakeGpus(CudaDevices cuda, int device_nodes, bool have_cuda_backend = true,
                        absl::Status start_error = absl::OkStatus()) {
  GpuEnvironment gpus;
  gpus.query_cuda = [cuda] { return cuda; };
  gpus.device_nodes = [device_nodes] { return device_nodes; };
  gpus.have_cuda_backend = have_cuda_backend;
  gpus.create_cuda_backend =
      [start_error](int device,
                    const BackendOptions&) -> absl::StatusOr<std::unique_ptr<Backend>> {
    if (!start_error.ok()) return start_error;
    testing::FakeBackendOptions fake;
    fake.name = absl::StrCat("cuda:", device);
    return std::unique_ptr<Backend>(std::make_unique<testing::FakeBackend>(fake));
  };
  return gpus;
}

const CudaDevices kOneGpu{1, false, ""};
const CudaDevices kNoDevice{0, false, "no CUDA-capable device is detected"};
const CudaDevices kOldDriver{0, true,
                             "CUDA driver version is insufficient for CUDA runtime version"};

TEST(CreateBackendsTest, AutoTakesAUsableGpu) {
  absl::StatusOr<BackendChoice> choice =
      CreateBackends(*ParseDeviceSpec("auto"), BackendOptions(), FakeGpus(kOneGpu, 1));
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->device, "cuda:0");
  EXPECT_EQ(choice->unusable, GpuUnusableCause::kNone);
}

TEST(CreateBackendsTest, AutoWithoutAGpuServesOnTheCpuWithoutAWarning) {
  // No driver at all (the runtime then also blames the driver) and no device
  // node: nothing was found, so nothing is unusable.
  for (const CudaDevices& cuda : {kNoDevice, kOldDriver}) {
    absl::StatusOr<BackendChoice> choice =
        CreateBackends(*ParseDeviceSpec("auto"), BackendOptions(), FakeGpus(cuda, 0));
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, "cpu");
    EXPECT_EQ(choice->unusable, GpuUnusableCause::kNone) << cuda.detail;
    EXPECT_TRUE(choice->unusable_detail.empty());
    EXPECT_NE(choice->description.find(cuda.detail), std::string::npos);
  }
}

TEST(CreateBackendsTest, AutoNamesTheCauseWhenAGpuIsPresentButUnusable) {
  struct Case {
    GpuEnvironment gpus;
    GpuUnusableCause cause;
    std::string detail;  // a part of the warning
  };
  const Case cases[] = {
      {FakeGpus(kOldDriver, 2), GpuUnusableCause::kDriver, "insufficient"},
      {FakeGpus(kNoDevice, 1, /*have_cuda_backend=*/false), GpuUnusableCause::kNoCudaBackend,
       "no CUDA backend"},
      {FakeGpus(kOneGpu, 1, true, absl::InternalError("no kernel image is available")),
       GpuUnusableCause::kBackendStart, "no kernel image"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BackendChoice> choice =
        CreateBackends(*ParseDeviceSpec("auto"), BackendOptions(), c.gpus);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->device, "cpu");
    ASSERT_EQ(choice->backends.size(), 1u);
    EXPECT_EQ(choice->backends[0]->Name(), "cpu");
    EXPECT_EQ(choice->unusable, c.cause) << CauseName(c.cause);
    EXPECT_NE(choice->unusable_detail.find(c.detail), std::string::npos)
        << choice->unusable_detail;
  }
  EXPECT_EQ(CauseName(GpuUnusableCause::kDriver), "driver");
  EXPECT_EQ(CauseName(GpuUnusableCause::kNoCudaBackend), "no_cuda_backend");
  EXPECT_EQ(CauseName(GpuUnusableCause::kBackendStart), "backend_start");
}

// Several GPUs: their launch plans are compared at start; a GPU whose plan
// differs from the first's is named with its first differing line.
TEST(LaunchPlanDifferenceTest, NamesTheFirstGpuWhosePlanDiffers) {
  const std::string plan =
      "  kernel  paths  threads\n  staged<float32>  staged  256\n  flat<float32>  flat  64\n";
  std::string other = plan;
  other.replace(other.find("flat  64"), 8, "flat 128");
  std::vector<std::unique_ptr<Backend>> backends;
  for (const std::string* text : std::vector<const std::string*>{&plan, &plan, &other}) {
    testing::FakeBackendOptions fake;
    fake.name = absl::StrCat("cuda:", backends.size());
    auto backend = std::make_unique<testing::FakeBackend>(fake);
    DeviceInfo info;
    info.launch_plan = *text;
    backend->set_device(info);
    backends.push_back(std::move(backend));
  }
  EXPECT_EQ(LaunchPlanDifference({}), "");
  std::vector<std::unique_ptr<Backend>> alike;
  alike.push_back(std::move(backends[0]));
  alike.push_back(std::move(backends[1]));
  EXPECT_EQ(LaunchPlanDifference(alike), "");
  alike.push_back(std::move(backends[2]));
  EXPECT_EQ(LaunchPlanDifference(alike),
            "cuda:2's launch plan differs from cuda:0's: 'flat<float32>  flat 128' against "
            "'flat<float32>  flat  64'");
  // The fake GPUs of CreateBackends report no plan: alike.
  absl::StatusOr<BackendChoice> choice = CreateBackends(
      *ParseDeviceSpec("cuda:0,1"), BackendOptions(), FakeGpus(CudaDevices{2, false, ""}, 2));
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->plans_difference, "");
}

TEST(CreateBackendsTest, CudaFailsWithTheCauseWhereAutoWouldFallBack) {
  struct Case {
    GpuEnvironment gpus;
    absl::StatusCode code;
    std::string detail;
  };
  const Case cases[] = {
      {FakeGpus(kOldDriver, 2), absl::StatusCode::kFailedPrecondition, "insufficient"},
      {FakeGpus(kNoDevice, 0), absl::StatusCode::kFailedPrecondition, "no CUDA-capable"},
      {FakeGpus(kOneGpu, 1, false), absl::StatusCode::kFailedPrecondition, "no CUDA backend"},
      {FakeGpus(kOneGpu, 1, true, absl::InternalError("no kernel image is available")),
       absl::StatusCode::kInternal, "no kernel image"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BackendChoice> choice =
        CreateBackends(*ParseDeviceSpec("cuda"), BackendOptions(), c.gpus);
    ASSERT_FALSE(choice.ok()) << c.detail;
    EXPECT_EQ(choice.status().code(), c.code) << choice.status();
    EXPECT_NE(choice.status().message().find(c.detail), absl::string_view::npos)
        << choice.status();
  }
}

TEST(WarmUpTest, PassesOnABackendThatComputesRight) {
  CpuBackend cpu(CpuBackendOptions{});
  EXPECT_TRUE(WarmUp(cpu).ok());
}

TEST(WarmUpTest, FailsNamingTheBackendWhenItAnswersWrongOrFails) {
  // Copies its input: a "softmax" that a readiness check must not pass.
  testing::FakeBackendOptions copier_options;
  copier_options.name = "copier";
  testing::FakeBackend copies(copier_options);
  absl::Status status = WarmUp(copies);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("copier"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("softmax element"), absl::string_view::npos) << status;

  testing::FakeBackendOptions failing_options;
  failing_options.name = "faulted";
  failing_options.compute = [](int, Batch&, BatchResult& result) {
    result.status = absl::InternalError("illegal address");
  };
  testing::FakeBackend failing(failing_options);
  status = WarmUp(failing);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("illegal address"), absl::string_view::npos) << status;
  // The warm-up ran on a slot it entered first (the backend checks).
  EXPECT_EQ(failing.violations(), 0);
}

TEST(NvidiaDeviceNodesTest, CountsOnlyNumberedNodes) {
  // Whatever this machine has: at least GPU 0's node where it exists, and
  // never nvidiactl or nvidia-uvm (present on any host with the driver).
  const int nodes = NvidiaDeviceNodes();
  EXPECT_GE(nodes, 0);
  if (access("/dev/nvidia0", F_OK) == 0) {
    EXPECT_GE(nodes, 1);
  }
  if (access("/dev/nvidiactl", F_OK) == 0 && access("/dev/nvidia0", F_OK) != 0 &&
      access("/dev/nvidia1", F_OK) != 0) {
    EXPECT_EQ(nodes, 0);
  }
}

}  // namespace
}  // namespace softmax::server
