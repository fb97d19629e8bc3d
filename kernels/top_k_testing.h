// Test helpers shared by the top K tests (cpu_top_k_test, top_k_cuda_test):
// the float64 reference of a row's top K and the inputs with special values.
// Header-only, for tests.
#ifndef SOFTMAX_KERNELS_TOP_K_TESTING_H_
#define SOFTMAX_KERNELS_TOP_K_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"

namespace softmax {
namespace testing {

// Random normal values (sigma) rounded to `dtype`.
inline std::vector<uint8_t> RandomTensor(DType dtype, int64_t count, std::mt19937_64& rng,
                                         float sigma = 1.0f) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * ItemSize(dtype));
  std::normal_distribution<float> normal(0.0f, sigma);
  for (int64_t i = 0; i < count; ++i) StoreFromFloat(bytes.data(), dtype, i, normal(rng));
  return bytes;
}

// Kinds of rows with special values (SpecialRow).
enum class SpecialKind {
  kAllNegInf,     // every element -inf
  kSomeNegInf,    // most elements -inf (a masked vocabulary), some finite
  kNaN,           // one NaN
  kPosInf,        // one +inf
  kAllEqual,      // every element equal: ties decided by index
  kFewValues,     // values from {-1, 0, -0, 1}: many ties, +0 and -0
  kAscending,     // strictly increasing: every element beats the bar
  kCount,
};

// Writes a row of `kind` into elements base + j * stride, j < n.
inline void SpecialRow(SpecialKind kind, DType dtype, int64_t n, int64_t base, int64_t stride,
                       std::mt19937_64& rng, void* data) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    float v = normal(rng);
    switch (kind) {
      case SpecialKind::kAllNegInf: v = -inf; break;
      case SpecialKind::kSomeNegInf: v = (rng() % 16 == 0) ? v : -inf; break;
      case SpecialKind::kAllEqual: v = 0.5f; break;
      case SpecialKind::kFewValues: {
        const float few[] = {-1.0f, 0.0f, -0.0f, 1.0f};
        v = few[rng() % 4];
        break;
      }
      case SpecialKind::kAscending: v = -8.0f + 16.0f * static_cast<float>(j) / static_cast<float>(n); break;
      default: break;
    }
    StoreFromFloat(data, dtype, base + j * stride, v);
  }
  if (kind == SpecialKind::kNaN) {
    StoreFromFloat(data, dtype, base + static_cast<int64_t>(rng() % n) * stride,
                   std::numeric_limits<float>::quiet_NaN());
  }
  if (kind == SpecialKind::kPosInf) {
    StoreFromFloat(data, dtype, base + static_cast<int64_t>(rng() % n) * stride, inf);
  }
}

// The k best indices of row r of [outer, n, inner] by TopKRankKey (the
// order the fused top K promises), best first.
inline std::vector<int64_t> ReferenceTopKIndices(const void* input, DType dtype,
                                                 const SoftmaxShape& shape, int64_t r, int64_t k) {
  const int64_t base = (r / shape.inner) * shape.n * shape.inner + r % shape.inner;
  std::vector<uint64_t> keys(static_cast<size_t>(shape.n));
  for (int64_t j = 0; j < shape.n; ++j) {
    keys[j] = TopKRankKey(LoadAsFloat(input, dtype, base + j * shape.inner), j);
  }
  std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), std::greater<>());
  std::vector<int64_t> indices(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) indices[j] = 0xffffffffu - static_cast<uint32_t>(keys[j]);
  return indices;
}

// Checks a top K answer ([outer, k, inner] values of `dtype` and indices)
// against the float64 reference: the reference's indices exactly, each value
// within the reference tolerance of the reference softmax at its index.
// Returns "" or the first difference.
inline std::string CheckTopK(const void* input, DType dtype, const SoftmaxShape& shape,
                             const SoftmaxOptions& options, int64_t k, const void* values,
                             const int64_t* indices) {
  std::vector<double> reference(static_cast<size_t>(shape.elements()));
  ReferenceSoftmax(input, dtype, shape, options, reference.data());
  for (int64_t r = 0; r < shape.rows(); ++r) {
    const int64_t o = r / shape.inner;
    const int64_t i = r % shape.inner;
    const std::vector<int64_t> expected = ReferenceTopKIndices(input, dtype, shape, r, k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = (o * k + j) * shape.inner + i;
      if (indices[at] != expected[j]) {
        return "row " + std::to_string(r) + " rank " + std::to_string(j) + ": index " +
               std::to_string(indices[at]) + ", expected " + std::to_string(expected[j]);
      }
      const double ref = reference[(o * shape.n + expected[j]) * shape.inner + i];
      const double got = LoadAsFloat(values, dtype, at);
      if (!WithinReferenceTolerance(got, ref, dtype)) {
        return "row " + std::to_string(r) + " rank " + std::to_string(j) + ": value " +
               std::to_string(got) + ", reference " + std::to_string(ref);
      }
    }
  }
  return "";
}

}  // namespace testing
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_TOP_K_TESTING_H_
