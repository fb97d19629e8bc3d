#include "client/summary.h"

#include <cmath>
#include <limits>

#include "client/tensor.h"
#include "gtest/gtest.h"

namespace softmax::client {
namespace {

TEST(SummaryTest, SumsRowsAlongTheAxis) {
  // Shape [2, 2] normalised along axis 0: columns are the rows.
  v1::Tensor output = TensorFromFloats({0.25f, 0.5f, 0.75f, 0.5f}, {2, 2}, v1::DTYPE_FLOAT32);
  RowSums sums = SumRows(output, *ShapeAlongAxis({2, 2}, 0), false);
  EXPECT_EQ(sums.rows, 2);
  EXPECT_EQ(sums.nan_rows, 0);
  EXPECT_DOUBLE_EQ(sums.min_sum, 1.0);
  EXPECT_DOUBLE_EQ(sums.max_sum, 1.0);
  // Along axis 1 the rows sum to 0.75 and 1.25.
  sums = SumRows(output, *ShapeAlongAxis({2, 2}, 1), false);
  EXPECT_DOUBLE_EQ(sums.min_sum, 0.75);
  EXPECT_DOUBLE_EQ(sums.max_sum, 1.25);
}

TEST(SummaryTest, CountsNanRowsAndSumsExpForLog) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  v1::Tensor output =
      TensorFromFloats({std::log(0.5f), std::log(0.5f), nan, nan}, {2, 2}, v1::DTYPE_FLOAT32);
  RowSums sums = SumRows(output, *ShapeAlongAxis({2, 2}, -1), true);
  EXPECT_EQ(sums.rows, 2);
  EXPECT_EQ(sums.nan_rows, 1);
  EXPECT_NEAR(sums.min_sum, 1.0, 1e-7);
}

TEST(SummaryTest, ComparesWithTheReference) {
  RandomTensorOptions random;
  random.shape = {4, 33};
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    random.dtype = dtype;
    const v1::Tensor input = *MakeRandomTensor(random);
    const SoftmaxShape view = *ShapeAlongAxis(ShapeOf(input), -1);
    SoftmaxOptions options;
    options.temperature = 0.7f;
    // The CPU backend's routine is a correct result: no mismatches.
    v1::Tensor output = input;
    CpuSoftmaxRows(input.data().data(), output.mutable_data()->data(), static_cast<DType>(dtype),
                   view, options, 0, view.rows());
    Comparison comparison = CompareWithReference(input, output, view, options);
    EXPECT_EQ(comparison.elements, 4 * 33);
    EXPECT_EQ(comparison.mismatches, 0) << WireDTypeName(dtype);
    // The input itself is not its softmax.
    comparison = CompareWithReference(input, input, view, options);
    EXPECT_GT(comparison.mismatches, 0);
    EXPECT_GE(comparison.first_mismatch, 0);
  }
}

TEST(SummaryTest, TolerancesPerDtype) {
  EXPECT_EQ(RelativeTolerance(v1::DTYPE_FLOAT32), 1e-5);
  EXPECT_EQ(RelativeTolerance(v1::DTYPE_FLOAT16), 2e-3);
  EXPECT_EQ(RelativeTolerance(v1::DTYPE_BFLOAT16), 1.6e-2);
}

TEST(SummaryTest, FormatsTheSummary) {
  v1::SoftmaxResponse response;
  response.set_request_id("r1");
  *response.mutable_output() = TensorFromFloats({0.5f, 0.5f}, {1, 2}, v1::DTYPE_FLOAT32);
  response.mutable_timing()->set_queue_ns(1500000);
  response.mutable_timing()->set_compute_ns(250000);
  response.mutable_timing()->set_batch_requests(3);
  response.mutable_timing()->set_batch_rows(9);
  response.mutable_timing()->set_kernel_ns(12000);
  response.mutable_timing()->set_dispatch_ns(7000);
  const std::string text =
      FormatSummary(response, *ShapeAlongAxis({1, 2}, -1), false, absl::Milliseconds(2));
  EXPECT_NE(text.find("request_id: r1"), std::string::npos);
  EXPECT_NE(text.find("[1, 2] float32"), std::string::npos);
  EXPECT_NE(text.find("min 1  max 1"), std::string::npos);
  EXPECT_NE(text.find("queue 1.500 ms  compute 0.250 ms (kernels 0.012 ms, dispatch 0.007 ms)  "
                      "batch 3 requests / 9 rows"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace softmax::client
