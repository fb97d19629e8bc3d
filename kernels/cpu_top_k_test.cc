// The CPU path of the top K (CpuSoftmaxTopKRows) against the float64
// reference: the reference ranking's indices exactly, values within the
// reference tolerance, every dtype, K in {1, 5, 64}, last and inner axes,
// rows of special values (-inf, NaN, +inf, ties, +0 and -0, ascending).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "kernels/kernel_testing.h"
#include "kernels/top_k_testing.h"

namespace softmax {
namespace {

std::string RunAndCheck(const std::vector<uint8_t>& input, DType dtype, const SoftmaxShape& shape,
                        const SoftmaxOptions& options, int64_t k) {
  std::vector<uint8_t> values(static_cast<size_t>(shape.outer * k * shape.inner) * ItemSize(dtype),
                              0x7b);
  std::vector<int64_t> indices(static_cast<size_t>(shape.outer * k * shape.inner), -7);
  // Two calls over halves of the rows: rows are independent.
  const int64_t half = shape.rows() / 2;
  CpuSoftmaxTopKRows(input.data(), dtype, shape, options, k, values.data(), indices.data(), 0, half);
  CpuSoftmaxTopKRows(input.data(), dtype, shape, options, k, values.data(), indices.data(), half,
                     shape.rows());
  return testing::CheckTopK(input.data(), dtype, shape, options, k, values.data(), indices.data());
}

TEST(CpuTopK, RandomRowsEveryDTypeAndK) {
  std::mt19937_64 rng(66);
  for (DType dtype : kAllDTypes) {
    for (int64_t k : {1, 5, 64}) {
      for (int64_t n : {64, 100, 1000, 4096, 32000}) {
        for (int64_t inner : {1, 3}) {
          const SoftmaxShape shape{4, n, inner};
          for (const SoftmaxOptions options :
               {SoftmaxOptions{1.0f, false}, SoftmaxOptions{0.7f, true}, SoftmaxOptions{2.5f, false}}) {
            const std::vector<uint8_t> input = testing::RandomTensor(dtype, shape.elements(), rng, 2.0f);
            EXPECT_EQ(RunAndCheck(input, dtype, shape, options, k), "")
                << DTypeName(dtype) << " k=" << k << " n=" << n << " inner=" << inner
                << " t=" << options.temperature << " log=" << options.log;
          }
        }
      }
    }
  }
}

TEST(CpuTopK, SpecialValues) {
  std::mt19937_64 rng(64);
  for (DType dtype : kAllDTypes) {
    for (int64_t k : {1, 5, 64}) {
      for (int64_t n : {64, 333, 5000}) {
        for (int64_t inner : {1, 2}) {
          const SoftmaxShape shape{static_cast<int64_t>(testing::SpecialKind::kCount), n, inner};
          std::vector<uint8_t> input(static_cast<size_t>(shape.elements()) * ItemSize(dtype));
          for (int64_t r = 0; r < shape.rows(); ++r) {
            const int64_t o = r / inner;
            testing::SpecialRow(static_cast<testing::SpecialKind>(o), dtype, n,
                                o * n * inner + r % inner, inner, rng, input.data());
          }
          EXPECT_EQ(RunAndCheck(input, dtype, shape, SoftmaxOptions{1.0f, false}, k), "")
              << DTypeName(dtype) << " k=" << k << " n=" << n << " inner=" << inner;
          EXPECT_EQ(RunAndCheck(input, dtype, shape, SoftmaxOptions{0.5f, true}, k), "")
              << DTypeName(dtype) << " log k=" << k << " n=" << n << " inner=" << inner;
        }
      }
    }
  }
}

TEST(CpuTopK, KEqualsTheRow) {
  std::mt19937_64 rng(3);
  for (DType dtype : kAllDTypes) {
    const SoftmaxShape shape{3, 7, 1};
    const std::vector<uint8_t> input = testing::RandomTensor(dtype, shape.elements(), rng);
    EXPECT_EQ(RunAndCheck(input, dtype, shape, SoftmaxOptions{}, 7), "") << DTypeName(dtype);
  }
}

TEST(CpuTopK, RankKeyOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_GT(TopKRankKey(nan, 5), TopKRankKey(inf, 0));
  EXPECT_GT(TopKRankKey(inf, 5), TopKRankKey(3.0f, 0));
  EXPECT_GT(TopKRankKey(-3.0f, 5), TopKRankKey(-inf, 0));
  EXPECT_GT(TopKRankKey(-inf, 5), 0u);
  EXPECT_GT(TopKRankKey(1.0f, 2), TopKRankKey(1.0f, 3));    // ties: lower index first
  EXPECT_GT(TopKRankKey(-0.0f, 2), TopKRankKey(0.0f, 3));   // -0 equals +0
  EXPECT_GT(TopKRankKey(0.0f, 2), TopKRankKey(-0.0f, 3));
  EXPECT_GT(TopKRankKey(nan, 1), TopKRankKey(-nan, 4));     // every NaN alike
}

}  // namespace
}  // namespace softmax
