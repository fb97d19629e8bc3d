#include "kernels/cpu_softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace softmax {
namespace {

// Computes one row in double precision, handing each result to `store`.
template <typename Store>
void SoftmaxRow(const void* input, DType dtype, const SoftmaxShape& shape,
                const SoftmaxOptions& options, int64_t row, Store&& store) {
  const int64_t o = row / shape.inner;
  const int64_t i = row % shape.inner;
  const int64_t base = o * shape.n * shape.inner + i;
  const int64_t stride = shape.inner;
  const double inv_t = 1.0 / static_cast<double>(options.temperature);
  auto x = [&](int64_t k) {
    return static_cast<double>(LoadAsFloat(input, dtype, base + k * stride)) * inv_t;
  };
  // NaN-propagating max: once NaN, it stays NaN.
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < shape.n; ++k) {
    const double v = x(k);
    if (std::isnan(v) || v > m) m = v;
    if (std::isnan(m)) break;
  }
  double sum = 0.0;
  for (int64_t k = 0; k < shape.n; ++k) sum += std::exp(x(k) - m);
  const double log_sum = std::log(sum);
  for (int64_t k = 0; k < shape.n; ++k) {
    const double shifted = x(k) - m;
    store(base + k * stride, options.log ? shifted - log_sum : std::exp(shifted) / sum);
  }
}

}  // namespace

void ReferenceSoftmax(const void* input, DType dtype, const SoftmaxShape& shape,
                      const SoftmaxOptions& options, double* output) {
  if (shape.n == 0) return;
  for (int64_t row = 0; row < shape.rows(); ++row) {
    SoftmaxRow(input, dtype, shape, options, row,
               [output](int64_t index, double value) { output[index] = value; });
  }
}

namespace {

// Typed element access, so the dtype switch stays outside the row loops.
struct Float32 {
  static float Load(const void* data, int64_t i) {
    float f;
    std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4);
    return f;
  }
  static void Store(void* data, int64_t i, float v) {
    std::memcpy(static_cast<char*>(data) + 4 * i, &v, 4);
  }
};
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct Half {
  static float Load(const void* data, int64_t i) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
    return ToFloat(h);
  }
  static void Store(void* data, int64_t i, float v) {
    const uint16_t h = FromFloat(v);
    std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2);
  }
};
using Float16 = Half<HalfToFloat, FloatToHalf>;
using BFloat16 = Half<BFloat16ToFloat, FloatToBFloat16>;

// The CPU backend's rows: each element is loaded and converted once into a
// float64 row buffer, exp is taken once per element (in float32, on the
// float64 shift: its relative error stays near 1e-7 wherever the output is
// above the 1e-6 absolute tolerance), sums and logs in float64.
template <typename Access>
void Rows(const void* input, void* output, const SoftmaxShape& shape,
          const SoftmaxOptions& options, int64_t row_begin, int64_t row_end) {
  thread_local std::vector<double> row;
  row.resize(static_cast<size_t>(shape.n));
  const double inv_t = 1.0 / static_cast<double>(options.temperature);
  const int64_t stride = shape.inner;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t base = (r / shape.inner) * shape.n * shape.inner + r % shape.inner;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t k = 0; k < shape.n; ++k) {
      const double v = static_cast<double>(Access::Load(input, base + k * stride)) * inv_t;
      row[k] = v;
      if (v > m || std::isnan(v)) m = std::isnan(m) ? m : v;
    }
    // NaN-propagating max as in the reference: a NaN anywhere wins.
    if (std::isnan(m)) {
      for (int64_t k = 0; k < shape.n; ++k) {
        Access::Store(output, base + k * stride, std::numeric_limits<float>::quiet_NaN());
      }
      continue;
    }
    double sum = 0.0;
    if (options.log) {
      for (int64_t k = 0; k < shape.n; ++k) sum += std::exp(static_cast<float>(row[k] - m));
      const double log_sum = std::log(sum);
      for (int64_t k = 0; k < shape.n; ++k) {
        Access::Store(output, base + k * stride, static_cast<float>(row[k] - m - log_sum));
      }
    } else {
      for (int64_t k = 0; k < shape.n; ++k) {
        const double e = std::exp(static_cast<float>(row[k] - m));
        row[k] = e;
        sum += e;
      }
      const double inv_sum = 1.0 / sum;
      for (int64_t k = 0; k < shape.n; ++k) {
        Access::Store(output, base + k * stride, static_cast<float>(row[k] * inv_sum));
      }
    }
  }
}

}  // namespace

namespace {

// One row's best k (CpuSoftmaxTopKRows): candidates above the bar gather in
// a buffer of 2k + 64 keys, cut to the best k when full (the k-th becoming
// the bar most elements fail with one compare); then its (max, sum) as
// Rows computes them and the k values.
template <typename Access>
void TopKRows(const void* input, const SoftmaxShape& shape, const SoftmaxOptions& options,
              int64_t k, void* values, int64_t* indices, int64_t row_begin, int64_t row_end) {
  thread_local std::vector<uint64_t> keys;
  const size_t capacity = static_cast<size_t>(2 * k + 64);
  const double inv_t = 1.0 / static_cast<double>(options.temperature);
  const int64_t stride = shape.inner;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t o = r / shape.inner;
    const int64_t i = r % shape.inner;
    const int64_t base = o * shape.n * shape.inner + i;
    keys.clear();
    uint64_t bar = 0;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < shape.n; ++j) {
      const float x = Access::Load(input, base + j * stride);
      const double v = static_cast<double>(x) * inv_t;
      if (v > m || std::isnan(v)) m = std::isnan(m) ? m : v;
      const uint64_t key = TopKRankKey(x, j);
      if (key <= bar) continue;
      keys.push_back(key);
      if (keys.size() == capacity) {
        std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<>());
        keys.resize(static_cast<size_t>(k));
        bar = *std::min_element(keys.begin(), keys.end());
      }
    }
    std::sort(keys.begin(), keys.end(), std::greater<>());
    double sum = 0.0;
    if (!std::isnan(m)) {
      for (int64_t j = 0; j < shape.n; ++j) {
        const double v = static_cast<double>(Access::Load(input, base + j * stride)) * inv_t;
        sum += std::exp(static_cast<float>(v - m));
      }
    }
    const double log_sum = std::log(sum);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t index = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(keys[j]));
      const double shifted = static_cast<double>(Access::Load(input, base + index * stride)) * inv_t - m;
      float value = std::numeric_limits<float>::quiet_NaN();
      if (!std::isnan(m)) {
        value = options.log ? static_cast<float>(shifted - log_sum)
                            : static_cast<float>(std::exp(static_cast<float>(shifted)) / sum);
      }
      const int64_t at = (o * k + j) * shape.inner + i;
      Access::Store(values, at, value);
      indices[at] = index;
    }
  }
}

}  // namespace

uint64_t TopKRankKey(float value, int64_t index) {
  uint32_t key = 0xffffffffu;
  if (!std::isnan(value)) {
    const uint32_t bits = FloatToBits(value + 0.0f);  // -0 -> +0
    key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}

void CpuSoftmaxTopKRows(const void* input, DType dtype, const SoftmaxShape& shape,
                        const SoftmaxOptions& options, int64_t k, void* values, int64_t* indices,
                        int64_t row_begin, int64_t row_end) {
  if (k <= 0 || shape.n == 0 || row_begin >= row_end) return;
  switch (dtype) {
    case DType::kFloat32:
      return TopKRows<Float32>(input, shape, options, k, values, indices, row_begin, row_end);
    case DType::kFloat16:
      return TopKRows<Float16>(input, shape, options, k, values, indices, row_begin, row_end);
    case DType::kBFloat16:
      return TopKRows<BFloat16>(input, shape, options, k, values, indices, row_begin, row_end);
  }
}

void CpuSoftmaxRows(const void* input, void* output, DType dtype, const SoftmaxShape& shape,
                    const SoftmaxOptions& options, int64_t row_begin, int64_t row_end) {
  // No rows: nothing to compute, and no row buffer (an empty tensor's n may
  // be huge).
  if (shape.n == 0 || row_begin >= row_end) return;
  switch (dtype) {
    case DType::kFloat32:
      return Rows<Float32>(input, output, shape, options, row_begin, row_end);
    case DType::kFloat16:
      return Rows<Float16>(input, output, shape, options, row_begin, row_end);
    case DType::kBFloat16:
      return Rows<BFloat16>(input, output, shape, options, row_begin, row_end);
  }
}

}  // namespace softmax
