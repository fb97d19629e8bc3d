// Batch invariance of the CUDA kernels: a row's output bits do not depend on
// the rest of its launch. Each probe tensor (every path boundary of every
// dtype, aligned and not) is launched alone once; then pieces of it (any run
// of its rows) go into many random launches: ragged tables of other segments
// of every path (among them tables whose flat rows run in their row_staged
// launch), at other offsets in the buffers (in the same alignment
// class: 16-byte aligned rows stay aligned, the others move to any element
// offset), on other streams with other scratch, with a second launch plan of
// the same device, and alone with fewer rows. Every piece must come back
// with the bits of the same rows launched alone. Half the probes' rows hold
// special values (-inf, NaN, +inf, +-0 maxima, subnormals, equal values),
// and the flat order's three implementations are compared bit for bit on
// such rows for every group size.
//
// Without a CUDA device every test skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda_testing.h"
#include "kernels/dtype.h"
#include "kernels/kernel_testing.h"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace {

// A tensor [outer, n, inner] whose rows are compared bit for bit.
struct Probe {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
  float temperature = 1.0f;
  bool log = false;
  int64_t misalign = 0;          // elements past a 16-byte boundary, input and output
  std::vector<uint8_t> input;
  std::vector<uint8_t> alone;    // output of the tensor launched alone
  std::string label;

  int64_t slab_bytes(DType dtype) const { return n * inner * static_cast<int64_t>(ItemSize(dtype)); }
  // Whether its rows (last axis: of n, else of inner elements) are whole
  // 16-byte vectors: then its offsets keep them aligned (its alignment class).
  bool whole_vectors(DType dtype) const {
    return ((inner == 1 ? n : inner) * static_cast<int64_t>(ItemSize(dtype))) % 16 == 0;
  }
};

// One segment of a launch: rows [first, first + rows) of a probe (probe >= 0)
// or a filler of the given shape, at byte offsets into the launch's buffers.
struct Placed {
  int probe = -1;
  int64_t first = 0;
  int64_t outer = 1, n = 1, inner = 1;
  float temperature = 1.0f;
  bool log = false;
  size_t in_offset = 0, out_offset = 0;
  size_t bytes = 0;
};

class SoftmaxInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveCudaDevice("no device", &skip_reason_)) return;
    plan_ = new LaunchPlan();
    second_plan_ = new LaunchPlan();
    if (LaunchPlan::Create(0, plan_) != cudaSuccess ||
        LaunchPlan::Create(0, second_plan_) != cudaSuccess) {
      skip_reason_ = "LaunchPlan::Create failed";
      create_failed_ = true;
    }
  }
  static void TearDownTestSuite() {
    delete plan_;
    delete second_plan_;
    plan_ = second_plan_ = nullptr;
  }
  void SetUp() override {
    ASSERT_FALSE(create_failed_) << skip_reason_;
    if (plan_ == nullptr) GTEST_SKIP() << "no CUDA device (" << skip_reason_ << "): GPU tests skipped";
  }

  // Runs `placed` as one LaunchSoftmax call over buffers of in_total /
  // out_total bytes (inputs: the probes' rows, fillers a constant pattern)
  // and returns the output buffer (and, with `kernels`, the kernels it ran).
  static void Run(const LaunchPlan& plan, DType dtype, const std::vector<Probe>& probes,
                  const std::vector<Placed>& placed, size_t in_total, size_t out_total,
                  cudaStream_t stream, std::vector<uint8_t>* host_out,
                  std::string* kernels = nullptr) {
    char* d_in = nullptr;
    char* d_out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_in), in_total), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), out_total), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_in, 0x3C, in_total), cudaSuccess);  // fillers: about 0.01 / 1.06
    ASSERT_EQ(cudaMemset(d_out, 0x7B, out_total), cudaSuccess);
    std::vector<SoftmaxSegment> segments;
    for (const Placed& p : placed) {
      if (p.probe >= 0) {
        const Probe& probe = probes[p.probe];
        ASSERT_EQ(cudaMemcpy(d_in + p.in_offset,
                             probe.input.data() + p.first * probe.slab_bytes(dtype), p.bytes,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      SoftmaxSegment s;
      s.input = d_in + p.in_offset;
      s.output = d_out + p.out_offset;
      s.outer = p.outer;
      s.n = p.n;
      s.inner = p.inner;
      s.temperature = p.temperature;
      s.log = p.log;
      segments.push_back(s);
    }
    const int count = static_cast<int>(segments.size());
    if (kernels != nullptr) *kernels = LaunchKernels(plan, dtype, segments.data(), count);
    const size_t scratch_bytes = SoftmaxScratchBytes(plan, dtype, segments.data(), count);
    void* scratch = nullptr;
    if (scratch_bytes > 0) {
      ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
      ASSERT_EQ(cudaMemset(scratch, 0x5A, scratch_bytes), cudaSuccess);
    }
    ASSERT_EQ(LaunchSoftmax(plan, dtype, segments.data(), count, scratch, scratch_bytes, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    host_out->resize(out_total);
    ASSERT_EQ(cudaMemcpy(host_out->data(), d_out, out_total, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(scratch);
    cudaFree(d_in);
    cudaFree(d_out);
  }

  static LaunchPlan* plan_;
  static LaunchPlan* second_plan_;
  static std::string skip_reason_;
  static bool create_failed_;
};

LaunchPlan* SoftmaxInvarianceTest::plan_ = nullptr;
LaunchPlan* SoftmaxInvarianceTest::second_plan_ = nullptr;
std::string SoftmaxInvarianceTest::skip_reason_;
bool SoftmaxInvarianceTest::create_failed_ = false;

// The values that reductions meet at their edges, one kind per row
// (SpecialRow): 0 normal, 1 some -inf, 2 all -inf, 3 a NaN, 4 a +inf, 5 a
// maximum of +0 and -0, 6 subnormals, 7 all equal.
constexpr int kSpecialKinds = 8;

// Rewrites the row of `n` elements from element `first` on, `stride` apart,
// of `data` (which holds normal values) as special kind `kind`.
void SpecialRow(DType dtype, int kind, int64_t first, int64_t n, int64_t stride,
                std::mt19937_64& rng, std::vector<uint8_t>* data) {
  // Subnormal magnitudes (bfloat16 shares float32's exponent range).
  const float subnormal = dtype == DType::kFloat16 ? 3e-6f : 1e-39f;
  const int64_t pick = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
  void* d = data->data();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t e = first + j * stride;
    const float x = LoadAsFloat(d, dtype, e);
    float y = x;
    switch (kind) {
      case 1: y = j % 7 == 0 ? -INFINITY : x; break;
      case 2: y = -INFINITY; break;
      case 3: y = j == pick ? NAN : x; break;
      case 4: y = j == pick ? INFINITY : x; break;
      case 5: y = j % 5 == 0 ? (j % 2 == 0 ? 0.0f : -0.0f) : -std::fabs(x); break;
      case 6: y = x * subnormal; break;
      case 7: y = 1.5f; break;
      default: break;
    }
    StoreFromFloat(d, dtype, e, y);
  }
}

// The probes of one dtype: both sides of every boundary between paths and
// kernels (warp, block, flat, flat table, row_staged, cluster, staged, split_staged,
// split_fused, two-pass split), strided shapes, and the shapes that came
// back with other bits under load on the H200 before the rule in plan.cc.
std::vector<Probe> MakeProbes(const LaunchPlan& plan, DType dtype, std::mt19937_64& rng) {
  const int64_t v = VecWidth(dtype);
  const int64_t staged = PathMaxLength(plan, dtype, SoftmaxPath::kStagedRows);
  const int64_t fused = SplitSinglePassMaxLength(plan, dtype);
  const int64_t split_staged = SplitStagedMaxLength(plan, dtype);
  struct Shape {
    int64_t outer, n, inner, misalign;
  };
  std::vector<Shape> shapes = {
      {5, 1, 1, 0},           {7, 3, 1, 0},            {9, v, 1, 0},
      {6, 32 * v + 1, 1, 0},  {5, 256 * v, 1, 0},      {5, 256 * v + 1, 1, 0},
      {4, 700 * v, 1, 1},     {4, 1024 * v - 1, 1, 0}, {3, 1024 * v, 1, 0},
      {3, 1024 * v, 1, 1},    {3, 1024 * v + 1, 1, 0}, {3, 1025 * v, 1, 0},
      {3, 2048 * v, 1, 0},    {3, 2048 * v + 1, 1, 0}, {3, 3000 * v, 1, 1},
      {2, 8192 * v - 1, 1, 0}, {2, 8192 * v, 1, 0},    {2, 8192 * v, 1, 1},
      {2, 8192 * v + 1, 1, 0}, {2, 12289 * v, 1, 0},   {2, 16384 * v - 1, 1, 0},
      {2, 14080 * v - 1, 1, 0}, {2, 14080 * v + 1, 1, 0}, {3, 50257, 1, 0},
      {2, 16384 * v + 1, 1, 0}, {3, 300, 5, 0},        {4, 1000, 64, 0},
      {2, 20000, 3, 1},       {6, 33, 256, 0},         {2, 4096, 64, 0},
      {1, 26624, 64, 0},      {2, 513, 96, 0},         {2, 2048, 64, 0},
      {2, 2049, 256, 0},
  };
  // The shapes of the H200 probe that differed (per dtype).
  if (dtype == DType::kFloat32) {
    for (Shape s : {Shape{2, 1024, 1, 0}, Shape{2, 2049, 1, 0}, Shape{16, 4096, 1, 0},
                    Shape{64, 32000, 1, 0},
                    // around the gap between the staged path's two ranges
                    Shape{1, 131076, 1, 0}, Shape{1, 196604, 1, 0}, Shape{1, 196608, 1, 0}}) {
      shapes.push_back(s);
    }
  } else {
    // and both sides of the 2- and 4-block clusters' rows (60 and 120 KiB).
    for (Shape s : {Shape{2, 40000, 1, 0}, Shape{64, 32000, 1, 0}, Shape{2, 30712, 1, 0},
                    Shape{2, 30720, 1, 0}, Shape{2, 32768, 1, 0}, Shape{2, 61432, 1, 0},
                    Shape{2, 61440, 1, 0}, Shape{2, 65536, 1, 0}}) {
      shapes.push_back(s);
    }
  }
  if (staged > 0) {
    shapes.push_back({2, staged, 1, 0});
    shapes.push_back({2, staged + v, 1, 0});  // split_staged
  }
  if (split_staged > 0) shapes.push_back({1, std::min<int64_t>(split_staged, 4 << 20), 1, 0});
  if (fused > 0) {
    shapes.push_back({1, fused - 1, 1, 0});     // split_fused (odd: not staged)
    shapes.push_back({3, fused + 3, 1, 0});     // split_stats + split_normalize_units
  }
  std::vector<Probe> probes;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int index = 0;
  for (const Shape& s : shapes) {
    for (bool log : {false, true}) {
      Probe p;
      p.outer = s.outer;
      p.n = s.n;
      p.inner = s.inner;
      p.misalign = s.misalign;
      p.log = log;
      p.temperature = log ? 0.7f : (index % 3 == 0 ? 1.0f : 1.9f);
      const int64_t elements = p.outer * p.n * p.inner;
      p.input.resize(static_cast<size_t>(elements) * ItemSize(dtype));
      for (int64_t e = 0; e < elements; ++e) StoreFromFloat(p.input.data(), dtype, e, 3.0f * normal(rng));
      // Half the rows (columns of a non-last axis) of special kinds.
      for (int64_t o = 0; o < p.outer; ++o) {
        for (int64_t i = 0; i < p.inner; ++i) {
          const int kind = static_cast<int>((o * p.inner + i + index) % (2 * kSpecialKinds));
          if (kind < kSpecialKinds) {
            SpecialRow(dtype, kind, o * p.n * p.inner + i, p.n, p.inner, rng, &p.input);
          }
        }
      }
      std::ostringstream label;
      label << DTypeName(dtype) << " [" << p.outer << "," << p.n << "," << p.inner << "] +"
            << p.misalign << (log ? " log" : "") << " T=" << p.temperature;
      p.label = label.str();
      probes.push_back(std::move(p));
      ++index;
    }
  }
  return probes;
}

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Bit-for-bit comparisons: how many, how many differed, and a description
// of each of the first 12 that did.
struct BitTally {
  int64_t compared = 0;
  int64_t differing = 0;
  std::ostringstream first;

  // Counts one comparison; true when it differed and is among the first 12
  // that did (the caller then describes it into `first`).
  bool Differs(bool differs) {
    ++compared;
    return differs && differing++ < 12;
  }
};

TEST_F(SoftmaxInvarianceTest, RowBitsDoNotDependOnTheRestOfTheLaunch) {
  std::mt19937_64 rng(2026);
  cudaStream_t streams[2];
  ASSERT_EQ(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking), cudaSuccess);
  BitTally tally;
  int joined_launches = 0;
  for (DType dtype : kAllDTypes) {
    const size_t item = ItemSize(dtype);
    const int64_t v = VecWidth(dtype);
    std::vector<Probe> probes = MakeProbes(*plan_, dtype, rng);
    // Each probe alone: the reference bits.
    for (size_t i = 0; i < probes.size(); ++i) {
      Probe& p = probes[i];
      Placed alone;
      alone.probe = static_cast<int>(i);
      alone.outer = p.outer;
      alone.n = p.n;
      alone.inner = p.inner;
      alone.temperature = p.temperature;
      alone.log = p.log;
      alone.bytes = p.input.size();
      alone.in_offset = alone.out_offset = p.misalign * item;
      std::vector<uint8_t> out;
      Run(*plan_, dtype, probes, {alone}, alone.bytes + 256, alone.bytes + 256, nullptr, &out);
      if (HasFatalFailure()) return;
      p.alone.assign(out.begin() + alone.out_offset, out.begin() + alone.out_offset + alone.bytes);
    }
    constexpr int kTrials = 14;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<Placed> placed;
      // Every few trials a probe piece alone (fewer rows than its reference).
      const bool single = trial % 5 == 4;
      // and every few a table whose flat rows run in its row_staged launch.
      const bool joined = trial % 5 == 1;
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (size_t i = 0; i < probes.size(); ++i) {
        if (!single && uniform(rng) > 0.6) continue;
        const Probe& p = probes[i];
        Placed piece;
        piece.probe = static_cast<int>(i);
        piece.first = std::uniform_int_distribution<int64_t>(0, p.outer - 1)(rng);
        piece.outer = std::uniform_int_distribution<int64_t>(1, p.outer - piece.first)(rng);
        piece.n = p.n;
        piece.inner = p.inner;
        piece.temperature = p.temperature;
        piece.log = p.log;
        placed.push_back(piece);
      }
      if (single) {
        std::vector<Placed> one = {placed[trial % placed.size()]};
        placed.swap(one);
      } else {
        // Fillers of every path: lengths log-uniform up to 300000, some strided.
        const int fillers = std::uniform_int_distribution<int>(0, 40)(rng);
        for (int f = 0; f < fillers; ++f) {
          Placed filler;
          filler.n = static_cast<int64_t>(std::exp(uniform(rng) * std::log(300000.0))) + 1;
          filler.outer = std::max<int64_t>(1, std::min<int64_t>(
              std::uniform_int_distribution<int64_t>(1, 64)(rng), (1 << 20) / filler.n));
          if (uniform(rng) < 0.1) {
            filler.inner = std::uniform_int_distribution<int64_t>(2, 70)(rng);
            filler.n = std::min<int64_t>(filler.n, 5000);
          }
          filler.temperature = 0.5f + static_cast<float>(uniform(rng));
          filler.log = uniform(rng) < 0.5;
          placed.push_back(filler);
        }
        std::shuffle(placed.begin(), placed.end(), rng);
        if (joined) {
          // More row_staged rows than flat ones: the flat rows join that launch.
          Placed long_rows;
          long_rows.n = 1025 * v + 1;
          for (const Placed& p : placed) {
            if (p.inner == 1 && p.n <= 1024 * v) long_rows.outer += p.outer;
          }
          placed.push_back(long_rows);
        }
      }
      // Offsets: every segment starts at a random 16-byte step past a 256-byte
      // boundary, plus its elements off the boundary: a probe's own for rows of
      // whole vectors (they stay in their alignment class), any for the others.
      size_t in_total = 0, out_total = 0;
      for (Placed& p : placed) {
        int64_t in_mis, out_mis;
        if (p.probe >= 0 && probes[p.probe].whole_vectors(dtype)) {
          in_mis = out_mis = probes[p.probe].misalign;
        } else {
          in_mis = std::uniform_int_distribution<int64_t>(0, v - 1)(rng);
          out_mis = std::uniform_int_distribution<int64_t>(0, v - 1)(rng);
        }
        p.bytes = static_cast<size_t>(p.outer * p.n * p.inner) * item;
        in_total = AlignUp(in_total, 256) + 16 * std::uniform_int_distribution<int>(0, 15)(rng);
        p.in_offset = in_total + in_mis * item;
        in_total = p.in_offset + p.bytes;
        out_total = AlignUp(out_total, 256) + 16 * std::uniform_int_distribution<int>(0, 15)(rng);
        p.out_offset = out_total + out_mis * item;
        out_total = p.out_offset + p.bytes;
      }
      const LaunchPlan& plan = trial % 3 == 2 ? *second_plan_ : *plan_;
      std::vector<uint8_t> out;
      std::string kernels;
      Run(plan, dtype, probes, placed, in_total + 256, out_total + 256, streams[trial % 2], &out,
          &kernels);
      if (HasFatalFailure()) return;
      if (joined) {
        EXPECT_EQ(kernels.find("flat_table"), std::string::npos) << kernels;
        joined_launches += kernels.find("row_staged") != std::string::npos;
      }
      for (const Placed& p : placed) {
        if (p.probe < 0) continue;
        const Probe& probe = probes[p.probe];
        const uint8_t* want = probe.alone.data() + p.first * probe.slab_bytes(dtype);
        if (tally.Differs(std::memcmp(out.data() + p.out_offset, want, p.bytes) != 0)) {
          int64_t bad = 0;
          for (size_t b = 0; b < p.bytes; b += item) {
            bad += std::memcmp(out.data() + p.out_offset + b, want + b, item) != 0;
          }
          SoftmaxSegment s;
          s.n = probe.n;
          s.inner = probe.inner;
          tally.first << "\n  " << probe.label << " rows " << p.first << ".." << p.first + p.outer
                      << " (path " << SoftmaxPathName(ChoosePath(*plan_, dtype, s))
                      << ") in a launch of " << placed.size() << " segments: " << bad
                      << " elements differ";
        }
      }
    }
  }
  cudaStreamDestroy(streams[0]);
  cudaStreamDestroy(streams[1]);
  std::printf("batch invariance: %lld probe pieces compared, %lld with other bits\n",
              static_cast<long long>(tally.compared), static_cast<long long>(tally.differing));
  EXPECT_GT(tally.compared, 0);
  EXPECT_EQ(joined_launches, 9);  // 3 trials of each dtype
  EXPECT_EQ(tally.differing, 0) << "pieces whose bits differ from the same rows launched alone:"
                                << tally.first.str();
}

// The flat order has three implementations: the flat kernel (GroupReduce),
// the flat table kernel (GroupReduceRows) and row_staged's flat rows
// (FlatOrderSum). They give the same bits for every group of R = 1..512
// threads per row, on rows of every special kind, 16-byte aligned and not,
// softmax and log-softmax at temperatures 1, 0.7 and 1.9; and rows with a
// NaN or +inf, or only -inf, come back NaN, an -inf among finite values 0
// (log: -inf), equal values equal.
TEST_F(SoftmaxInvarianceTest, FlatOrderIsOneTreeAtEverySpecialValue) {
  std::mt19937_64 rng(64);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  BitTally tally;
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    const size_t item = ItemSize(dtype);
    const bool row_staged = plan_->Find("row_staged", dtype) != nullptr;
    for (int group_log2 = 0; group_log2 <= 9; ++group_log2) {
      const int64_t r = int64_t{1} << group_log2;
      // Rows of R + 1 and 2R vectors (1 and 2 for R = 1) take R threads each.
      for (const int64_t n : {group_log2 == 0 ? int64_t{1} : r * v + 1, 2 * r * v}) {
        for (const int64_t misalign : {int64_t{0}, int64_t{1}}) {
          for (const float temperature : {1.0f, 0.7f, 1.9f}) {
            std::vector<Probe> probes(1);
            Probe& p = probes[0];
            p.outer = 2 * kSpecialKinds;
            p.n = n;
            p.misalign = misalign;
            p.temperature = temperature;
            p.log = temperature == 0.7f;
            p.input.resize(static_cast<size_t>(p.outer * n) * item);
            for (int64_t e = 0; e < p.outer * n; ++e) {
              StoreFromFloat(p.input.data(), dtype, e, 3.0f * normal(rng));
            }
            for (int64_t o = 0; o < p.outer; ++o) {
              SpecialRow(dtype, static_cast<int>(o % kSpecialKinds), o * n, n, 1, rng, &p.input);
            }
            Placed piece;
            piece.probe = 0;
            piece.outer = p.outer;
            piece.n = n;
            piece.temperature = temperature;
            piece.log = p.log;
            piece.bytes = p.input.size();
            piece.in_offset = piece.out_offset = misalign * item;
            // Beside it: one row of 1 element (a table: flat_table), or more
            // row_staged rows than its rows (they join the row_staged launch).
            Placed other;
            other.in_offset = other.out_offset = AlignUp(piece.in_offset + piece.bytes, 256);
            const size_t total = other.in_offset + (1025 * v + 1) * p.outer * item + 256;
            std::vector<uint8_t> alone;
            std::string kernels;
            Run(*plan_, dtype, probes, {piece}, total, total, nullptr, &alone, &kernels);
            if (HasFatalFailure()) return;
            ASSERT_EQ(kernels, "flat");
            std::vector<std::vector<Placed>> launches;
            other.bytes = item;
            launches.push_back({piece, other});
            if (row_staged) {
              other.outer = p.outer;
              other.n = 1025 * v + 1;
              other.bytes = static_cast<size_t>(other.outer * other.n) * item;
              launches.push_back({piece, other});
            }
            const char* expected[] = {"flat_table", "row_staged"};
            for (size_t l = 0; l < launches.size(); ++l) {
              std::vector<uint8_t> out;
              Run(*plan_, dtype, probes, launches[l], total, total, nullptr, &out, &kernels);
              if (HasFatalFailure()) return;
              EXPECT_EQ(kernels, expected[l]);
              if (tally.Differs(std::memcmp(out.data() + piece.out_offset,
                                            alone.data() + piece.out_offset, piece.bytes) != 0)) {
                tally.first << "\n  " << DTypeName(dtype) << " R=" << r << " n=" << n << " +"
                            << misalign << " T=" << temperature << (p.log ? " log" : "") << ": "
                            << expected[l] << " differs from flat";
              }
            }
            // What the special rows come to (the flat kernel's answer).
            const uint8_t* y = alone.data() + piece.out_offset;
            for (int64_t o = 0; o < p.outer; ++o) {
              const int kind = static_cast<int>(o % kSpecialKinds);
              const bool nan_row = kind == 2 || kind == 3 || kind == 4 || (kind == 1 && n == 1);
              for (int64_t j = 0; j < n; ++j) {
                const float out = LoadAsFloat(y, dtype, o * n + j);
                const float in = LoadAsFloat(p.input.data(), dtype, o * n + j);
                if (nan_row) {
                  ASSERT_TRUE(std::isnan(out)) << DTypeName(dtype) << " n=" << n << " kind " << kind;
                } else if (std::isinf(in)) {
                  ASSERT_EQ(out, p.log ? -INFINITY : 0.0f) << DTypeName(dtype) << " n=" << n;
                } else {
                  ASSERT_TRUE(std::isfinite(out)) << DTypeName(dtype) << " n=" << n << " kind "
                                                  << kind << " element " << j;
                }
                if (kind == 7) {
                  ASSERT_EQ(std::memcmp(y + (o * n + j) * item, y + o * n * item, item), 0);
                }
              }
            }
          }
        }
      }
    }
  }
  std::printf("flat order: %lld launches compared with the flat kernel, %lld with other bits\n",
              static_cast<long long>(tally.compared), static_cast<long long>(tally.differing));
  EXPECT_GE(tally.compared, 3 * 10 * 2 * 2 * 3);
  EXPECT_EQ(tally.differing, 0) << tally.first.str();
}

}  // namespace
}  // namespace gpu
}  // namespace softmax
