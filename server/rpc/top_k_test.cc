#include "server/rpc/top_k.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

TEST(TopKTest, SortsDescendingWithTiesByLowerIndex) {
  // Row 0 holds ties (0.25 at 1, 3 and 4; +0 and -0 at 0 and 5).
  const std::vector<float> data = {0.0f, 0.25f, 0.5f, 0.25f, 0.25f, -0.0f,
                                   0.1f, 0.2f,  0.3f, 0.4f,  0.5f,  0.6f};
  std::vector<float> values(2 * 4);
  std::vector<int64_t> indices(2 * 4);
  SelectTopK(data.data(), DType::kFloat32, SoftmaxShape{2, 6, 1}, 4, values.data(),
             indices.data());
  EXPECT_EQ(indices, (std::vector<int64_t>{2, 1, 3, 4, 5, 4, 3, 2}));
  EXPECT_EQ(values, (std::vector<float>{0.5f, 0.25f, 0.25f, 0.25f, 0.6f, 0.5f, 0.4f, 0.3f}));

  SelectTopK(data.data(), DType::kFloat32, SoftmaxShape{1, 6, 1}, 6, values.data(),
             indices.data());
  // +0 (index 0) and -0 (index 5) are equal: lower index first.
  EXPECT_EQ(indices[4], 0);
  EXPECT_EQ(indices[5], 5);
}

TEST(TopKTest, NanRanksFirstAndRowsAlongAnInnerAxis) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // [outer 1, n 3, inner 2]: rows are columns {1, nan, 2} and {5, 4, 6}.
  const std::vector<float> data = {1.0f, 5.0f, nan, 4.0f, 2.0f, 6.0f};
  std::vector<float> values(2 * 2);
  std::vector<int64_t> indices(2 * 2);
  SelectTopK(data.data(), DType::kFloat32, SoftmaxShape{1, 3, 2}, 2, values.data(),
             indices.data());
  // Output layout [1, k=2, 2]: (rank 0, col 0), (rank 0, col 1), (rank 1, ...).
  EXPECT_EQ(indices, (std::vector<int64_t>{1, 2, 2, 0}));
  EXPECT_TRUE(std::isnan(values[0]));
  EXPECT_EQ(values[1], 6.0f);
  EXPECT_EQ(values[2], 2.0f);
  EXPECT_EQ(values[3], 5.0f);
}

TEST(TopKTest, MatchesAFullSortInEveryDtypeAndCopiesTheBits) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(0, 40);  // many exact ties once rounded
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const int64_t n = 301;
    const int64_t k = 17;
    std::vector<uint32_t> storage(n);  // big enough for any dtype
    char* bytes = reinterpret_cast<char*>(storage.data());
    std::vector<float> widened(n);
    for (int64_t j = 0; j < n; ++j) {
      const float v = static_cast<float>(small(rng)) / 64.0f + 1e-3f * static_cast<float>(j % 3);
      if (dtype == DType::kFloat32) {
        std::memcpy(bytes + 4 * j, &v, 4);
      } else {
        const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
        std::memcpy(bytes + 2 * j, &h, 2);
      }
      widened[j] = LoadAsFloat(bytes, dtype, j);
    }
    std::vector<int64_t> expected(n);
    for (int64_t j = 0; j < n; ++j) expected[j] = j;
    std::stable_sort(expected.begin(), expected.end(),
                     [&](int64_t a, int64_t b) { return widened[a] > widened[b]; });
    std::vector<uint32_t> values(k);
    std::vector<int64_t> indices(k);
    SelectTopK(bytes, dtype, SoftmaxShape{1, n, 1}, k, values.data(), indices.data());
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(indices[j], expected[j]) << DTypeName(dtype) << " rank " << j;
      EXPECT_EQ(std::memcmp(reinterpret_cast<char*>(values.data()) + j * ItemSize(dtype),
                            bytes + indices[j] * ItemSize(dtype), ItemSize(dtype)),
                0);
    }
  }
}

TEST(TopKTest, EveryKOfRandomRowsWithNansTiesAndAnInnerAxisMatchesASort) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> pick(0, 99);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Contiguous rows (scanned in blocks) and rows along an inner axis.
  for (int64_t inner : {1, 2}) {
    const int64_t outer = 3, n = 1000;
    std::vector<float> data(outer * n * inner);
    for (float& x : data) {
      const int p = pick(rng);
      // Mostly distinct values, some ties, a few NaN and infinities.
      x = p == 0 ? nan : p == 1 ? -INFINITY : p < 20 ? 0.25f : static_cast<float>(rng()) / 4e9f;
    }
    // Row 0 has no NaN, so that its bar is a number when a larger value comes late.
    for (int64_t j = 0; j < n * inner; ++j) {
      if (std::isnan(data[j])) data[j] = 0.5f;
    }
    data[(n - 1) * inner] = 2.0f;
    for (int64_t k : {1, 2, 7, 64, 333, 999, 1000}) {
      std::vector<float> values(outer * k * inner);
      std::vector<int64_t> indices(outer * k * inner);
      SelectTopK(data.data(), DType::kFloat32, SoftmaxShape{outer, n, inner}, k, values.data(),
                 indices.data());
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          std::vector<int64_t> order(n);
          for (int64_t j = 0; j < n; ++j) order[j] = j;
          const auto at = [&](int64_t j) { return data[(o * n + j) * inner + i]; };
          std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            if (std::isnan(at(a)) != std::isnan(at(b))) return std::isnan(at(a));
            return at(a) > at(b);
          });
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(indices[(o * k + j) * inner + i], order[j])
                << "inner " << inner << " k " << k << " row " << o << "," << i << " rank " << j;
          }
        }
      }
    }
  }
}

TEST(TopKTest, DimsReplaceTheAxis) {
  EXPECT_EQ(TopKDims({4, 32000}, 1, 5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(TopKDims({2, 7, 3}, 1, 2), (std::vector<int64_t>{2, 2, 3}));
  EXPECT_TRUE(TopKDims({}, 0, 1).empty());
}

}  // namespace
}  // namespace softmax::server
