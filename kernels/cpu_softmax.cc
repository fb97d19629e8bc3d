#include "kernels/cpu_softmax.h"

#include <cmath>
#include <limits>

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

void CpuSoftmaxRows(const void* input, void* output, DType dtype, const SoftmaxShape& shape,
                    const SoftmaxOptions& options, int64_t row_begin, int64_t row_end) {
  if (shape.n == 0) return;
  for (int64_t row = row_begin; row < row_end; ++row) {
    SoftmaxRow(input, dtype, shape, options, row, [&](int64_t index, double value) {
      StoreFromFloat(output, dtype, index, static_cast<float>(value));
    });
  }
}

}  // namespace softmax
