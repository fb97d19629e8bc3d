// Softmax on the CPU: the float64 reference every kernel is tested against, and
// the row routine the CPU backend runs on its worker threads.
//
// A tensor is viewed as [outer, n, inner] and normalised along n (the axis);
// the "rows" are the outer * inner vectors of length n, row r = o * inner + i.
// Semantics follow torch.softmax / torch.log_softmax on x / temperature:
// a NaN anywhere in a row makes the whole row NaN; a row of all -inf gives NaN;
// a +inf entry makes the row NaN (inf - inf); n == 1 gives 1 (log: 0).
//
// Thread-safety: pure functions; concurrent calls on disjoint outputs are safe.
#ifndef SOFTMAX_KERNELS_CPU_SOFTMAX_H_
#define SOFTMAX_KERNELS_CPU_SOFTMAX_H_

#include <cmath>
#include <cstdint>

#include "kernels/dtype.h"

namespace softmax {

// Shape of one softmax problem; every field >= 0.
struct SoftmaxShape {
  int64_t outer = 1;  // product of the dimensions before the axis
  int64_t n = 1;      // length of the axis
  int64_t inner = 1;  // product of the dimensions after the axis
  int64_t rows() const { return outer * inner; }
  int64_t elements() const { return outer * n * inner; }
};

struct SoftmaxOptions {
  float temperature = 1.0f;  // finite, > 0; the caller validates
  bool log = false;          // log-softmax instead of softmax
};

// The accuracy contract against ReferenceSoftmax, shared by every test and by
// the clients' --verify/--check: an element y passes when
//   |y - ref| <= kReferenceAbsoluteTolerance + ReferenceRelativeTolerance(dtype) * |ref|,
// or both are NaN, or both are the same infinity. The relative part is one
// rounding of the output type plus float32 arithmetic.
constexpr double kReferenceAbsoluteTolerance = 1e-6;
inline double ReferenceRelativeTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 1e-5;
    case DType::kFloat16: return 2e-3;
    case DType::kBFloat16: return 1.6e-2;
  }
  return 0;
}

// True when `actual` passes against `expected` under the contract above.
inline bool WithinReferenceTolerance(double actual, double expected, DType dtype) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return expected == actual;
  return std::fabs(actual - expected) <=
         kReferenceAbsoluteTolerance + ReferenceRelativeTolerance(dtype) * std::fabs(expected);
}

// Float64 reference: writes outer * n * inner doubles to `output`, in the
// input's layout. Inputs are read as `dtype` and widened exactly.
void ReferenceSoftmax(const void* input, DType dtype, const SoftmaxShape& shape,
                      const SoftmaxOptions& options, double* output);

// CPU backend kernel: computes rows [row_begin, row_end) with float64
// accumulation and writes them rounded to `dtype` into `output` (same layout
// as `input`). REQUIRES: 0 <= row_begin <= row_end <= shape.rows().
void CpuSoftmaxRows(const void* input, void* output, DType dtype, const SoftmaxShape& shape,
                    const SoftmaxOptions& options, int64_t row_begin, int64_t row_end);

// The top K of softmax rows [row_begin, row_end), as the GPU's fused top K
// (LaunchSoftmaxTopK, kernels/softmax_cuda.h) ranks them: by the input value
// exactly, descending; equal values lower index first (-0 equals +0); NaN
// above every number, NaNs lower index first. Writes, for row r = o * inner
// + i, its k best elements' softmax (or log-softmax) values rounded to
// `dtype` at values[(o * k + j) * inner + i] and their indices along the
// axis at indices[(o * k + j) * inner + i], j = 0 (best) .. k-1. Values as
// CpuSoftmaxRows computes them (a row holding a NaN or +inf is all NaN).
// The indices are the GPU's exactly; the values agree within the reference
// tolerance. REQUIRES: 1 <= k <= shape.n; 0 <= row_begin <= row_end <=
// shape.rows(); values and indices hold shape.outer * k * shape.inner.
void CpuSoftmaxTopKRows(const void* input, DType dtype, const SoftmaxShape& shape,
                        const SoftmaxOptions& options, int64_t k, void* values, int64_t* indices,
                        int64_t row_begin, int64_t row_end);

// The ranking key of the order above: larger key, better element; unique
// per index. For tests and the CPU path.
uint64_t TopKRankKey(float value, int64_t index);

}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CPU_SOFTMAX_H_
