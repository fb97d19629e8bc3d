#include "client/tensor.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

TEST(TensorTest, ParsesDtypeNames) {
  EXPECT_EQ(*ParseDType("float32"), v1::DTYPE_FLOAT32);
  EXPECT_EQ(*ParseDType("FP16"), v1::DTYPE_FLOAT16);
  EXPECT_EQ(*ParseDType("bf16"), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(ParseDType("int8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ParsesShapes) {
  EXPECT_EQ(*ParseShape("2,1024"), (std::vector<int64_t>{2, 1024}));
  EXPECT_EQ(*ParseShape(" 3 , 0 ,1"), (std::vector<int64_t>{3, 0, 1}));
  EXPECT_TRUE(ParseShape("")->empty());
  EXPECT_FALSE(ParseShape("2,-1").ok());
  EXPECT_FALSE(ParseShape("2,,3").ok());
  EXPECT_FALSE(ParseShape("x").ok());
  EXPECT_EQ(*ParseShape("64x32000"), (std::vector<int64_t>{64, 32000}));
  EXPECT_EQ(*ParseShape("1x16M"), (std::vector<int64_t>{1, 16 << 20}));
  EXPECT_EQ(*ParseShape("2x3,4k"), (std::vector<int64_t>{2, 3, 4096}));
  EXPECT_FALSE(ParseShape("1x1024:float32").ok());
  EXPECT_FALSE(ParseShape("1xM").ok());
  EXPECT_FALSE(ParseShape("9223372036854775807K").ok());
  EXPECT_EQ(FormatShape({2, 3}), "[2, 3]");
  EXPECT_EQ(FormatShape({}), "[]");
}

TEST(TensorTest, CountsElementsAndDetectsOverflow) {
  EXPECT_EQ(*ElementCount({}), 1);
  EXPECT_EQ(*ElementCount({2, 3, 4}), 24);
  EXPECT_EQ(*ElementCount({INT64_MAX, 0}), 0);
  EXPECT_FALSE(ElementCount({int64_t{1} << 32, int64_t{1} << 32}).ok());
  EXPECT_FALSE(ElementCount({3, -1}).ok());
}

TEST(TensorTest, RandomTensorHasTheRightBytesAndStatistics) {
  RandomTensorOptions options;
  options.shape = {64, 256};
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    options.dtype = dtype;
    absl::StatusOr<v1::Tensor> tensor = MakeRandomTensor(options);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_TRUE(CheckTensorBytes(*tensor).ok());
    EXPECT_EQ(tensor->dtype(), dtype);
    EXPECT_EQ(tensor->data().size(), 64u * 256u * WireItemSize(dtype));
    const std::vector<float> values = TensorToFloats(*tensor);
    double sum = 0, sum_squares = 0;
    for (float v : values) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum_squares += double{v} * v;
    }
    const double mean = sum / values.size();
    const double variance = sum_squares / values.size() - mean * mean;
    EXPECT_NEAR(mean, 0.0, 0.05);
    EXPECT_NEAR(variance, 1.0, 0.05);
  }
  // Same seed, same tensor; another seed, another tensor.
  options.dtype = v1::DTYPE_FLOAT32;
  EXPECT_EQ(MakeRandomTensor(options)->data(), MakeRandomTensor(options)->data());
  RandomTensorOptions other = options;
  other.seed = 7;
  EXPECT_NE(MakeRandomTensor(options)->data(), MakeRandomTensor(other)->data());
}

TEST(TensorTest, RandomTensorEdgeShapes) {
  RandomTensorOptions options;
  options.shape = {};
  EXPECT_EQ(MakeRandomTensor(options)->data().size(), 4u);
  options.shape = {3, 0};
  EXPECT_EQ(MakeRandomTensor(options)->data().size(), 0u);
  options.shape = {int64_t{1} << 40};
  EXPECT_EQ(MakeRandomTensor(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.shape = {2};
  options.dtype = v1::DTYPE_UNSPECIFIED;
  EXPECT_FALSE(MakeRandomTensor(options).ok());
}

TEST(TensorTest, FloatsRoundTripWithRounding) {
  const std::vector<float> values = {1.0f, -2.5f, 0.1f, 65504.0f};
  v1::Tensor f32 = TensorFromFloats(values, {2, 2}, v1::DTYPE_FLOAT32);
  EXPECT_EQ(TensorToFloats(f32), values);
  v1::Tensor f16 = TensorFromFloats(values, {4}, v1::DTYPE_FLOAT16);
  std::vector<float> back = TensorToFloats(f16);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[3], 65504.0f);
  EXPECT_NEAR(back[2], 0.1f, 1e-4f);
  v1::Tensor bf16 = TensorFromFloats(values, {4}, v1::DTYPE_BFLOAT16);
  back = TensorToFloats(bf16);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_NEAR(back[2], 0.1f, 1e-3f);
  // bfloat16 is the high half of the float32.
  EXPECT_EQ(bf16.data().substr(0, 2), std::string("\x80\x3f", 2));
}

TEST(TensorTest, ChecksByteCounts) {
  v1::Tensor tensor = TensorFromFloats({1, 2, 3}, {3}, v1::DTYPE_FLOAT32);
  EXPECT_TRUE(CheckTensorBytes(tensor).ok());
  tensor.mutable_data()->pop_back();
  EXPECT_FALSE(CheckTensorBytes(tensor).ok());
  tensor.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(CheckTensorBytes(tensor).ok());
}

TEST(TensorTest, ViewsAShapeAlongEveryAxis) {
  SoftmaxShape view = *ShapeAlongAxis({2, 3, 4}, -1);
  EXPECT_EQ(view.outer, 6);
  EXPECT_EQ(view.n, 4);
  EXPECT_EQ(view.inner, 1);
  view = *ShapeAlongAxis({2, 3, 4}, 1);
  EXPECT_EQ(view.outer, 2);
  EXPECT_EQ(view.n, 3);
  EXPECT_EQ(view.inner, 4);
  view = *ShapeAlongAxis({2, 3, 4}, -3);
  EXPECT_EQ(view.outer, 1);
  EXPECT_EQ(view.n, 2);
  EXPECT_EQ(view.inner, 12);
  view = *ShapeAlongAxis({}, 0);
  EXPECT_EQ(view.elements(), 1);
  view = *ShapeAlongAxis({4, 0, 3}, 0);
  EXPECT_EQ(view.elements(), 0);
  EXPECT_EQ(view.rows(), 0);
  EXPECT_FALSE(ShapeAlongAxis({2, 3}, 2).ok());
  EXPECT_FALSE(ShapeAlongAxis({2, 3}, -3).ok());
  EXPECT_FALSE(ShapeAlongAxis({}, 1).ok());
}

}  // namespace
}  // namespace softmax::client
