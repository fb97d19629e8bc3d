// GPU tests of the CUDA softmax kernels against the float64 CPU reference.
// Without a CUDA device every test skips with the reason.
//
// Every check: fresh random normal inputs, outputs poisoned (0x7B bytes: a
// large finite value in every dtype) before each of two launches on the same
// scratch, every element compared with
//   |y - ref| <= 1e-6 + rtol * |ref|,  rtol 1e-5 / 2e-3 / 1.6e-2,
// NaN where the reference is NaN, and equal infinities.
#include "kernels/softmax_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_softmax.h"
#include "kernels/cuda_testing.h"
#include "kernels/dtype.h"
#include "kernels/kernel_testing.h"

namespace softmax {
namespace gpu {
namespace {

double Rtol(DType dtype) { return ReferenceRelativeTolerance(dtype); }

// One problem of a launch: shape, options and the input's host bytes.
struct Problem {
  SoftmaxShape shape;
  SoftmaxOptions options;
  std::vector<uint8_t> input;
  size_t input_offset_elements = 0;   // extra misalignment on the device
  size_t output_offset_elements = 0;
};

// Random normal values (sigma) rounded to `dtype`.
std::vector<uint8_t> RandomInput(DType dtype, int64_t count, std::mt19937_64& rng,
                                 float sigma = 1.0f) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * ItemSize(dtype));
  std::normal_distribution<float> normal(0.0f, sigma);
  for (int64_t i = 0; i < count; ++i) StoreFromFloat(bytes.data(), dtype, i, normal(rng));
  return bytes;
}

Problem MakeProblem(DType dtype, int64_t outer, int64_t n, int64_t inner, std::mt19937_64& rng,
                    float temperature = 1.0f, bool log = false, float sigma = 1.0f) {
  Problem p;
  p.shape = SoftmaxShape{outer, n, inner};
  p.options.temperature = temperature;
  p.options.log = log;
  p.input = RandomInput(dtype, p.shape.elements(), rng, sigma);
  return p;
}

// The last-axis segments of `problems` as the planner sees them (no buffers):
// an input offset makes the rows unaligned.
std::vector<SoftmaxSegment> Described(const std::vector<Problem>& problems) {
  std::vector<SoftmaxSegment> described(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    described[i].outer = problems[i].shape.outer;
    described[i].n = problems[i].shape.n;
    if (problems[i].input_offset_elements > 0) {
      described[i].input = reinterpret_cast<const void*>(uintptr_t{2});
    }
  }
  return described;
}

class SoftmaxCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveCudaDevice("no device", &skip_reason_)) return;
    plan_ = new LaunchPlan();
    const cudaError_t created = LaunchPlan::Create(0, plan_);
    if (created != cudaSuccess) {
      skip_reason_ = std::string("LaunchPlan::Create failed: ") + cudaGetErrorString(created);
      delete plan_;
      plan_ = nullptr;
      create_failed_ = true;
      return;
    }
    std::printf("%s", plan_->ToString().c_str());
  }
  static void TearDownTestSuite() {
    delete plan_;
    plan_ = nullptr;
  }
  void SetUp() override {
    ASSERT_FALSE(create_failed_) << skip_reason_;
    if (plan_ == nullptr) GTEST_SKIP() << "no CUDA device (" << skip_reason_ << "): GPU tests skipped";
  }

  // Runs all problems as one LaunchSoftmax call (twice, re-poisoning), and
  // checks every element of every problem against the float64 reference.
  // One launch of `rows` x `n` with output == input, which must take `path`,
  // checked against the reference.
  void CheckInPlace(DType dtype, int64_t rows, int64_t n, SoftmaxPath path, std::mt19937_64& rng,
                    const std::string& label) {
    Problem p = MakeProblem(dtype, rows, n, 1, rng);
    std::vector<double> ref(static_cast<size_t>(p.shape.elements()));
    ReferenceSoftmax(p.input.data(), dtype, p.shape, p.options, ref.data());
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, p.input.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, p.input.data(), p.input.size(), cudaMemcpyHostToDevice), cudaSuccess);
    SoftmaxSegment s;
    s.input = d;
    s.output = d;
    s.outer = p.shape.outer;
    s.n = n;
    ASSERT_EQ(ChoosePath(*plan_, dtype, s), path) << label;
    const size_t scratch_bytes = SoftmaxScratchBytes(*plan_, dtype, &s, 1);
    void* scratch = nullptr;
    if (scratch_bytes > 0) {
      ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
    }
    ASSERT_EQ(LaunchSoftmax(*plan_, dtype, &s, 1, scratch, scratch_bytes, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> host(p.input.size());
    ASSERT_EQ(cudaMemcpy(host.data(), d, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d);
    cudaFree(scratch);
    int64_t bad = 0;
    for (int64_t e = 0; e < p.shape.elements(); ++e) {
      const double y = LoadAsFloat(host.data(), dtype, e);
      if (!(std::fabs(y - ref[e]) <= 1e-6 + Rtol(dtype) * std::fabs(ref[e]))) ++bad;
    }
    EXPECT_EQ(bad, 0) << label << " " << DTypeName(dtype);
  }

  // The kernels (LaunchKernels) and the schedule a launch of these problems
  // plans, and how many of its launches are marked `overlaps`.
  size_t OverlappingLaunches(DType dtype, const std::vector<Problem>& problems,
                             std::string* kernels, std::string* schedule) {
    std::vector<SoftmaxSegment> described(problems.size());
    for (size_t i = 0; i < problems.size(); ++i) {
      described[i].outer = problems[i].shape.outer;
      described[i].n = problems[i].shape.n;
      described[i].inner = problems[i].shape.inner;
    }
    const int count = static_cast<int>(described.size());
    *kernels = LaunchKernels(*plan_, dtype, described.data(), count);
    *schedule = LaunchSchedule(*plan_, dtype, described.data(), count);
    size_t overlapping = 0;
    for (size_t at = schedule->find("overlaps"); at != std::string::npos;
         at = schedule->find("overlaps", at + 1)) {
      ++overlapping;
    }
    return overlapping;
  }

  // `allow_flat` false keeps a one-segment launch on the on-chip kernel.
  // With `stream`, the poisoning, the launch and the copy back are queued on
  // it with no synchronization between them (into pinned memory): the copy
  // must see every launch's output.
  void RunAndCheck(DType dtype, std::vector<Problem>& problems, const std::string& label,
                   bool allow_flat = true, cudaStream_t stream = nullptr) {
    const size_t item = ItemSize(dtype);
    std::vector<size_t> in_offsets, out_offsets;
    size_t in_total = 0, out_total = 0;
    for (const Problem& p : problems) {
      in_total = (in_total + 255) / 256 * 256 + p.input_offset_elements * item;
      in_offsets.push_back(in_total);
      in_total += p.input.size();
      out_total = (out_total + 255) / 256 * 256 + p.output_offset_elements * item;
      out_offsets.push_back(out_total);
      out_total += p.input.size();
    }
    char* d_in = nullptr;
    char* d_out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_in), std::max<size_t>(in_total, 1)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), std::max<size_t>(out_total, 1)), cudaSuccess);
    std::vector<SoftmaxSegment> segments;
    for (size_t i = 0; i < problems.size(); ++i) {
      const Problem& p = problems[i];
      ASSERT_EQ(cudaMemcpy(d_in + in_offsets[i], p.input.data(), p.input.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      SoftmaxSegment s;
      s.input = d_in + in_offsets[i];
      s.output = d_out + out_offsets[i];
      s.outer = p.shape.outer;
      s.n = p.shape.n;
      s.inner = p.shape.inner;
      s.temperature = p.options.temperature;
      s.log = p.options.log;
      segments.push_back(s);
    }
    const size_t scratch_bytes =
        SoftmaxScratchBytes(*plan_, dtype, segments.data(), static_cast<int>(segments.size()));
    void* scratch = nullptr;
    if (scratch_bytes > 0) {
      ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
      // Garbage before the first launch too: the launch must not rely on zeroed scratch.
      ASSERT_EQ(cudaMemset(scratch, 0x7B, scratch_bytes), cudaSuccess);
    }

    std::vector<std::vector<double>> refs(problems.size());
    for (size_t i = 0; i < problems.size(); ++i) {
      refs[i].resize(static_cast<size_t>(problems[i].shape.elements()));
      ReferenceSoftmax(problems[i].input.data(), dtype, problems[i].shape, problems[i].options,
                       refs[i].data());
    }
    const double rtol = Rtol(dtype);
    uint8_t* pinned = nullptr;
    if (stream != nullptr) {
      ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), std::max<size_t>(out_total, 1)),
                cudaSuccess);
    }
    for (int run = 0; run < 2; ++run) {
      std::vector<uint8_t> copied(stream == nullptr ? out_total : 0);
      uint8_t* host = stream == nullptr ? copied.data() : pinned;
      ASSERT_EQ(cudaMemsetAsync(d_out, 0x7B, std::max<size_t>(out_total, 1), stream), cudaSuccess);
      ASSERT_EQ(LaunchSoftmax(*plan_, dtype, segments.data(), static_cast<int>(segments.size()),
                              scratch, scratch_bytes, stream, allow_flat),
                cudaSuccess);
      if (stream == nullptr) {
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(host, d_out, out_total, cudaMemcpyDeviceToHost), cudaSuccess);
      } else {
        ASSERT_EQ(cudaMemcpyAsync(host, d_out, out_total, cudaMemcpyDeviceToHost, stream),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
      for (size_t i = 0; i < problems.size(); ++i) {
        const Problem& p = problems[i];
        const void* y = host + out_offsets[i];
        int64_t bad = 0;
        std::ostringstream first;
        for (int64_t e = 0; e < p.shape.elements(); ++e) {
          const double r = refs[i][e];
          const double v = LoadAsFloat(y, dtype, e);
          bool ok;
          if (std::isnan(r)) {
            ok = std::isnan(v);
          } else if (std::isinf(r)) {
            ok = v == r;
          } else {
            ok = std::fabs(v - r) <= 1e-6 + rtol * std::fabs(r);
          }
          if (!ok && bad++ < 5) {
            first << " [" << e << "] got " << v << " want " << r << " (x="
                  << LoadAsFloat(p.input.data(), dtype, e) << ")";
          }
        }
        EXPECT_EQ(bad, 0) << label << " " << DTypeName(dtype) << " run " << run << " problem " << i
                          << " shape [" << p.shape.outer << "," << p.shape.n << ","
                          << p.shape.inner << "] T=" << p.options.temperature
                          << " log=" << p.options.log << " path "
                          << SoftmaxPathName(ChoosePath(*plan_, dtype, segments[i])) << ":"
                          << first.str();
      }
      // Nothing outside the outputs is written: the bytes between them (padding
      // and element offsets) keep the fill.
      size_t cursor = 0;
      int64_t written_outside = 0;
      for (size_t i = 0; i < problems.size(); ++i) {
        for (size_t b = cursor; b < out_offsets[i]; ++b) written_outside += host[b] != 0x7B;
        cursor = out_offsets[i] + problems[i].input.size();
      }
      EXPECT_EQ(written_outside, 0) << label << " " << DTypeName(dtype) << " run " << run;
    }
    cudaFreeHost(pinned);
    cudaFree(scratch);
    cudaFree(d_in);
    cudaFree(d_out);
  }

  static LaunchPlan* plan_;
  static std::string skip_reason_;
  static bool create_failed_;
};

LaunchPlan* SoftmaxCudaTest::plan_ = nullptr;
std::string SoftmaxCudaTest::skip_reason_;
bool SoftmaxCudaTest::create_failed_ = false;

// Row lengths that land in each path, for a dtype: a few inside each class.
// Lengths meant for the register paths beyond 1024 vectors and the split
// path are odd (not a whole number of 16-byte vectors), so that the staged
// path, which takes 16-byte rows from 1025 vectors, does not take them.
std::vector<std::pair<SoftmaxPath, int64_t>> LengthsPerPath(const LaunchPlan& plan, DType dtype) {
  const int64_t v = VecWidth(dtype);
  const int64_t warp = PathMaxLength(plan, dtype, SoftmaxPath::kWarpRows);
  const int64_t block = PathMaxLength(plan, dtype, SoftmaxPath::kBlockRows);
  const int64_t cluster = PathMaxLength(plan, dtype, SoftmaxPath::kClusterRows);
  const int64_t staged = PathMaxLength(plan, dtype, SoftmaxPath::kStagedRows);
  std::vector<std::pair<SoftmaxPath, int64_t>> out = {
      {SoftmaxPath::kWarpRows, 1},          {SoftmaxPath::kWarpRows, 3},
      {SoftmaxPath::kWarpRows, v},          {SoftmaxPath::kWarpRows, 32},
      {SoftmaxPath::kWarpRows, 100},        {SoftmaxPath::kWarpRows, 1000},
      {SoftmaxPath::kWarpRows, warp},       {SoftmaxPath::kBlockRows, warp + 1},
      {SoftmaxPath::kBlockRows, 700 * v},   {SoftmaxPath::kBlockRows, block - 1},
  };
  if (cluster > block) {
    out.push_back({SoftmaxPath::kClusterRows, block + 1});
    out.push_back({SoftmaxPath::kClusterRows, ((block + cluster) / 3) | 1});
    out.push_back({SoftmaxPath::kClusterRows, cluster - 1});
  }
  if (staged > 0) {
    out.push_back({SoftmaxPath::kStagedRows, 8193 * v});
    out.push_back({SoftmaxPath::kStagedRows, 30001 * v});
    out.push_back({SoftmaxPath::kStagedRows, staged});
  }
  const int64_t split_from = std::max({block, cluster, staged});
  out.push_back({SoftmaxPath::kSplitRows, (split_from + 1) | 1});
  out.push_back({SoftmaxPath::kSplitRows, split_from * 3 + 5});
  if (staged > 0) out.push_back({SoftmaxPath::kSplitRows, staged + v});  // aligned, too long to stage
  return out;
}

int64_t RowsFor(int64_t n, int64_t budget = 1 << 20) {
  return std::max<int64_t>(1, std::min<int64_t>(67, budget / n));
}

TEST_F(SoftmaxCudaTest, PlanDescribesEveryKernel) {
  const std::string text = plan_->ToString();
  for (DType dtype : kAllDTypes) {
    for (const char* family : {"on_chip", "flat_table", "row_staged", "flat.t64", "flat.t512",
                               "split_fused", "split_stats", "split_normalize_units", "strided_stats",
                               "strided_normalize"}) {
      const KernelProbe* probe = plan_->Find(family, dtype);
      ASSERT_NE(probe, nullptr) << family << " " << DTypeName(dtype);
      EXPECT_GT(probe->registers_per_thread, 0);
      EXPECT_GE(probe->blocks_per_sm, 1) << probe->kernel;
      EXPECT_GE(probe->grid, plan_->multiprocessors());
      EXPECT_NE(text.find(probe->kernel), std::string::npos);
    }
    if (plan_->max_cluster_size() > 1) {
      const KernelProbe* cluster = plan_->Find("on_chip", dtype, plan_->max_cluster_size());
      ASSERT_NE(cluster, nullptr);
      EXPECT_GE(cluster->max_active_clusters, 1);
      EXPECT_EQ(cluster->grid % cluster->cluster_size, 0);
      const KernelProbe* staged = plan_->Find("staged", dtype, 2);
      ASSERT_NE(staged, nullptr);
      EXPECT_GE(staged->max_active_clusters, 1);
      EXPECT_EQ(staged->local_bytes_per_thread, 0);
      const KernelProbe* split_staged = plan_->Find("split_staged", dtype);
      ASSERT_NE(split_staged, nullptr);
      EXPECT_GE(split_staged->blocks_per_sm, 1);
      EXPECT_EQ(split_staged->local_bytes_per_thread, 0);
    }
    EXPECT_EQ(plan_->Find("on_chip", dtype)->local_bytes_per_thread, 0);
  }
}

TEST_F(SoftmaxCudaTest, EveryPathDTypeAndOp) {
  std::mt19937_64 rng(1);
  for (DType dtype : kAllDTypes) {
    for (bool log : {false, true}) {
      for (const auto& [path, n] : LengthsPerPath(*plan_, dtype)) {
        Problem p = MakeProblem(dtype, RowsFor(n), n, 1, rng, log ? 0.7f : 1.0f, log);
        SoftmaxSegment s;
        s.n = n;
        EXPECT_EQ(ChoosePath(*plan_, dtype, s), path) << "n=" << n;
        // One launch per problem: each path on its own (the flat kernel
        // takes one-segment launches of short rows; FlatKernel tests it).
        std::vector<Problem> one;
        one.push_back(std::move(p));
        RunAndCheck(dtype, one, std::string("path ") + SoftmaxPathName(path), false);
      }
    }
  }
}

TEST_F(SoftmaxCudaTest, ClassBoundariesPlusMinusOne) {
  std::mt19937_64 rng(2);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    // Lane-group sizes of the warp path, the three path limits, and the
    // cluster sizes in between.
    std::vector<int64_t> bases = {v, 2 * v, 32 * v, 64 * v};
    for (SoftmaxPath path :
         {SoftmaxPath::kWarpRows, SoftmaxPath::kBlockRows, SoftmaxPath::kClusterRows,
          SoftmaxPath::kStagedRows}) {
      const int64_t limit = PathMaxLength(*plan_, dtype, path);
      if (limit > 0) bases.push_back(limit);
    }
    const int64_t block = PathMaxLength(*plan_, dtype, SoftmaxPath::kBlockRows);
    const int64_t cluster = PathMaxLength(*plan_, dtype, SoftmaxPath::kClusterRows);
    for (int64_t b = 2 * block; b < cluster; b *= 2) bases.push_back(b);
    std::vector<int64_t> lengths;
    for (int64_t b : bases) {
      for (int64_t d : {-1, 0, 1}) lengths.push_back(b + d);
    }
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      for (int64_t n : lengths) {
        problems.push_back(MakeProblem(dtype, RowsFor(n, 1 << 19), n, 1, rng, 1.3f, log));
      }
      RunAndCheck(dtype, problems, "boundaries");
    }
  }
}

TEST_F(SoftmaxCudaTest, MisalignedPointersAndOddLengths) {
  std::mt19937_64 rng(3);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    std::vector<Problem> problems;
    for (int64_t n : {8 * v, 300 * v, 3000 * v, 7 * v + 3, int64_t{100003}}) {
      Problem p = MakeProblem(dtype, RowsFor(n, 1 << 18), n, 1, rng);
      p.input_offset_elements = 1;
      p.output_offset_elements = 3;
      problems.push_back(std::move(p));
      Problem q = MakeProblem(dtype, RowsFor(n, 1 << 18), n, 1, rng, 2.0f, true);
      q.output_offset_elements = 1;
      problems.push_back(std::move(q));
    }
    Problem s = MakeProblem(dtype, 5, 301, 7, rng, 0.5f);
    s.input_offset_elements = 1;
    problems.push_back(std::move(s));
    RunAndCheck(dtype, problems, "misaligned");
  }
}

// Rows at every element offset in and out (16-bit types: every 2-byte
// position in a 16-byte granule), through each kernel that reads and writes
// unaligned rows a vector at a time: values right, nothing written outside
// the outputs (RunAndCheck), the kernel the one meant.
TEST_F(SoftmaxCudaTest, EveryElementOffsetOfUnalignedRows) {
  std::mt19937_64 rng(21);
  struct Case {
    SoftmaxShape shape;  // n in vectors, plus one element
    const char* kernels;
    bool every_offset;
  };
  const Case cases[] = {
      {{37, 250, 1}, "flat", true},
      {{3, 12000, 1}, "row_staged", true},  // a share of up to 220 KiB
      {{5, 14500, 1}, "on_chip", true},
      {{2, 25000, 1}, "split_fused", true},
      {{1, 900000, 1}, "split_stats,split_normalize_units", false},
  };
  for (DType dtype : kAllDTypes) {
    const int v = VecWidth(dtype);
    std::vector<Case> shaped;
    for (const Case& c : cases) {
      shaped.push_back({{c.shape.outer, c.shape.n * v + 1, 1}, c.kernels, c.every_offset});
    }
    shaped.push_back({{3, 300, 301}, "strided_stats,strided_normalize", true});
    for (const Case& c : shaped) {
      for (int offset = 0; offset < v; ++offset) {
        if (!c.every_offset && offset % 3 != 1) continue;
        std::vector<Problem> one;
        one.push_back(MakeProblem(dtype, c.shape.outer, c.shape.n, c.shape.inner, rng, 1.0f,
                                  offset % 2 == 1));
        one.back().input_offset_elements = static_cast<size_t>(offset);
        one.back().output_offset_elements = static_cast<size_t>((offset * 3 + 1) % v);
        std::string kernels, schedule;
        OverlappingLaunches(dtype, one, &kernels, &schedule);
        // LaunchKernels there sees aligned pointers; the odd lengths decide.
        EXPECT_EQ(kernels, c.kernels) << DTypeName(dtype) << "\n" << schedule;
        RunAndCheck(dtype, one, "offset " + std::to_string(offset) + " " + c.kernels);
      }
    }
  }
}

// Sets whole rows (row = o*inner + i of a [outer, n, inner] tensor).
void SetRow(Problem& p, DType dtype, int64_t row, const std::function<float(int64_t)>& value) {
  const int64_t o = row / p.shape.inner, i = row % p.shape.inner;
  for (int64_t k = 0; k < p.shape.n; ++k) {
    StoreFromFloat(p.input.data(), dtype, (o * p.shape.n + k) * p.shape.inner + i, value(k));
  }
}

// Rows 0..3 of `p` (one row each) as a split or staged row must survive
// them: the first half -inf, a NaN last, +inf at element 3, all -inf.
void SetSpecialRows(Problem& p, DType dtype) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = p.shape.n;
  SetRow(p, dtype, 0, [&](int64_t k) { return k < n / 2 ? -inf : 0.001f * (k % 1000); });
  SetRow(p, dtype, 1, [&](int64_t k) { return k == n - 1 ? nan : 0.5f; });
  SetRow(p, dtype, 2, [&](int64_t k) { return k == 3 ? inf : 1.0f; });
  SetRow(p, dtype, 3, [&](int64_t) { return -inf; });
}

TEST_F(SoftmaxCudaTest, SpecialValues) {
  std::mt19937_64 rng(4);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    const float big = dtype == DType::kFloat16 ? 3.0e4f : 1.0e4f;
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      std::vector<std::pair<int64_t, int64_t>> shapes = {
          {1, 5}, {1, 100}, {1, 1000 * v}, {1, 9000 * v}, {1, 80000 * v}};
      for (int64_t inner : {int64_t{1}, int64_t{3}, int64_t{64}}) {
        for (int64_t n : {int64_t{7}, 40 * v, 3000 * v, 6000 * v}) {
          if (inner > 1 && n > 10000) continue;
          Problem p = MakeProblem(dtype, 6, n, inner, rng, 1.0f, log);
          const int64_t rows = p.shape.rows();
          SetRow(p, dtype, 0, [&](int64_t) { return -inf; });                    // all -inf
          SetRow(p, dtype, 1 % rows, [&](int64_t k) { return k == n / 2 ? nan : 0.5f; });
          SetRow(p, dtype, 2 % rows, [&](int64_t k) { return k == n - 1 ? inf : 1.0f; });
          SetRow(p, dtype, 3 % rows, [&](int64_t k) { return k % 3 == 0 ? -inf : 0.25f * k; });
          std::normal_distribution<float> normal(0.0f, big / 4);
          SetRow(p, dtype, 4 % rows, [&](int64_t) {
            return std::max(-big, std::min(big, normal(rng)));
          });
          SetRow(p, dtype, (rows - 1), [&](int64_t k) { return k == 0 ? big : -big; });
          problems.push_back(std::move(p));
        }
      }
      // The staged path (whole-vector rows of more than 8192 vectors, split
      // over a cluster): a row whose first blocks hold only -inf, NaN or +inf
      // in one block's share, an all -inf row.
      {
        Problem p = MakeProblem(dtype, 4, 20000 * v, 1, rng, 1.0f, log);
        SetSpecialRows(p, dtype);
        problems.push_back(std::move(p));
      }
      // Huge-magnitude row through every last-axis class, temperature < 1.
      for (auto [outer, n] : shapes) {
        Problem p = MakeProblem(dtype, outer, n, 1, rng, log ? 2.0f : 0.25f, log, big / 8);
        problems.push_back(std::move(p));
      }
      RunAndCheck(dtype, problems, "special");
    }
  }
}

TEST_F(SoftmaxCudaTest, SingleRowEveryPath) {
  std::mt19937_64 rng(5);
  for (DType dtype : kAllDTypes) {
    std::vector<Problem> problems;
    for (const auto& [path, n] : LengthsPerPath(*plan_, dtype)) {
      problems.push_back(MakeProblem(dtype, 1, n, 1, rng, 1.0f, n % 2 == 0));
    }
    RunAndCheck(dtype, problems, "M=1");
  }
}

// The flat kernel (one-segment launches of rows of up to 1024 vectors): every
// group size (1..512 threads), lengths at its limit and +-1 (just beyond,
// the staged kernel runs when the row is whole vectors, row_staged
// otherwise), unaligned lengths and pointers, and more rows than one
// grid pass covers.
TEST_F(SoftmaxCudaTest, FlatKernel) {
  std::mt19937_64 rng(9);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    struct Case {
      int64_t rows, n;
      bool flat;
    };
    std::vector<Case> cases = {
        {1, 1, true},          {5, 3, true},          {9, v, true},
        {7, 2 * v + 1, true},  {3, 16 * v, true},     {3, 16 * v + 1, true},
        {2, 511 * v, true},    {4, 511 * v + 1, true}, {5, 1024 * v - 1, true},
        {3, 1024 * v, true},   {2, 1024 * v + 1, false}, {3, 1025 * v, false},
        {2, 2048 * v, false},  {3, 3000 * v + 3, false}, {2, 4096 * v, false},
        {40000, 3 * v, true},  {301, 700 * v, true},  {611, 3001 * v, false},  // many rows
    };
    for (bool log : {false, true}) {
      for (const Case& c : cases) {
        EXPECT_EQ(FlatKernelTakes(dtype, c.n), c.flat) << "n=" << c.n;
        SoftmaxSegment seg;
        seg.outer = c.rows;
        seg.n = c.n;
        if (c.flat) {
          EXPECT_EQ(LaunchKernels(*plan_, dtype, &seg, 1), "flat") << "n=" << c.n;
        }
        std::vector<Problem> one;
        one.push_back(MakeProblem(dtype, c.rows, c.n, 1, rng, 0.8f, log));
        if (c.n % 5 == 0) one[0].input_offset_elements = 1;  // unaligned input
        RunAndCheck(dtype, one, "flat n=" + std::to_string(c.n));
      }
    }
  }
}

// The split path's register forms: one pass while the grid holds every part
// of a row (up to SplitSinglePassMaxLength), two passes beyond. Rows of a few
// parts over many grid strides exercise the single pass's waits between
// blocks, also with a part count that does not divide the grid.
TEST_F(SoftmaxCudaTest, SplitSingleAndTwoPass) {
  std::mt19937_64 rng(8);
  for (DType dtype : kAllDTypes) {
    const int64_t one_pass = SplitSinglePassMaxLength(*plan_, dtype);
    ASSERT_GT(one_pass, PathMaxLength(*plan_, dtype, SoftmaxPath::kBlockRows)) << DTypeName(dtype);
    const int64_t part = 2048 * VecWidth(dtype);  // elements one block holds
    int64_t few_parts = 3 * part + 5;
    SoftmaxSegment probe;
    probe.n = few_parts;
    if (ChoosePath(*plan_, dtype, probe) != SoftmaxPath::kSplitRows) {
      few_parts = PathMaxLength(*plan_, dtype, SoftmaxPath::kClusterRows) + 7;
    }
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      // At the limit, misaligned by one element (aligned rows go to split_staged).
      problems.push_back(MakeProblem(dtype, 1, one_pass, 1, rng, 1.0f, log));
      problems.back().input_offset_elements = 1;
      problems.back().output_offset_elements = 1;
      problems.push_back(MakeProblem(dtype, 2, one_pass + 1, 1, rng, 0.9f, log));
      // More two-pass rows in one launch (their partials and counters side by side).
      problems.push_back(MakeProblem(dtype, 5, one_pass + 3, 1, rng, 1.2f, log));
      problems.push_back(MakeProblem(dtype, 97, few_parts, 1, rng, 1.1f, log));
      for (const Problem& p : problems) {
        SoftmaxSegment s;
        s.n = p.shape.n;
        EXPECT_EQ(ChoosePath(*plan_, dtype, s), SoftmaxPath::kSplitRows) << "n=" << s.n;
      }
      RunAndCheck(dtype, problems, "split one/two pass");
    }
  }
}

// split_staged: aligned rows beyond the staged path, each part staged in one
// block's shared memory, parts exchanging (max, sum) through global scratch
// in a cooperative grid. Rows just beyond the staged path and at the longest
// it takes, more rows than one step of the grid holds (so blocks run several
// units), parts that do not divide the row evenly, a row of special values,
// a table mixing it with other paths, and an in-place launch. The same
// lengths misaligned go to split_fused or the two-pass form.
TEST_F(SoftmaxCudaTest, SplitStagedRows) {
  std::mt19937_64 rng(12);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    const int64_t staged = PathMaxLength(*plan_, dtype, SoftmaxPath::kStagedRows);
    const int64_t longest = SplitStagedMaxLength(*plan_, dtype);
    if (staged == 0 || longest == 0) {
      std::printf("split_staged unavailable for %s (no clusters)\n", DTypeName(dtype));
      continue;
    }
    ASSERT_GT(longest, staged) << DTypeName(dtype);
    const int64_t lengths[] = {staged + v, (staged / v * 3 / 2 + 7) * v, longest};
    for (int64_t n : lengths) {
      SoftmaxSegment s;
      s.n = n;
      s.outer = 2;
      EXPECT_EQ(ChoosePath(*plan_, dtype, s), SoftmaxPath::kSplitRows) << "n=" << n;
      EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), "split_staged") << "n=" << n;
    }
    SoftmaxSegment beyond;
    beyond.n = longest + v;
    EXPECT_NE(LaunchKernels(*plan_, dtype, &beyond, 1), "split_staged");
    // float32 rows between the staged path's two ranges (512 KiB .. 768 KiB).
    const bool gap = dtype == DType::kFloat32 && staged > 32768 * v;
    if (gap) {
      for (int64_t n : {32769 * v, 49151 * v}) {
        SoftmaxSegment s;
        s.n = n;
        EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), "split_staged") << "n=" << n;
      }
    }
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      // Rows just beyond the staged path, more than two steps of the grid hold.
      const KernelProbe* probe = plan_->Find("split_staged", dtype);
      const int64_t parts = (lengths[0] * static_cast<int64_t>(ItemSize(dtype)) + 65535) / 65536;  // 64 KiB parts
      const int64_t rows = 2 * (probe->grid / parts) + 3;
      problems.push_back(MakeProblem(dtype, rows, lengths[0], 1, rng, 0.9f, log));
      Problem special = MakeProblem(dtype, 4, lengths[1], 1, rng, 1.0f, log);
      SetSpecialRows(special, dtype);
      problems.push_back(std::move(special));
      problems.push_back(MakeProblem(dtype, 2, longest, 1, rng, 1.1f, log));
      problems.push_back(MakeProblem(dtype, 3, 3000 * v, 1, rng, 1.0f, log));  // another path
      if (gap) problems.push_back(MakeProblem(dtype, 5, 40000 * v, 1, rng, 1.0f, log));
      RunAndCheck(dtype, problems, "split_staged");
      std::vector<Problem> misaligned;
      misaligned.push_back(MakeProblem(dtype, 3, lengths[0] + 1, 1, rng, 1.0f, log));
      RunAndCheck(dtype, misaligned, "split, odd length");
    }
    // In place: output == input (a block reads its whole part before writing it).
    CheckInPlace(dtype, 7, lengths[0], SoftmaxPath::kSplitRows, rng, "split_staged in place");
  }
}

// The staged path: every cluster size it picks (2..16 blocks), shares that
// do not divide evenly (the last block of a row holds fewer vectors), many
// rows per launch, the longest row it takes, and in-place launches. Rows
// that are misaligned or not whole vectors go to the register paths.
TEST_F(SoftmaxCudaTest, StagedRows) {
  std::mt19937_64 rng(11);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    const int64_t staged = PathMaxLength(*plan_, dtype, SoftmaxPath::kStagedRows);
    if (staged == 0) {
      std::printf("staged path unavailable for %s (no clusters)\n", DTypeName(dtype));
      continue;
    }
    std::vector<int64_t> lengths = {1025 * v,  2048 * v,  3839 * v, 3840 * v, 4097 * v,  7679 * v, 7680 * v, 8192 * v, 12289 * v,
                                    16384 * v, 32767 * v, 49152 * v, 65536 * v, 131071 * v, staged};
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      for (int64_t n : lengths) {
        if (n > staged || (dtype == DType::kFloat32 && n > 32768 * v && n < 49152 * v)) continue;
        SoftmaxSegment s;
        s.n = n;
        // Whole-vector rows of more than 1024 vectors: the staged kernel,
        // alone or in a table (the rule in plan.cc, RowKernelOf), but for
        // those of up to 3839 vectors of the 16-bit types (row_staged).
        EXPECT_EQ(ChoosePath(*plan_, dtype, s), SoftmaxPath::kStagedRows) << "n=" << n;
        s.outer = 3;
        const bool row_staged = ItemSize(dtype) == 2 && n < 3840 * v;
        EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), row_staged ? "row_staged" : "staged")
            << "n=" << n;
        problems.push_back(MakeProblem(dtype, RowsFor(n, 1 << 21), n, 1, rng, 0.9f, log));
        std::vector<Problem> one;
        one.push_back(problems.back());
        RunAndCheck(dtype, one, "staged alone");
      }
      RunAndCheck(dtype, problems, "staged in a table");
    }
    // In place: output == input.
    CheckInPlace(dtype, 5, 20000 * v, SoftmaxPath::kStagedRows, rng, "staged in place");
  }
}

// A ragged table mixing every class, op and temperature; more segments than
// travel inline (the table then goes through scratch), and fewer.
TEST_F(SoftmaxCudaTest, RaggedSegmentTables) {
  std::mt19937_64 rng(6);
  for (DType dtype : kAllDTypes) {
    for (int count : {7, 23, 150}) {
      std::vector<Problem> problems;
      std::uniform_int_distribution<int> kind(0, 9);
      std::uniform_real_distribution<float> temperature(0.3f, 3.0f);
      for (int i = 0; i < count; ++i) {
        const int k = kind(rng);
        int64_t n, outer, inner = 1;
        if (k < 5) {
          n = std::uniform_int_distribution<int64_t>(1, 2500)(rng);
          outer = std::uniform_int_distribution<int64_t>(1, 63)(rng);
        } else if (k < 7) {
          n = std::uniform_int_distribution<int64_t>(2500, 20000)(rng);
          outer = std::uniform_int_distribution<int64_t>(1, 9)(rng);
        } else if (k < 8) {
          n = std::uniform_int_distribution<int64_t>(20000, 150000)(rng);
          outer = std::uniform_int_distribution<int64_t>(1, 3)(rng);
        } else if (k < 9 && count < 100) {
          n = std::uniform_int_distribution<int64_t>(150000, 700000)(rng);
          outer = 1;
        } else {
          n = std::uniform_int_distribution<int64_t>(2, 300)(rng);
          outer = std::uniform_int_distribution<int64_t>(1, 4)(rng);
          inner = std::uniform_int_distribution<int64_t>(2, 70)(rng);
        }
        problems.push_back(
            MakeProblem(dtype, outer, n, inner, rng, temperature(rng), kind(rng) % 2 == 0));
      }
      RunAndCheck(dtype, problems, "ragged " + std::to_string(count));
    }
  }
}

// Ragged tables whose rows all hold <= 8192 vectors, run by the flat table
// and row_staged kernels and, with allow_flat false, by the on-chip kernel:
// every group shape of the flat geometry (1..512 threads of 2 vectors), rows
// of 1025..8192 vectors at every offset (row_staged, inputs and outputs at
// different offsets, rows of the shares of every blocks-per-SM launch),
// mixed ops and temperatures, inline and scratch tables, whole-vector rows
// of more than 1024 vectors (the staged kernel's) among them.
TEST_F(SoftmaxCudaTest, RaggedTablesFlatAndOnChip) {
  std::mt19937_64 rng(10);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    for (int count : {2, 9, 70}) {
      std::vector<Problem> problems;
      std::uniform_real_distribution<float> temperature(0.3f, 3.0f);
      for (int i = 0; i < count; ++i) {
        const int64_t max_n = (i % 3 == 0) ? 8192 * v : (i % 3 == 1 ? 300 * v : 16 * v);
        int64_t n = std::uniform_int_distribution<int64_t>(1, max_n)(rng);
        if (n > 4096 * v) n |= 1;  // not whole vectors: the staged path does not take it
        const int64_t outer = std::uniform_int_distribution<int64_t>(1, n > 1000 ? 9 : 700)(rng);
        problems.push_back(MakeProblem(dtype, outer, n, 1, rng, temperature(rng), i % 2 == 0));
        if (i % 4 == 1) problems.back().input_offset_elements = 3;
      }
      // More flat rows than row_staged rows: the flat table launch keeps them
      // (FlatRowsInARowStagedLaunch has the other case).
      problems.push_back(MakeProblem(dtype, 500, 32 * v, 1, rng));
      // The table's limit, 8192 vectors, aligned (the staged kernel takes
      // those) and not (granules one more than vectors).
      problems.push_back(MakeProblem(dtype, 2, 8192 * v, 1, rng));
      problems.push_back(MakeProblem(dtype, 3, 8191 * v, 1, rng));
      problems.back().input_offset_elements = 1;  // misaligned: the staged path does not take it
      problems.back().output_offset_elements = 2;  // and the output at another offset
      problems.push_back(MakeProblem(dtype, 2, 8192 * v - 1, 1, rng));
      problems.back().input_offset_elements = 3;
      std::vector<SoftmaxSegment> described = Described(problems);
      const int described_count = static_cast<int>(described.size());
      EXPECT_EQ(LaunchKernels(*plan_, dtype, described.data(), described_count),
                "staged,row_staged,flat_table");
      EXPECT_EQ(LaunchKernels(*plan_, dtype, described.data(), described_count, false),
                "staged,on_chip");
      described.back().n = 14080 * v + 1;  // beyond row_staged (14,080 vectors): on_chip
      EXPECT_EQ(LaunchKernels(*plan_, dtype, described.data(), described_count),
                "staged,on_chip,row_staged,flat_table");
      for (bool allow_flat : {true, false}) {
        RunAndCheck(dtype, problems,
                    std::string(allow_flat ? "flat table " : "on-chip table ") +
                        std::to_string(count),
                    allow_flat);
      }
    }
  }
}

// A table whose row_staged rows outnumber its flat rows runs them all in one
// row_staged launch, the flat rows summed in the flat order: every group
// shape (1..512 threads), aligned and not, both ops, several temperatures.
// (softmax_invariance_test compares their bits with the same rows alone.)
TEST_F(SoftmaxCudaTest, FlatRowsInARowStagedLaunch) {
  std::mt19937_64 rng(13);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    std::vector<Problem> problems;
    int64_t flat_rows = 0;
    int i = 0;
    for (int64_t n : {int64_t{1}, int64_t{5}, v, 3 * v + 1, 17 * v, 33 * v - 1, 64 * v,
                      100 * v + 3, 256 * v, 257 * v, 512 * v + 1, 1000 * v, 1024 * v}) {
      problems.push_back(MakeProblem(dtype, 3, n, 1, rng, i % 3 == 0 ? 0.6f : 1.0f, i % 2 == 0));
      if (i % 3 == 1) problems.back().input_offset_elements = 1;
      if (i % 4 == 2) problems.back().output_offset_elements = 3;
      flat_rows += 3;
      ++i;
    }
    problems.push_back(MakeProblem(dtype, flat_rows, 1500 * v + 1, 1, rng));  // row_staged
    const std::vector<SoftmaxSegment> described = Described(problems);
    EXPECT_EQ(LaunchKernels(*plan_, dtype, described.data(), static_cast<int>(described.size())),
              "row_staged");
    RunAndCheck(dtype, problems, "flat rows in a row_staged launch");
  }
}

// A table whose later launches overlap the tail of the ones before
// (programmatic dependent launch): what follows on the stream (here a copy
// back, with no synchronization in between) must still see every launch's
// output, not only the last one's. The first launch (staged) is the
// longest, the last one (flat_table) short, so that a last launch that did
// not wait would let the copy read poison.
TEST_F(SoftmaxCudaTest, OverlappingLaunchesKeepStreamOrder) {
  std::mt19937_64 rng(12);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    std::vector<Problem> problems;
    problems.push_back(MakeProblem(dtype, 96, 30 * v + 1, 1, rng));     // flat_table
    problems.push_back(MakeProblem(dtype, 64, 8000 * v + 1, 1, rng));   // row_staged
    problems.push_back(MakeProblem(dtype, 3, 15000 * v + 1, 1, rng));   // on_chip (clusters)
    problems.push_back(MakeProblem(dtype, 512, 4100 * v, 1, rng));      // staged
    std::string kernels, schedule;
    EXPECT_EQ(OverlappingLaunches(dtype, problems, &kernels, &schedule), 3u) << schedule;
    ASSERT_EQ(kernels, "staged,on_chip,row_staged,flat_table");
    for (int round = 0; round < 5; ++round) {
      RunAndCheck(dtype, problems, "overlapping launches, round " + std::to_string(round), true,
                  stream);
    }
  }
  cudaStreamDestroy(stream);
}

// A later pass (split_merge, split_normalize, strided_normalize) is a
// programmatic dependent of the pass before: it loads before that pass
// completes and must still read what it wrote; a copy queued right after, with no
// synchronization, must see every output. In place too, where the second
// pass's early loads read what it then overwrites.
TEST_F(SoftmaxCudaTest, SecondPassesOverlapTheirFirstPass) {
  std::mt19937_64 rng(14);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr int64_t kLong = (int64_t{1} << 23) + 1;  // unaligned: split_stats, split_normalize_units
  for (DType dtype : kAllDTypes) {
    // 32 MiB aligned rows: split_stats, split_merge, split_normalize.
    const int64_t aligned = (int64_t{1} << 25) / static_cast<int64_t>(ItemSize(dtype));
    std::vector<Problem> problems;
    problems.push_back(MakeProblem(dtype, 2, kLong, 1, rng));
    problems.push_back(MakeProblem(dtype, 2, aligned, 1, rng, 0.5f, true));
    problems.push_back(MakeProblem(dtype, 3, 5000, 300, rng));  // strided_stats, strided_normalize
    problems.push_back(MakeProblem(dtype, 1, 70000, 3, rng, 0.5f, true));
    std::string kernels, schedule;
    EXPECT_EQ(OverlappingLaunches(dtype, problems, &kernels, &schedule), 5u) << schedule;
    ASSERT_EQ(kernels,
              "split_stats,split_normalize_units,split_merge,split_normalize,strided_stats,"
              "strided_normalize")
        << schedule;
    for (int round = 0; round < 3; ++round) {
      RunAndCheck(dtype, problems, "later passes, round " + std::to_string(round), true, stream);
    }
    CheckInPlace(dtype, 2, kLong, SoftmaxPath::kSplitRows, rng, "split_stats in place");
    CheckInPlace(dtype, 1, aligned, SoftmaxPath::kSplitRows, rng, "split_merge in place");
  }
  cudaStreamDestroy(stream);
}

TEST_F(SoftmaxCudaTest, NonLastAxis) {
  std::mt19937_64 rng(7);
  for (DType dtype : kAllDTypes) {
    for (bool log : {false, true}) {
      std::vector<Problem> problems;
      for (auto [outer, n, inner] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 4096, 64}, {3, 17, 5}, {2, 1000, 130}, {4, 33, 256}, {1, 70000, 3},
               {5, 7, 1000}, {1, 2, 4096}, {2, 1, 9}, {1, 300, 8}, {1, 20000, 40},
               // strided_staged: every cluster size, uneven shares, its longest columns
               {2, 513, 96}, {3, 2049, 64}, {1, 9000, 128}, {1, 26624, 64}, {1, 26625, 64},
               // float32 tiles of 256 bytes (columns of up to 2,048 rows), and beyond
               {2, 2048, 128}, {3, 1500, 64}, {2, 3000, 512}}) {
        problems.push_back(MakeProblem(dtype, outer, n, inner, rng, 0.8f, log));
      }
      RunAndCheck(dtype, problems, "strided");
      // Aligned tiles of 128-byte rows take the one-pass kernel; its
      // longest columns are 16 shares of 208 KiB.
      SoftmaxSegment s;
      s.inner = 64;
      s.n = 26624;
      EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), "strided_staged");
      s.n = 26625;
      EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), "strided_stats,strided_normalize");
      s.n = 4096;
      s.inner = 3;
      EXPECT_EQ(LaunchKernels(*plan_, dtype, &s, 1), "strided_stats,strided_normalize");
    }
  }
}

TEST_F(SoftmaxCudaTest, RejectsBadArguments) {
  SoftmaxSegment s;
  s.n = 10;
  s.input = nullptr;
  s.output = nullptr;
  EXPECT_EQ(LaunchSoftmax(*plan_, DType::kFloat32, &s, 1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 1 << 20), cudaSuccess);
  s.input = d;
  s.output = d;
  s.temperature = 0.0f;
  EXPECT_EQ(LaunchSoftmax(*plan_, DType::kFloat32, &s, 1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  s.temperature = 1.0f;
  s.n = 1 << 22;  // split path: needs scratch
  s.outer = 1;
  s.input = d;
  EXPECT_GT(SoftmaxScratchBytes(*plan_, DType::kFloat32, &s, 1), 0u);
  EXPECT_EQ(LaunchSoftmax(*plan_, DType::kFloat32, &s, 1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  cudaFree(d);
}

}  // namespace
}  // namespace gpu
}  // namespace softmax
