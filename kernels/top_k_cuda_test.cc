// GPU tests of the fused top K (LaunchSoftmaxTopK) against the float64
// reference and the CPU path; without a CUDA device every test skips with
// the reason.
//
// Every check: the reference ranking's indices exactly (the order is exact:
// the input's value, then the index), each value within the reference
// tolerance of the float64 softmax at its index, outputs poisoned before
// each of two launches on the same scratch. Batch invariance: a probe's
// values and indices alone must equal, bit for bit, its rows launched inside
// random tables of other segments, at other addresses (aligned or not),
// along an inner axis, and as fewer rows.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_softmax.h"
#include "kernels/cuda_testing.h"
#include "kernels/dtype.h"
#include "kernels/kernel_testing.h"
#include "kernels/softmax_cuda.h"
#include "kernels/top_k_testing.h"

namespace softmax {
namespace gpu {
namespace {

#define SKIP_WITHOUT_DEVICE()                                               \
  do {                                                                      \
    std::string reason;                                                     \
    if (!HaveCudaDevice("no CUDA device", &reason)) GTEST_SKIP() << reason; \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(expr)

// One top-K problem: host input, and where it lies on the device (an offset
// in elements from a 256-byte aligned allocation).
struct Problem {
  SoftmaxShape shape;
  SoftmaxOptions options;
  int64_t k = 1;
  std::vector<uint8_t> input;
  size_t offset = 0;
};

struct Answer {
  std::vector<uint8_t> values;
  std::vector<int64_t> indices;
};

// Runs `problems` in one LaunchSoftmaxTopK call (twice, outputs poisoned
// before each) and returns their answers.
void RunTopK(DType dtype, const std::vector<Problem>& problems, std::vector<Answer>* answers) {
  const size_t item = ItemSize(dtype);
  std::vector<void*> inputs(problems.size());
  std::vector<void*> values(problems.size());
  std::vector<int64_t*> indices(problems.size());
  std::vector<TopKSegment> segments(problems.size());
  for (size_t p = 0; p < problems.size(); ++p) {
    const Problem& pr = problems[p];
    const size_t out_count = static_cast<size_t>(pr.shape.outer * pr.k * pr.shape.inner);
    ASSERT_CUDA(cudaMalloc(&inputs[p], pr.input.size() + (pr.offset + 8) * item));
    ASSERT_CUDA(cudaMemcpy(static_cast<char*>(inputs[p]) + pr.offset * item, pr.input.data(),
                           pr.input.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMalloc(&values[p], out_count * item + 16));
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&indices[p]), out_count * 8 + 16));
    TopKSegment& s = segments[p];
    s.input = static_cast<char*>(inputs[p]) + pr.offset * item;
    s.values = values[p];
    s.indices = indices[p];
    s.outer = pr.shape.outer;
    s.n = pr.shape.n;
    s.inner = pr.shape.inner;
    s.k = pr.k;
    s.temperature = pr.options.temperature;
    s.log = pr.options.log;
  }
  const size_t scratch_bytes =
      SoftmaxTopKScratchBytes(dtype, segments.data(), static_cast<int>(segments.size()));
  void* scratch = nullptr;
  if (scratch_bytes > 0) {
    ASSERT_CUDA(cudaMalloc(&scratch, scratch_bytes));
  }
  answers->assign(problems.size(), Answer{});
  for (int round = 0; round < 2; ++round) {
    for (size_t p = 0; p < problems.size(); ++p) {
      const Problem& pr = problems[p];
      const size_t out_count = static_cast<size_t>(pr.shape.outer * pr.k * pr.shape.inner);
      ASSERT_CUDA(cudaMemset(values[p], 0x7b, out_count * item));
      ASSERT_CUDA(cudaMemset(indices[p], 0x7b, out_count * 8));
    }
    int launches = 0;
    ASSERT_CUDA(LaunchSoftmaxTopK(dtype, segments.data(), static_cast<int>(segments.size()),
                                  scratch, scratch_bytes, nullptr, &launches));
    ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_GE(launches, 1);
  }
  for (size_t p = 0; p < problems.size(); ++p) {
    const Problem& pr = problems[p];
    const size_t out_count = static_cast<size_t>(pr.shape.outer * pr.k * pr.shape.inner);
    Answer& a = (*answers)[p];
    a.values.resize(out_count * item);
    a.indices.resize(out_count);
    ASSERT_CUDA(cudaMemcpy(a.values.data(), values[p], out_count * item, cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(a.indices.data(), indices[p], out_count * 8, cudaMemcpyDeviceToHost));
    cudaFree(inputs[p]);
    cudaFree(values[p]);
    cudaFree(indices[p]);
  }
  if (scratch != nullptr) cudaFree(scratch);
}

// Checks one answer against the reference and against the CPU path's
// indices (identical: the same exact ranking).
std::string Check(DType dtype, const Problem& p, const Answer& a) {
  const std::string reference = testing::CheckTopK(p.input.data(), dtype, p.shape, p.options, p.k,
                                                   a.values.data(), a.indices.data());
  if (!reference.empty()) return reference;
  std::vector<uint8_t> cpu_values(a.values.size());
  std::vector<int64_t> cpu_indices(a.indices.size());
  CpuSoftmaxTopKRows(p.input.data(), dtype, p.shape, p.options, p.k, cpu_values.data(),
                     cpu_indices.data(), 0, p.shape.rows());
  if (cpu_indices != a.indices) return "indices differ from the CPU path";
  return "";
}

std::string Describe(DType dtype, const Problem& p) {
  return std::string(DTypeName(dtype)) + " [" + std::to_string(p.shape.outer) + ", " +
         std::to_string(p.shape.n) + ", " + std::to_string(p.shape.inner) + "] k=" +
         std::to_string(p.k) + " t=" + std::to_string(p.options.temperature) +
         (p.options.log ? " log" : "") + " offset=" + std::to_string(p.offset);
}

// Runs `problems` as one launch and checks every answer.
void RunAndCheck(DType dtype, const std::vector<Problem>& problems) {
  std::vector<Answer> answers;
  ASSERT_NO_FATAL_FAILURE(RunTopK(dtype, problems, &answers));
  for (size_t i = 0; i < problems.size(); ++i) {
    EXPECT_EQ(Check(dtype, problems[i], answers[i]), "") << Describe(dtype, problems[i]);
  }
}

Problem Random(DType dtype, int64_t outer, int64_t n, int64_t inner, int64_t k,
               std::mt19937_64& rng, SoftmaxOptions options = {}, size_t offset = 0) {
  Problem p;
  p.shape = SoftmaxShape{outer, n, inner};
  p.options = options;
  p.k = k;
  p.input = testing::RandomTensor(dtype, p.shape.elements(), rng, 2.0f);
  p.offset = offset;
  return p;
}

// For each dtype, runs the problems `make` draws as one launch and checks
// them; one generator, seeded `seed`, serves the whole test.
void RunAndCheckEveryDType(uint64_t seed,
                           const std::function<std::vector<Problem>(DType, std::mt19937_64&)>& make) {
  std::mt19937_64 rng(seed);
  for (DType dtype : kAllDTypes) {
    ASSERT_NO_FATAL_FAILURE(RunAndCheck(dtype, make(dtype, rng)));
  }
}

// Rows of 32 to 2^20 columns (one part, several, the longest parts), every
// dtype and K, aligned and not, log and temperature.
TEST(TopKCuda, RowLengthsEveryDTypeAndK) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(66);
  for (DType dtype : kAllDTypes) {
    for (int64_t k : {1, 5, 64}) {
      std::vector<Problem> problems;
      for (int64_t n : {64LL, 100LL, 1000LL, 4096LL, 4097LL, 8192LL, 32000LL, 65539LL, 131072LL,
                        1LL << 20}) {
        const int64_t outer = n >= 131072 ? 2 : n >= 8192 ? 5 : 17;
        problems.push_back(Random(dtype, outer, n, 1, k, rng));
        problems.push_back(Random(dtype, 3, n, 1, k, rng, SoftmaxOptions{0.6f, true}, 1));
      }
      problems.push_back(Random(dtype, 9, 32, 1, std::min<int64_t>(k, 32), rng));
      ASSERT_NO_FATAL_FAILURE(RunAndCheck(dtype, problems));
    }
  }
}

// A non-last axis ([outer, n, inner], inner > 1), short and long rows.
TEST(TopKCuda, InnerAxes) {
  SKIP_WITHOUT_DEVICE();
  RunAndCheckEveryDType(7, [](DType dtype, std::mt19937_64& rng) {
    std::vector<Problem> problems;
    problems.push_back(Random(dtype, 2, 1000, 3, 5, rng));
    problems.push_back(Random(dtype, 1, 40000, 5, 64, rng, SoftmaxOptions{2.0f, false}));
    problems.push_back(Random(dtype, 3, 64, 64, 64, rng, SoftmaxOptions{1.0f, true}));
    return problems;
  });
}

// Rows of -inf, NaN, +inf, ties, +0 and -0, ascending values (every element
// beats the bar), short and split into parts.
TEST(TopKCuda, SpecialValues) {
  SKIP_WITHOUT_DEVICE();
  RunAndCheckEveryDType(64, [](DType dtype, std::mt19937_64& rng) {
    std::vector<Problem> problems;
    for (int64_t k : {1, 5, 64}) {
      for (int64_t n : {64LL, 3000LL, 70000LL}) {
        for (size_t offset : {size_t{0}, size_t{3}}) {
          Problem p;
          p.shape = SoftmaxShape{static_cast<int64_t>(testing::SpecialKind::kCount), n, 1};
          p.k = k;
          p.offset = offset;
          p.input.resize(static_cast<size_t>(p.shape.elements()) * ItemSize(dtype));
          for (int64_t r = 0; r < p.shape.outer; ++r) {
            testing::SpecialRow(static_cast<testing::SpecialKind>(r), dtype, n, r * n, 1, rng,
                                p.input.data());
          }
          problems.push_back(std::move(p));
        }
      }
    }
    return problems;
  });
}

// The same rows alone, inside random tables (other segments before and
// after, other offsets and alignment), along an inner axis and as fewer
// rows: values and indices bit for bit.
TEST(TopKCuda, BatchInvariance) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(2026);
  int compared = 0;
  for (DType dtype : kAllDTypes) {
    const size_t item = ItemSize(dtype);
    for (int64_t n : {32LL, 1000LL, 4096LL, 32000LL, 131072LL, 1LL << 20}) {
      for (int64_t k : {1LL, 5LL, 64LL}) {
        if (k > n) continue;
        const int64_t rows = n >= 131072 ? 2 : 6;
        Problem probe = Random(dtype, rows, n, 1, k, rng, SoftmaxOptions{0.8f, false});
        if (n == 4096) {
          testing::SpecialRow(testing::SpecialKind::kFewValues, dtype, n, 0, 1, rng, probe.input.data());
          testing::SpecialRow(testing::SpecialKind::kNaN, dtype, n, n, 1, rng, probe.input.data());
        }
        std::vector<Answer> alone;
        ASSERT_NO_FATAL_FAILURE(RunTopK(dtype, {probe}, &alone));
        ASSERT_EQ(Check(dtype, probe, alone[0]), "") << Describe(dtype, probe);
        for (int trial = 0; trial < 3; ++trial) {
          // Its last rows_used rows, at another offset, among random segments.
          const int64_t first = static_cast<int64_t>(rng() % rows);
          Problem piece = probe;
          piece.shape.outer = rows - first;
          piece.input.assign(probe.input.begin() + first * n * item, probe.input.end());
          piece.offset = rng() % 9;
          std::vector<Problem> table;
          const int before = static_cast<int>(rng() % 4);
          const int after = static_cast<int>(rng() % 4);
          for (int i = 0; i < before + after; ++i) {
            const int64_t other_n = 16 + static_cast<int64_t>(rng() % 200000);
            const int64_t other_k = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(64, other_n));
            table.push_back(Random(dtype, 1 + rng() % 3, other_n, 1 + rng() % 2, other_k, rng,
                                   SoftmaxOptions{1.3f, (rng() & 1) != 0}, rng() % 5));
          }
          table.insert(table.begin() + before, piece);
          std::vector<Answer> answers;
          ASSERT_NO_FATAL_FAILURE(RunTopK(dtype, table, &answers));
          const Answer& got = answers[before];
          const size_t skip = static_cast<size_t>(first * k);
          EXPECT_EQ(0, std::memcmp(got.values.data(), alone[0].values.data() + skip * item,
                                   got.values.size()))
              << Describe(dtype, piece) << " trial " << trial;
          EXPECT_TRUE(std::equal(got.indices.begin(), got.indices.end(),
                                 alone[0].indices.begin() + skip))
              << Describe(dtype, piece) << " trial " << trial;
          ++compared;
        }
        // The same rows along an inner axis: [1, n, rows] holds row r as column r.
        if (n <= 131072) {
          Problem strided = probe;
          strided.shape = SoftmaxShape{1, n, rows};
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              std::memcpy(strided.input.data() + (j * rows + r) * item,
                          probe.input.data() + (r * n + j) * item, item);
            }
          }
          std::vector<Answer> answers;
          ASSERT_NO_FATAL_FAILURE(RunTopK(dtype, {strided}, &answers));
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < k; ++j) {
              const size_t a = static_cast<size_t>(j * rows + r);
              const size_t b = static_cast<size_t>(r * k + j);
              EXPECT_EQ(answers[0].indices[a], alone[0].indices[b]) << Describe(dtype, strided);
              EXPECT_EQ(0, std::memcmp(answers[0].values.data() + a * item,
                                       alone[0].values.data() + b * item, item))
                  << Describe(dtype, strided) << " row " << r << " rank " << j;
            }
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
}

TEST(TopKCuda, RefusesBadArguments) {
  TopKSegment s;
  s.input = reinterpret_cast<const void*>(uintptr_t{256});
  s.values = reinterpret_cast<void*>(uintptr_t{256});
  s.indices = reinterpret_cast<int64_t*>(uintptr_t{256});
  s.n = 100;
  s.k = kMaxFusedTopK + 1;
  EXPECT_EQ(LaunchSoftmaxTopK(DType::kFloat32, &s, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
  s.k = 0;
  EXPECT_EQ(LaunchSoftmaxTopK(DType::kFloat32, &s, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
  s.k = 5;
  s.n = 4;
  EXPECT_EQ(LaunchSoftmaxTopK(DType::kFloat32, &s, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
  s.n = 100000;
  EXPECT_GT(SoftmaxTopKScratchBytes(DType::kFloat32, &s, 1), 0u);
  EXPECT_EQ(LaunchSoftmaxTopK(DType::kFloat32, &s, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
  s.n = 1000;
  s.temperature = 0.0f;
  EXPECT_EQ(LaunchSoftmaxTopK(DType::kFloat32, &s, 1, nullptr, 0, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace gpu
}  // namespace softmax
