#include "client/summary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

namespace {

// Rows whose ranking FormatTopKSummary prints; the rest are counted.
constexpr int64_t kPrintedTopKRows = 8;

std::string FormatTiming(const v1::SoftmaxResponse& response, absl::Duration round_trip) {
  const v1::Timing& timing = response.timing();
  return absl::StrFormat(
      "server:     queue %.3f ms  compute %.3f ms (kernels %.3f ms, dispatch %.3f ms)  "
      "batch %d requests / %d rows\n"
      "round trip: %.3f ms\n",
      timing.queue_ns() / 1e6, timing.compute_ns() / 1e6, timing.kernel_ns() / 1e6,
      timing.dispatch_ns() / 1e6, timing.batch_requests(), timing.batch_rows(),
      absl::ToDoubleMilliseconds(round_trip));
}

// A call's summary: its request id, `body`, then its timing.
std::string FramedSummary(const v1::SoftmaxResponse& response, absl::string_view body,
                          absl::Duration round_trip) {
  return absl::StrCat("request_id: ", response.request_id(), "\n", body,
                      FormatTiming(response, round_trip));
}

std::vector<int64_t> Indices(const v1::TopK& top_k) {
  std::vector<int64_t> indices(top_k.indices().size() / sizeof(int64_t));
  std::memcpy(indices.data(), top_k.indices().data(), indices.size() * sizeof(int64_t));
  return indices;
}

}  // namespace

absl::Status CheckTopKBytes(const v1::TopK& top_k, v1::DType dtype, const SoftmaxShape& view,
                            int64_t k) {
  const int64_t count = view.rows() * k;
  if (top_k.values().dtype() != dtype) {
    return absl::DataLossError("top_k.values: dtype differs from the input's");
  }
  if (absl::Status bytes = CheckTensorBytes(top_k.values()); !bytes.ok()) {
    return absl::DataLossError(absl::StrCat("top_k.values: ", bytes.message()));
  }
  const int64_t item = ItemSize(static_cast<DType>(dtype));
  if (static_cast<int64_t>(top_k.values().data().size()) != count * item ||
      static_cast<int64_t>(top_k.indices().size()) != count * 8) {
    return absl::DataLossError(absl::StrCat("top_k: expected ", count,
                                            " values and indices (rows x k)"));
  }
  for (int64_t index : Indices(top_k)) {
    if (index < 0 || index >= view.n) {
      return absl::DataLossError(
          absl::StrCat("top_k.indices: ", index, " outside [0, ", view.n, ")"));
    }
  }
  return absl::OkStatus();
}

Comparison CompareTopKWithReference(const v1::Tensor& input, const v1::TopK& top_k,
                                    const SoftmaxShape& view, int64_t k,
                                    const SoftmaxOptions& options) {
  const auto dtype = static_cast<DType>(input.dtype());
  std::vector<double> expected(view.elements());
  if (!expected.empty()) {
    ReferenceSoftmax(input.data().data(), dtype, view, options, expected.data());
  }
  return CompareTopK(expected.data(), dtype, top_k, view, k);
}

Comparison CompareTopK(const double* expected, DType dtype, const v1::TopK& top_k,
                       const SoftmaxShape& view, int64_t k) {
  Comparison comparison;
  comparison.elements = view.rows() * k;
  if (comparison.elements == 0) return comparison;
  const std::vector<float> values = TensorToFloats(top_k.values());
  const std::vector<int64_t> indices = Indices(top_k);
  const auto mismatch = [&](int64_t at, double want, double got) {
    if (comparison.mismatches == 0) {
      comparison.first_mismatch = at;
      comparison.first_expected = want;
      comparison.first_actual = got;
    }
    ++comparison.mismatches;
  };
  std::vector<char> returned(view.n);
  for (int64_t o = 0; o < view.outer; ++o) {
    for (int64_t i = 0; i < view.inner; ++i) {
      const int64_t row = o * view.n * view.inner + i;  // element (o, 0, i) of the reference
      const int64_t out = o * k * view.inner + i;       // element (o, 0, i) of the answer
      std::fill(returned.begin(), returned.end(), 0);
      double kth = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = out + j * view.inner;
        const double want = expected[row + indices[at] * view.inner];
        const double got = values[at];
        if (std::isfinite(want) && std::isfinite(got)) {
          comparison.max_abs_error = std::max(comparison.max_abs_error, std::fabs(got - want));
        }
        if (!WithinReferenceTolerance(got, want, dtype)) mismatch(at, want, got);
        returned[indices[at]] = 1;
        kth = want;
      }
      if (std::isnan(kth)) continue;  // a NaN row: every rank is as good
      const double tolerance = kReferenceAbsoluteTolerance +
                               ReferenceRelativeTolerance(dtype) * std::fabs(kth);
      for (int64_t j = 0; j < view.n; ++j) {
        const double want = expected[row + j * view.inner];
        if (!returned[j] && want > kth + tolerance) {
          mismatch(out + (k - 1) * view.inner, want, values[out + (k - 1) * view.inner]);
        }
      }
    }
  }
  return comparison;
}

std::string FormatTopKSummary(const v1::SoftmaxResponse& response, const SoftmaxShape& view,
                              int64_t k, absl::Duration round_trip) {
  const v1::TopK& top_k = response.top_k();
  std::string text;
  absl::StrAppend(&text, "top_k:      ", FormatShape(ShapeOf(top_k.values())), " ",
                  WireDTypeName(top_k.values().dtype()), " values and int64 indices, the ", k,
                  " largest of each of ", view.rows(), " rows of length ", view.n, "\n");
  const std::vector<float> values = TensorToFloats(top_k.values());
  const std::vector<int64_t> indices = Indices(top_k);
  int64_t printed = 0;
  for (int64_t o = 0; o < view.outer && printed < kPrintedTopKRows; ++o) {
    for (int64_t i = 0; i < view.inner && printed < kPrintedTopKRows; ++i, ++printed) {
      absl::StrAppend(&text, absl::StrFormat("row %-7d", o * view.inner + i));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = o * k * view.inner + i + j * view.inner;
        absl::StrAppend(&text, absl::StrFormat(" %.6g@%d", values[at], indices[at]));
      }
      absl::StrAppend(&text, "\n");
    }
  }
  if (view.rows() > printed) {
    absl::StrAppend(&text, "            (", view.rows() - printed, " more rows)\n");
  }
  return FramedSummary(response, text, round_trip);
}

std::string FormatSummary(const v1::SoftmaxResponse& response, const SoftmaxShape& view,
                          bool log, absl::Duration round_trip) {
  const v1::Tensor& output = response.output();
  std::string text;
  absl::StrAppend(&text, "output:     ", FormatShape(ShapeOf(output)), " ",
                  WireDTypeName(output.dtype()), " (", output.data().size(), " bytes)\n");
  const RowSums sums = SumRows(output, view, log);
  absl::StrAppend(&text, "rows:       ", sums.rows, " of length ", view.n, "\n");
  if (sums.rows > sums.nan_rows) {
    absl::StrAppend(&text, absl::StrFormat("row sums:   min %.9g  max %.9g%s\n", sums.min_sum,
                                           sums.max_sum, log ? "  (of exp(y))" : ""));
  }
  if (sums.nan_rows > 0) absl::StrAppend(&text, "nan rows:   ", sums.nan_rows, "\n");
  return FramedSummary(response, text, round_trip);
}

}  // namespace softmax::client
