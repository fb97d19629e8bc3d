#include "client/summary.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/tensor.h"

namespace softmax::client {

RowSums SumRows(const v1::Tensor& output, const SoftmaxShape& view, bool log) {
  RowSums sums;
  if (view.elements() == 0) return sums;
  const std::vector<float> values = TensorToFloats(output);
  bool first = true;
  for (int64_t o = 0; o < view.outer; ++o) {
    for (int64_t i = 0; i < view.inner; ++i) {
      ++sums.rows;
      double sum = 0.0;
      bool has_nan = false;
      const int64_t base = o * view.n * view.inner + i;
      for (int64_t k = 0; k < view.n; ++k) {
        const double y = values[base + k * view.inner];
        if (std::isnan(y)) has_nan = true;
        sum += log ? std::exp(y) : y;
      }
      if (has_nan) {
        ++sums.nan_rows;
        continue;
      }
      if (first || sum < sums.min_sum) sums.min_sum = sum;
      if (first || sum > sums.max_sum) sums.max_sum = sum;
      first = false;
    }
  }
  return sums;
}

double RelativeTolerance(v1::DType dtype) {
  if (dtype == v1::DTYPE_FLOAT16 || dtype == v1::DTYPE_BFLOAT16) {
    return ReferenceRelativeTolerance(static_cast<DType>(dtype));
  }
  return ReferenceRelativeTolerance(DType::kFloat32);
}

Comparison CompareWithReference(const v1::Tensor& input, const v1::Tensor& output,
                                const SoftmaxShape& view, const SoftmaxOptions& options) {
  Comparison comparison;
  comparison.elements = view.elements();
  if (comparison.elements == 0) return comparison;
  std::vector<double> expected(comparison.elements);
  ReferenceSoftmax(input.data().data(), static_cast<DType>(input.dtype()), view, options,
                   expected.data());
  const std::vector<float> actual = TensorToFloats(output);
  for (int64_t i = 0; i < comparison.elements; ++i) {
    const double want = expected[i];
    const double got = actual[i];
    const bool ok = WithinReferenceTolerance(got, want, static_cast<DType>(output.dtype()));
    if (std::isfinite(want) && std::isfinite(got)) {
      comparison.max_abs_error = std::max(comparison.max_abs_error, std::fabs(got - want));
    }
    if (!ok) {
      if (comparison.mismatches == 0) {
        comparison.first_mismatch = i;
        comparison.first_expected = want;
        comparison.first_actual = got;
      }
      ++comparison.mismatches;
    }
  }
  return comparison;
}

std::string FormatSummary(const v1::SoftmaxResponse& response, const SoftmaxShape& view,
                          bool log, absl::Duration round_trip) {
  const v1::Tensor& output = response.output();
  std::string text;
  absl::StrAppend(&text, "request_id: ", response.request_id(), "\n");
  absl::StrAppend(&text, "output:     ", FormatShape(ShapeOf(output)), " ",
                  WireDTypeName(output.dtype()), " (", output.data().size(), " bytes)\n");
  const RowSums sums = SumRows(output, view, log);
  absl::StrAppend(&text, "rows:       ", sums.rows, " of length ", view.n, "\n");
  if (sums.rows > sums.nan_rows) {
    absl::StrAppend(&text, absl::StrFormat("row sums:   min %.9g  max %.9g%s\n", sums.min_sum,
                                           sums.max_sum, log ? "  (of exp(y))" : ""));
  }
  if (sums.nan_rows > 0) absl::StrAppend(&text, "nan rows:   ", sums.nan_rows, "\n");
  const v1::Timing& timing = response.timing();
  absl::StrAppend(&text, absl::StrFormat(
      "server:     queue %.3f ms  compute %.3f ms (kernels %.3f ms, dispatch %.3f ms)  "
      "batch %d requests / %d rows\n",
      timing.queue_ns() / 1e6, timing.compute_ns() / 1e6, timing.kernel_ns() / 1e6,
      timing.dispatch_ns() / 1e6, timing.batch_requests(), timing.batch_rows()));
  absl::StrAppend(&text, absl::StrFormat("round trip: %.3f ms\n",
                                         absl::ToDoubleMilliseconds(round_trip)));
  return text;
}

}  // namespace softmax::client
