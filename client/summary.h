// What softmax-client prints about a result, and the numerical check of a
// result against the float64 reference in kernels/.
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_CLIENT_SUMMARY_H_
#define SOFTMAX_CLIENT_SUMMARY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// Row sums of a softmax output (for log-softmax, sums of exp(y)); a correct
// result has every finite row summing to 1 within the dtype's rounding.
struct RowSums {
  int64_t rows = 0;          // rows of length > 0
  int64_t nan_rows = 0;      // rows with a NaN (all -inf rows, NaN inputs)
  double min_sum = 0.0;      // over rows without NaN; 0 when there are none
  double max_sum = 0.0;
};

// REQUIRES: output's bytes match its shape; view.elements() == its element count.
RowSums SumRows(const v1::Tensor& output, const SoftmaxShape& view, bool log);

// Relative tolerance of one result element for a dtype: 1e-5 float32,
// 2e-3 float16, 1.6e-2 bfloat16. An element passes when
// |y - ref| <= 1e-6 + rtol * |ref|, or both are NaN, or both are the same inf.
double RelativeTolerance(v1::DType dtype);

// Outcome of comparing a result with ReferenceSoftmax on the same input.
struct Comparison {
  int64_t elements = 0;
  int64_t mismatches = 0;
  double max_abs_error = 0.0;   // over elements where both are finite
  int64_t first_mismatch = -1;  // flat index, -1 when none
  double first_expected = 0.0;
  double first_actual = 0.0;
};

// REQUIRES: input and output have the same dtype, shape and valid bytes.
Comparison CompareWithReference(const v1::Tensor& input, const v1::Tensor& output,
                                const SoftmaxShape& view, const SoftmaxOptions& options);

// The answer of a request with top_k = `k`: INVALID_ARGUMENT-free when its
// values hold rows * k elements of the input's dtype and its indices rows * k
// int64 in [0, view.n); DATA_LOSS naming what is malformed otherwise.
absl::Status CheckTopKBytes(const v1::TopK& top_k, v1::DType dtype, const SoftmaxShape& view,
                            int64_t k);

// A top K checked against ReferenceSoftmax: each returned value within the
// tolerance of the reference at its index, and no index left out whose
// reference value exceeds that of the K-th returned index by more than the
// tolerance. `elements` counts the returned values; a left-out index that
// should have been returned counts as a mismatch of its row's last rank.
// REQUIRES: CheckTopKBytes passed.
Comparison CompareTopKWithReference(const v1::Tensor& input, const v1::TopK& top_k,
                                    const SoftmaxShape& view, int64_t k,
                                    const SoftmaxOptions& options);
// The same against `expected`, the reference's view.elements() values.
Comparison CompareTopK(const double* expected, DType dtype, const v1::TopK& top_k,
                       const SoftmaxShape& view, int64_t k);

// The summary softmax-client prints for a top K answer: the ranking of the
// first rows (value@index, best first), then the server's timing.
std::string FormatTopKSummary(const v1::SoftmaxResponse& response, const SoftmaxShape& view,
                              int64_t k, absl::Duration round_trip);

// The multi-line summary softmax-client prints for one response.
std::string FormatSummary(const v1::SoftmaxResponse& response, const SoftmaxShape& view,
                          bool log, absl::Duration round_trip);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_SUMMARY_H_
