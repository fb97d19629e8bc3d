// cuda_backend_bench: the GPU round trip of a small batch, taken apart.
//
// A lone small request on the GPU backend pays for a chain of CUDA calls
// and, in the server, thread hand-offs. This program times each link on its
// own, from the floor up, so that the service benchmark's figures can be
// read against them:
//   event            an event recorded on an idle stream, polled until done
//   kernel 1x1       the smallest softmax launch (device memory), polled
//   kernel 1x1024    a 1 x 1024 float32 softmax in device memory
//   zero-copy 1x1024 the same kernel reading and writing pinned host memory
//                    (also with the thread asleep 200 us / 1 ms in between)
//   copies 1x1024    pinned -> device copy, kernel, device -> pinned copy
//   backend ...      CudaBackend::Execute on a slot, from this thread (as
//                    the scheduler's slot thread runs it), with the
//                    backend's settings varied: zero copy (the default) or
//                    DMA copies; a batch of 8 requests; and lone requests
//                    200 us apart, the GPU idle in between (as a lone caller
//                    of the server leaves it), the thread polling or asleep;
//                    and 8 x 4096 float16 requests (64 KiB), 1, 3 or 10 to
//                    a batch, with zero copy at any size or never.
//   scheduler ...    Batcher::Enqueue to the request's done callback, through
//                    the scheduler's slot threads (what a gRPC thread of the
//                    server sees), back to back and 200 us apart.
// Every variant's output is checked against the CPU reference first.
// Figures are microseconds per round trip over --iterations runs after a
// warm-up (p10 / p50 / p90 / mean); --json writes them.
//
// Usage: cuda_backend_bench [--iterations=2000] [--json=PATH]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "kernels/softmax_cuda.h"
#include "server/cuda/cuda_backend.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"

namespace softmax::server {
namespace {

using Clock = std::chrono::steady_clock;

struct Figures {
  std::string name;
  double p10 = 0, p50 = 0, p90 = 0, mean = 0;
};

Figures Summarise(const std::string& name, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Figures f;
  f.name = name;
  auto at = [&us](double q) { return us[static_cast<size_t>(q * (us.size() - 1))]; };
  f.p10 = at(0.1);
  f.p50 = at(0.5);
  f.p90 = at(0.9);
  for (double v : us) f.mean += v;
  f.mean /= static_cast<double>(us.size());
  return f;
}

bool Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "cuda_backend_bench: %s: %s\n", what, cudaGetErrorString(error));
  return false;
}

// Polls `event` until it completes (the backend's wait for a small batch).
void Spin(cudaEvent_t event) {
  while (cudaEventQuery(event) == cudaErrorNotReady) {
  }
}

// Times `once` (one round trip, returns when complete) `iterations` times
// after a tenth as many warm-up runs; with `sleep_us` > 0 the thread sleeps
// that long before each timed run, leaving the GPU idle in between.
Figures Time(const std::string& name, int iterations, const std::function<void()>& once,
             int sleep_us = 0) {
  for (int i = 0; i < std::max(10, iterations / 10); ++i) once();
  std::vector<double> us(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    const Clock::time_point start = Clock::now();
    once();
    us[static_cast<size_t>(i)] =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  return Summarise(name, std::move(us));
}

// Largest error of `output` (float32, n values) against the reference.
double MaxError(const std::vector<float>& input, const float* output) {
  const SoftmaxShape shape{1, static_cast<int64_t>(input.size()), 1};
  std::vector<double> ref(input.size());
  ReferenceSoftmax(input.data(), DType::kFloat32, shape, SoftmaxOptions(), ref.data());
  double worst = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(output[i]) - ref[i]) /
                                std::max(1e-30, std::fabs(ref[i])));
  }
  return worst;
}

int Run(int iterations, const std::string& json_path) {
  constexpr int kN = 1024;
  constexpr size_t kBytes = kN * sizeof(float);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> input(kN);
  for (float& x : input) x = normal(rng);
  const double tolerance = 10 * ReferenceRelativeTolerance(DType::kFloat32);

  if (!Check(cudaSetDevice(0), "cudaSetDevice")) return 2;
  gpu::LaunchPlan plan;
  if (!Check(gpu::LaunchPlan::Create(0, &plan), "LaunchPlan::Create")) return 2;
  cudaStream_t stream;
  cudaEvent_t event;
  void* buffers[4] = {};  // pinned in, pinned out, device in, device out
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
      !Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event") ||
      !Check(cudaHostAlloc(&buffers[0], kBytes, cudaHostAllocPortable), "cudaHostAlloc") ||
      !Check(cudaHostAlloc(&buffers[1], kBytes, cudaHostAllocPortable), "cudaHostAlloc") ||
      !Check(cudaMalloc(&buffers[2], kBytes), "cudaMalloc") ||
      !Check(cudaMalloc(&buffers[3], kBytes), "cudaMalloc")) {
    return 2;
  }
  float* const pinned_in = static_cast<float*>(buffers[0]);
  float* const pinned_out = static_cast<float*>(buffers[1]);
  float* const device_in = static_cast<float*>(buffers[2]);
  float* const device_out = static_cast<float*>(buffers[3]);
  std::memcpy(pinned_in, input.data(), kBytes);
  if (!Check(cudaMemcpy(device_in, input.data(), kBytes, cudaMemcpyHostToDevice), "copy")) {
    return 2;
  }
  auto segment = [](const void* in, void* out, int64_t n) {
    gpu::SoftmaxSegment s;
    s.input = in;
    s.output = out;
    s.outer = 1;
    s.n = n;
    s.inner = 1;
    return s;
  };
  auto launch = [&](const gpu::SoftmaxSegment& s) {
    return gpu::LaunchSoftmax(plan, DType::kFloat32, &s, 1, nullptr, 0, stream);
  };
  const gpu::SoftmaxSegment tiny = segment(device_in, device_out, 1);
  const gpu::SoftmaxSegment on_device = segment(device_in, device_out, kN);
  const gpu::SoftmaxSegment zero_copy = segment(pinned_in, pinned_out, kN);

  // Validate the raw paths first.
  bool ok = true;
  std::vector<float> check(kN);
  ok &= Check(launch(on_device), "launch") && Check(cudaStreamSynchronize(stream), "sync") &&
        Check(cudaMemcpy(check.data(), device_out, kBytes, cudaMemcpyDeviceToHost), "copy");
  const double error_device = MaxError(input, check.data());
  std::memset(pinned_out, 0xff, kBytes);
  ok &= Check(launch(zero_copy), "launch") && Check(cudaStreamSynchronize(stream), "sync");
  const double error_zero_copy = MaxError(input, pinned_out);
  if (!ok || !(error_device <= tolerance) || !(error_zero_copy <= tolerance)) {
    std::fprintf(stderr, "cuda_backend_bench: validation failed (device %g, zero copy %g)\n",
                 error_device, error_zero_copy);
    return 1;
  }

  std::vector<Figures> all;
  all.push_back(Time("event", iterations, [&] {
    cudaEventRecord(event, stream);
    Spin(event);
  }));
  all.push_back(Time("kernel 1x1", iterations, [&] {
    launch(tiny);
    cudaEventRecord(event, stream);
    Spin(event);
  }));
  all.push_back(Time("kernel 1x1024", iterations, [&] {
    launch(on_device);
    cudaEventRecord(event, stream);
    Spin(event);
  }));
  all.push_back(Time("zero-copy 1x1024", iterations, [&] {
    launch(zero_copy);
    cudaEventRecord(event, stream);
    Spin(event);
  }));
  // The same zero-copy round trip after the GPU and this thread sat idle,
  // as between the requests of a lone caller.
  all.push_back(Time("event, 200 us apart, asleep", iterations / 2,
                     [&] {
                       cudaEventRecord(event, stream);
                       Spin(event);
                     },
                     200));
  for (int sleep_us : {200, 1000}) {
    all.push_back(Time(absl::StrFormat("zero-copy 1x1024, %d us apart, asleep", sleep_us),
                       iterations / 2,
                       [&] {
                         launch(zero_copy);
                         cudaEventRecord(event, stream);
                         Spin(event);
                       },
                       sleep_us));
  }
  all.push_back(Time("copies 1x1024", iterations, [&] {
    cudaMemcpyAsync(device_in, pinned_in, kBytes, cudaMemcpyHostToDevice, stream);
    launch(on_device);
    cudaMemcpyAsync(pinned_out, device_out, kBytes, cudaMemcpyDeviceToHost, stream);
    cudaEventRecord(event, stream);
    Spin(event);
  }));

  // The backend, Execute on a slot from this thread, with its settings varied.
  // How the benchmark's thread spends the time between two round trips:
  // none (back to back), polling the clock, or asleep. A lone caller of the
  // server leaves the GPU idle for a gRPC round trip (some 200 us) between
  // requests, with the receiving thread asleep.
  enum class Gap { kNone, kSpin, kSleep };
  constexpr auto kGap = std::chrono::microseconds(200);
  auto wait_gap = [&](Gap gap) {
    if (gap == Gap::kSpin) {
      const Clock::time_point until = Clock::now() + kGap;
      while (Clock::now() < until) {
      }
    } else if (gap == Gap::kSleep) {
      std::this_thread::sleep_for(kGap);
    }
  };
  auto create = [](const CudaBackendOptions& options) -> std::unique_ptr<CudaBackend> {
    auto created = CudaBackend::Create(options, [](const absl::Status& status) {
      std::fprintf(stderr, "cuda_backend_bench: GPU fault: %s\n",
                   std::string(status.message()).c_str());
    });
    if (!created.ok()) {
      std::fprintf(stderr, "cuda_backend_bench: %s\n", created.status().ToString().c_str());
      return nullptr;
    }
    return std::move(*created);
  };
  struct Variant {
    const char* name;
    int64_t zero_copy_max_bytes;
    int requests;
    Gap gap = Gap::kNone;
  };
  const CudaBackendOptions defaults;
  const Variant variants[] = {
      {"backend 1x1024 (default)", defaults.zero_copy_max_bytes, 1},
      {"backend 1x1024, copies", 0, 1},
      {"backend 8 x 1x1024", defaults.zero_copy_max_bytes, 8},
      {"backend 8 x 1x1024, copies", 0, 8},
      {"backend 1x1024, 200 us apart, spinning", defaults.zero_copy_max_bytes, 1, Gap::kSpin},
      {"backend 1x1024, 200 us apart, asleep", defaults.zero_copy_max_bytes, 1, Gap::kSleep},
  };
  for (const Variant& v : variants) {
    CudaBackendOptions options;
    options.max_staging_bytes = 8 << 20;
    options.zero_copy_max_bytes = v.zero_copy_max_bytes;
    std::unique_ptr<CudaBackend> worker = create(options);
    if (worker == nullptr) return 2;
    worker->EnterSlotThread(0);
    std::vector<std::vector<float>> outputs(v.requests, std::vector<float>(kN));
    absl::Status status;
    auto once = [&] {
      Batch batch;
      for (int r = 0; r < v.requests; ++r) {
        Segment s;
        s.input = input.data();
        s.output = outputs[r].data();
        s.bytes = kBytes;
        s.dtype = DType::kFloat32;
        s.shape = {1, kN, 1};
        batch.segments.push_back(s);
        batch.rows += 1;
        batch.bytes += kBytes;
      }
      status = worker->Execute(0, batch).status;
    };
    once();
    for (int r = 0; r < v.requests; ++r) {
      const double error = MaxError(input, outputs[r].data());
      if (!status.ok() || !(error <= tolerance)) {
        std::fprintf(stderr, "cuda_backend_bench: %s: validation failed (%s, error %g)\n",
                     v.name, status.ToString().c_str(), error);
        return 1;
      }
    }
    for (int i = 0; i < std::max(10, iterations / 10); ++i) once();
    std::vector<double> us(static_cast<size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      wait_gap(v.gap);
      const Clock::time_point start = Clock::now();
      once();
      us[static_cast<size_t>(i)] =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
    all.push_back(Summarise(v.name, std::move(us)));
  }

  // Through the batcher and the scheduler, as the server runs a lone
  // request: Enqueue, a slot thread takes and runs the batch and answers it.
  for (const Gap gap : {Gap::kNone, Gap::kSleep}) {
    const char* name = gap == Gap::kNone ? "scheduler 1x1024 (default)"
                                         : "scheduler 1x1024, 200 us apart, asleep";
    CudaBackendOptions options;
    options.max_staging_bytes = 8 << 20;
    std::unique_ptr<CudaBackend> worker = create(options);
    if (worker == nullptr) return 2;
    Scheduler scheduler({worker.get()});
    BatcherOptions batcher_options;  // the server's defaults
    Batcher batcher(batcher_options, &scheduler);
    std::vector<float> output(kN);
    std::string output_bytes;
    std::atomic<bool> done{false};
    absl::Status status;
    Clock::time_point finished;
    auto once = [&] {
      auto item = std::make_unique<WorkItem>();
      item->segment.input = input.data();
      item->segment.bytes = kBytes;
      item->segment.dtype = DType::kFloat32;
      item->segment.shape = {1, kN, 1};
      item->output = &output_bytes;
      item->done = [&](const absl::Status& s, const RequestTiming&) {
        status = s;
        finished = Clock::now();
        done.store(true, std::memory_order_release);
      };
      done.store(false, std::memory_order_relaxed);
      const absl::Status admitted = batcher.Enqueue(std::move(item));
      if (!admitted.ok()) {
        status = admitted;
        return;
      }
      // The done callback's time is what counts, not this thread's wake-up.
      while (!done.load(std::memory_order_acquire)) {
      }
    };
    once();
    if (status.ok() && output_bytes.size() == kBytes) {
      std::memcpy(output.data(), output_bytes.data(), kBytes);
    }
    const double error = MaxError(input, output.data());
    if (!status.ok() || output_bytes.size() != kBytes || !(error <= tolerance)) {
      std::fprintf(stderr, "cuda_backend_bench: %s: validation failed (%s, error %g)\n", name,
                   status.ToString().c_str(), error);
      return 1;
    }
    for (int i = 0; i < std::max(10, iterations / 10); ++i) once();
    std::vector<double> us(static_cast<size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      wait_gap(gap);
      const Clock::time_point start = Clock::now();
      once();
      us[static_cast<size_t>(i)] =
          std::chrono::duration<double, std::micro>(finished - start).count();
    }
    batcher.Stop();
    all.push_back(Summarise(name, std::move(us)));
  }

  // Medium requests (8 x 4096 float16, 64 KiB each), alone and in batches of
  // 3 and 10, through the backend (Execute on a slot from this thread) with
  // zero copy up to any size or never: where the kernels reading and writing
  // pinned host memory over the bus beat the two DMA copies.
  {
    constexpr int64_t kRows = 8, kCols = 4096;
    const SoftmaxShape shape{kRows, kCols, 1};
    const int64_t bytes = kRows * kCols * ItemSize(DType::kFloat16);
    std::string medium(static_cast<size_t>(bytes), '\0');
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      StoreFromFloat(medium.data(), DType::kFloat16, i, normal(rng));
    }
    std::vector<double> reference(static_cast<size_t>(kRows * kCols));
    ReferenceSoftmax(medium.data(), DType::kFloat16, shape, SoftmaxOptions(), reference.data());
    for (const int requests : {1, 3, 10}) {
      for (const bool zero_copy : {true, false}) {
        CudaBackendOptions options;
        options.max_staging_bytes = 8 << 20;
        options.zero_copy_max_bytes = zero_copy ? options.max_staging_bytes : 0;
        std::unique_ptr<CudaBackend> worker = create(options);
        if (worker == nullptr) return 2;
        worker->EnterSlotThread(0);
        std::vector<std::string> outputs(requests, std::string(medium.size(), '\0'));
        absl::Status status;
        auto once = [&] {
          Batch batch;
          for (int r = 0; r < requests; ++r) {
            Segment seg;
            seg.input = medium.data();
            seg.output = outputs[r].data();
            seg.bytes = bytes;
            seg.dtype = DType::kFloat16;
            seg.shape = shape;
            batch.segments.push_back(seg);
            batch.rows += kRows;
            batch.bytes += bytes;
          }
          status = worker->Execute(0, batch).status;
        };
        once();
        for (int r = 0; r < requests; ++r) {
          for (int64_t i = 0; i < kRows * kCols; ++i) {
            const double got = LoadAsFloat(outputs[r].data(), DType::kFloat16, i);
            if (!status.ok() || !WithinReferenceTolerance(got, reference[i], DType::kFloat16)) {
              std::fprintf(stderr,
                           "cuda_backend_bench: 8x4096 fp16 x %d: validation failed (%s, "
                           "element %lld: %g against %g)\n",
                           requests, status.ToString().c_str(), static_cast<long long>(i), got,
                           reference[i]);
              return 1;
            }
          }
        }
        all.push_back(Time(absl::StrFormat("backend %d x 8x4096 fp16, %s", requests,
                                           zero_copy ? "zero copy" : "copies"),
                           iterations / 2, once));
      }
    }
  }

  cudaDeviceProp props;
  cudaGetDeviceProperties(&props, 0);
  std::printf("GPU round trips on %s, microseconds (%d iterations each)\n\n", props.name,
              iterations);
  std::printf("| what | p10 | p50 | p90 | mean |\n|---|---:|---:|---:|---:|\n");
  for (const Figures& f : all) {
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", f.name.c_str(), f.p10, f.p50, f.p90,
                f.mean);
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"device\": \"" << props.name << "\", \"iterations\": " << iterations
        << ", \"unit\": \"us\", \"figures\": [";
    for (size_t i = 0; i < all.size(); ++i) {
      const Figures& f = all[i];
      out << (i ? ", " : "")
          << absl::StrFormat(
                 "{\"name\": \"%s\", \"p10\": %.3f, \"p50\": %.3f, \"p90\": %.3f, \"mean\": %.3f}",
                 f.name, f.p10, f.p50, f.p90, f.mean);
    }
    out << "]}\n";
    if (!out) {
      std::fprintf(stderr, "cuda_backend_bench: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  return 0;
}

}  // namespace
}  // namespace softmax::server

int main(int argc, char** argv) {
  int iterations = 2000;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--iterations=", 0) == 0) {
      iterations = std::atoi(arg.c_str() + 13);
    } else if (arg.rfind("--json=", 0) == 0) {
      json = arg.substr(7);
    } else {
      std::fprintf(stderr, "usage: cuda_backend_bench [--iterations=2000] [--json=PATH]\n");
      return 2;
    }
  }
  if (iterations < 10) {
    std::fprintf(stderr, "cuda_backend_bench: --iterations must be at least 10\n");
    return 2;
  }
  return softmax::server::Run(iterations, json);
}
