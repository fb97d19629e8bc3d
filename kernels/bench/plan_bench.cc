// The host cost of planning a launch: what the GPU backend spends on the CPU
// per batch before the first kernel starts (SoftmaxScratchBytes, then
// PlanSchedule inside LaunchSoftmax), on the H200's recorded launch plan, so
// that it runs without a GPU. Each case is validated first (the schedule
// plans, its scratch fits what SoftmaxScratchBytes asked for, its launches
// write every row once), then timed: the median over 7 runs of the mean over enough
// repetitions to fill 50 ms.
//
//   build/bin/plan_bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/plan.h"
#include "kernels/dtype.h"
#include "kernels/recorded_plan.h"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

struct Case {
  std::string name;
  std::vector<SoftmaxSegment> segments;
};

// `count` segments of [outer, n] with outer and n drawn from the ranges;
// `multiple` rounds n up (8: every row 16-byte aligned in every dtype). The
// pointers are distinct addresses that are never dereferenced.
Case Ragged(const std::string& name, int count, int max_outer, int64_t min_n, int64_t max_n,
            int64_t multiple, unsigned seed) {
  std::mt19937 rng(seed);
  Case c{name, {}};
  uintptr_t next = uintptr_t{1} << 40;
  for (int i = 0; i < count; ++i) {
    SoftmaxSegment s;
    s.outer = 1 + static_cast<int64_t>(rng() % max_outer);
    s.n = min_n + static_cast<int64_t>(rng() % (max_n - min_n + 1));
    s.n = (s.n + multiple - 1) / multiple * multiple;
    s.input = reinterpret_cast<const void*>(next);
    next += uintptr_t{1} << 28;
    s.output = reinterpret_cast<void*>(next);
    next += uintptr_t{1} << 28;
    c.segments.push_back(s);
  }
  return c;
}

// Rows the schedule's launches write (last-axis segments only): each row
// once, by the one launch that writes it.
long long RowsWritten(const Schedule& schedule) {
  long long rows = 0;
  for (const LaunchStep& step : schedule.steps) {
    switch (step.kernel) {
      case SoftmaxKernel::kFlat: rows += step.flat.rows; break;
      case SoftmaxKernel::kFlatTable:
      case SoftmaxKernel::kRowStaged:
      case SoftmaxKernel::kOnChip:
      case SoftmaxKernel::kStaged:
        for (const RowSegment& r : step.table) rows += r.rows;
        break;
      case SoftmaxKernel::kSplitStaged:
      case SoftmaxKernel::kSplitFused:
      case SoftmaxKernel::kSplitNormalize:
      case SoftmaxKernel::kSplitNormalizeUnits: rows += step.split.rows; break;
      default: break;
    }
  }
  return rows;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Run() {
  LaunchPlan plan;
  if (!ReadRecordedPlan("h200_plan.txt", &plan)) {
    std::fprintf(stderr, "cannot read the recorded plan kernels/testdata/h200_plan.txt\n");
    return 1;
  }
  const std::vector<Case> cases = {
      Ragged("1 x [1, 1024]", 1, 1, 1024, 1024, 1, 1),
      Ragged("256 x [1, 16..4096]", 256, 1, 16, 4096, 1, 2),
      Ragged("64 x [1..63, 16..20000]", 64, 63, 16, 20000, 1, 3),
      Ragged("64 x [1..63, 16..20000], aligned", 64, 63, 16, 20000, 8, 3),
      Ragged("64 x [1..63, 16..65536], aligned", 64, 63, 16, 65536, 8, 4),
  };
  std::printf("%-36s %-9s %6s  %-36s %10s\n", "batch", "dtype", "steps", "kernels", "us/batch");
  for (const Case& c : cases) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const SoftmaxSegment* segs = c.segments.data();
      const int count = static_cast<int>(c.segments.size());
      Schedule schedule;
      if (PlanSchedule(plan, dtype, segs, count, true, &schedule) != cudaSuccess) {
        std::fprintf(stderr, "INVALID %s %s: not planned\n", c.name.c_str(), DTypeName(dtype));
        return 1;
      }
      const size_t scratch = SoftmaxScratchBytes(plan, dtype, segs, count);
      long long rows = 0;
      for (const SoftmaxSegment& s : c.segments) rows += s.outer;
      if (schedule.scratch_bytes > scratch || RowsWritten(schedule) != rows) {
        std::fprintf(stderr, "INVALID %s %s: scratch %zu > %zu, rows %lld of %lld\n",
                     c.name.c_str(), DTypeName(dtype), schedule.scratch_bytes, scratch,
                     RowsWritten(schedule), rows);
        return 1;
      }
      // What the backend does per batch: size the scratch, then plan.
      auto batch = [&]() {
        Schedule s;
        const size_t bytes = SoftmaxScratchBytes(plan, dtype, segs, count);
        PlanSchedule(plan, dtype, segs, count, true, &s);
        return bytes + s.steps.size();
      };
      int reps = 1;
      size_t sink = 0;
      for (;;) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) sink += batch();
        if (Seconds(t0, std::chrono::steady_clock::now()) > 0.05) break;
        reps *= 2;
      }
      std::vector<double> us;
      for (int run = 0; run < 7; ++run) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) sink += batch();
        us.push_back(Seconds(t0, std::chrono::steady_clock::now()) * 1e6 / reps);
      }
      std::sort(us.begin(), us.end());
      std::printf("%-36s %-9s %6zu  %-36s %10.2f\n", c.name.c_str(), DTypeName(dtype),
                  schedule.steps.size(), schedule.Kernels().c_str(), us[us.size() / 2]);
      if (sink == 0) std::printf("(no work)\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace detail
}  // namespace gpu
}  // namespace softmax

int main() { return softmax::gpu::detail::Run(); }
