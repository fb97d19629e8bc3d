#include "server/rpc/validation.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/rpc/softmax_v1.h"

namespace softmax::server {
namespace {

// What validation derived from a softmax.v1 request, with what the tests
// read of the request beside it.
struct Parsed : ValidatedTensor {
  DType dtype = DType::kFloat32;
  int64_t top_k = 0;
  absl::string_view data;
};

// `message` as softmax.v1's front-end submits it (its input a view of the
// message's data), validated with softmax.v1's field names.
absl::StatusOr<Parsed> ParseRequest(const v1::SoftmaxRequest& message,
                                    const RequestLimits& limits) {
  InferenceRequest request;
  absl::Status status = HeaderFromSoftmaxV1(message, &request);
  request.input.data = message.input().data().data();
  request.input.bytes = static_cast<int64_t>(message.input().data().size());
  if (status.ok()) status = ValidateRequest(&request, limits, kSoftmaxV1Fields);
  if (!status.ok()) return status;
  EXPECT_TRUE(request.tensor.valid);
  Parsed parsed;
  static_cast<ValidatedTensor&>(parsed) = request.tensor;
  parsed.dtype = request.dtype;
  parsed.top_k = request.top_k;
  parsed.data = absl::string_view(request.input.data, static_cast<size_t>(request.input.bytes));
  return parsed;
}

v1::SoftmaxRequest MakeRequest(v1::DType dtype, std::vector<int64_t> shape, int64_t data_bytes) {
  v1::SoftmaxRequest request;
  request.mutable_input()->set_dtype(dtype);
  for (int64_t d : shape) request.mutable_input()->add_shape(d);
  request.mutable_input()->set_data(std::string(static_cast<size_t>(data_bytes), '\0'));
  return request;
}

void ExpectInvalid(const v1::SoftmaxRequest& request, const std::string& field,
                   const RequestLimits& limits = RequestLimits()) {
  absl::StatusOr<Parsed> parsed = ParseRequest(request, limits);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find(field), absl::string_view::npos)
      << "message \"" << parsed.status().message() << "\" does not name " << field;
}

TEST(ValidationTest, AcceptsFloat32MatrixWithDefaults) {
  const v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {2, 3}, 24);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->dtype, DType::kFloat32);
  EXPECT_EQ(parsed->axis, 1);
  EXPECT_EQ(parsed->shape.outer, 2);
  EXPECT_EQ(parsed->shape.n, 3);
  EXPECT_EQ(parsed->shape.inner, 1);
  EXPECT_EQ(parsed->elements, 6);
  EXPECT_EQ(parsed->bytes, 24);
  EXPECT_EQ(parsed->options.temperature, 1.0f);
  EXPECT_FALSE(parsed->options.log);
  EXPECT_EQ(parsed->data.data(), request.input().data().data());  // no copy
}

TEST(ValidationTest, MiddleAndFirstAxes) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_BFLOAT16, {2, 3, 4, 5}, 2 * 120);
  request.set_axis(1);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape.outer, 2);
  EXPECT_EQ(parsed->shape.n, 3);
  EXPECT_EQ(parsed->shape.inner, 20);
  request.set_axis(-4);
  parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->axis, 0);
  EXPECT_EQ(parsed->shape.outer, 1);
  EXPECT_EQ(parsed->shape.n, 2);
  EXPECT_EQ(parsed->shape.inner, 60);
}

TEST(ValidationTest, TemperatureAndLogAreCarried) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT16, {8}, 16);
  request.set_temperature(0.5f);
  request.set_log(true);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.temperature, 0.5f);
  EXPECT_TRUE(parsed->options.log);
}

TEST(ValidationTest, ScalarIsOneRowOfOne) {
  for (int axis : {-1, 0}) {
    v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {}, 4);
    request.set_axis(axis);
    absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->axis, 0);
    EXPECT_EQ(parsed->shape.rows(), 1);
    EXPECT_EQ(parsed->shape.n, 1);
    EXPECT_EQ(parsed->elements, 1);
  }
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {}, 4);
  request.set_axis(1);
  ExpectInvalid(request, "axis");
  request.set_axis(-2);
  ExpectInvalid(request, "axis");
}

TEST(ValidationTest, ZeroSizeTensorsHaveNoRows) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{0}, {0, 5}, {5, 0}, {3, 0, 4}}) {
    const v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, shape, 0);
    absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->elements, 0);
    EXPECT_EQ(parsed->bytes, 0);
    EXPECT_EQ(parsed->shape.rows(), 0);
    EXPECT_EQ(parsed->shape.elements(), 0);
  }
}

TEST(ValidationTest, ZeroSizeWithHugeOtherDimsDoesNotOverflow) {
  // outer * inner would overflow int64 here; the tensor is still empty.
  const int64_t big = int64_t{1} << 40;
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {big, 0, big}, 0);
  request.set_axis(1);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape.rows(), 0);
}

TEST(ValidationTest, ZeroLastDimAfterOverflowingDimsIsEmptyNotOverflow) {
  // The product of the leading dimensions overflows int64 before the 0 is
  // reached; the tensor is empty all the same.
  const int64_t big = int64_t{1} << 62;
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {big, big, 0}, 0);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->elements, 0);
  EXPECT_EQ(parsed->shape.rows(), 0);
}

TEST(ValidationTest, RowOfLengthOne) {
  const v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {7, 1}, 28);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape.rows(), 7);
  EXPECT_EQ(parsed->shape.n, 1);
}

TEST(ValidationTest, RejectsUnspecifiedDType) {
  ExpectInvalid(MakeRequest(v1::DTYPE_UNSPECIFIED, {2}, 8), "input.dtype");
  ExpectInvalid(MakeRequest(static_cast<v1::DType>(42), {2}, 8), "input.dtype");
}

TEST(ValidationTest, RejectsNegativeDimensionNamingIndex) {
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {2, -3}, 0), "input.shape[1]");
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {-1}, 0), "input.shape[0]");
}

TEST(ValidationTest, RejectsElementCountOverflow) {
  const int64_t big = int64_t{1} << 32;
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {big, big}, 0), "input.shape");
  const int64_t max = std::numeric_limits<int64_t>::max();
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT16, {max, 2}, 0), "input.shape");
  // Elements fit, bytes do not.
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {max / 2}, 0), "input.shape");
}

TEST(ValidationTest, RejectsByteCountMismatchWithExpectedAndGot) {
  const v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT16, {2, 3}, 11);
  absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("input.data"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("expected 12"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("got 11"), absl::string_view::npos);
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {2}, 12), "input.data");
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {0}, 4), "input.data");
}

TEST(ValidationTest, RejectsAxisOutOfRange) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {2, 3}, 24);
  for (int axis : {2, -3, 100, std::numeric_limits<int32_t>::min()}) {
    request.set_axis(axis);
    ExpectInvalid(request, "axis");
  }
}

TEST(ValidationTest, RejectsBadTemperature) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {2}, 8);
  for (float t : {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    request.set_temperature(t);
    ExpectInvalid(request, "temperature");
  }
  request.set_temperature(std::numeric_limits<float>::denorm_min());
  EXPECT_TRUE(ParseRequest(request, RequestLimits()).ok());
}

TEST(ValidationTest, RejectsTensorOverLimit) {
  RequestLimits limits;
  limits.max_tensor_bytes = 64;
  EXPECT_TRUE(ParseRequest(MakeRequest(v1::DTYPE_FLOAT32, {16}, 64), limits).ok());
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {17}, 68), "max_tensor_bytes", limits);
  // Declared size over the limit is refused before the data size is looked at.
  ExpectInvalid(MakeRequest(v1::DTYPE_FLOAT32, {1 << 20}, 0), "max_tensor_bytes", limits);
}

// Another protocol's names are used as they are: no softmax.v1 field
// appears in the message of a request whose FieldNames are KServe's.
TEST(ValidationTest, ErrorsNameTheFieldsOfTheRequestsOwnProtocol) {
  FieldNames kserve;
  kserve.id = "id";
  kserve.input = "inputs[0]";
  kserve.shape = "inputs[0].shape";
  kserve.data = "raw_input_contents[0]";
  kserve.axis = "parameters.axis";
  kserve.temperature = "parameters.temperature";
  kserve.top_k = "parameters.top_k";
  kserve.output_region = "outputs[0].parameters.shared_memory_byte_size";
  const std::string data(24, '\0');
  auto expect = [&](InferenceRequest request, const std::string& field,
                    const RequestLimits& limits = RequestLimits()) {
    const absl::Status status = ValidateRequest(&request, limits, kserve);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":") << status;
    EXPECT_EQ(status.message().find("input."), absl::string_view::npos) << status;
    EXPECT_FALSE(request.tensor.valid);
  };
  auto good = [&] {
    InferenceRequest request;
    request.dims = {2, 3};
    request.input.data = data.data();
    request.input.bytes = 24;
    return request;
  };
  InferenceRequest request = good();
  ASSERT_TRUE(ValidateRequest(&request, RequestLimits(), kserve).ok());
  EXPECT_TRUE(request.tensor.valid);
  const std::string long_id(kMaxRequestIdBytes + 1, 'x');
  request = good();
  request.id = long_id;
  expect(std::move(request), "id");
  request = good();
  request.dims = {2, -3};
  expect(std::move(request), "inputs[0].shape[1]");
  request = good();
  request.input.bytes = 20;
  expect(std::move(request), "raw_input_contents[0]");
  request = good();
  expect(std::move(request), "inputs[0]", RequestLimits{8});
  request = good();
  request.axis = 2;
  expect(std::move(request), "parameters.axis");
  request = good();
  request.temperature = 0.0;
  expect(std::move(request), "parameters.temperature");
  request = good();
  request.top_k = 4;
  expect(std::move(request), "parameters.top_k");
  std::string region(16, '\0');
  request = good();
  request.output.region = region.data();
  request.output.region_bytes = 16;
  expect(std::move(request), "outputs[0].parameters.shared_memory_byte_size");
}

TEST(ValidationTest, CountElementsAndNormalizeAxis) {
  EXPECT_EQ(*CountElements({}), 1);
  EXPECT_EQ(*CountElements({2, 3, 4}), 24);
  EXPECT_EQ(*CountElements({0, std::numeric_limits<int64_t>::max()}), 0);
  EXPECT_FALSE(CountElements({std::numeric_limits<int64_t>::max(), 2}).ok());
  EXPECT_EQ(*NormalizeAxis(-1, 3), 2);
  EXPECT_EQ(*NormalizeAxis(0, 0), 0);
  EXPECT_FALSE(NormalizeAxis(3, 3).ok());
}

TEST(ValidationTest, RequestIdOfAtMost256BytesOfUtf8) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {2}, 8);
  request.set_request_id(std::string(kMaxRequestIdBytes, 'x'));
  EXPECT_TRUE(ParseRequest(request, RequestLimits()).ok());
  request.set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  ExpectInvalid(request, "request_id");
  request.set_request_id("caf\xc3\xa9 \xf0\x9f\x98\x80");  // 2- and 4-byte forms
  EXPECT_TRUE(ParseRequest(request, RequestLimits()).ok());
  for (const char* bad : {"\xff", "\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                          "ab\x80", "\xe2\x82"}) {
    request.set_request_id(bad);
    ExpectInvalid(request, "request_id");
  }
}

TEST(ValidationTest, TopKIsBetweenZeroAndTheAxisLength) {
  v1::SoftmaxRequest request = MakeRequest(v1::DTYPE_FLOAT32, {2, 3, 5}, 120);
  request.set_axis(1);
  for (int64_t k : {0, 1, 3}) {
    request.set_top_k(k);
    absl::StatusOr<Parsed> parsed = ParseRequest(request, RequestLimits());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->top_k, k);
  }
  request.set_top_k(4);
  ExpectInvalid(request, "top_k");
  request.set_top_k(-1);
  ExpectInvalid(request, "top_k");
  v1::SoftmaxRequest scalar = MakeRequest(v1::DTYPE_FLOAT32, {}, 4);
  scalar.set_top_k(1);
  EXPECT_TRUE(ParseRequest(scalar, RequestLimits()).ok());
  scalar.set_top_k(2);
  ExpectInvalid(scalar, "top_k");
}

}  // namespace
}  // namespace softmax::server
