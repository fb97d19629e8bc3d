// The HTTP infer request parser, without a server.
#include "server/rpc/http/kserve_http.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

absl::Status Parse(const std::string& body, kserve::InferRequestParts* parts,
                   HttpInferOptions* options, int64_t header_length = -1) {
  return ParseHttpInferRequest(
      body, header_length < 0 ? static_cast<int64_t>(body.size()) : header_length, parts,
      options);
}

TEST(KServeHttpTest, JsonTensorNestedOrFlatWithParameters) {
  kserve::InferRequestParts parts;
  HttpInferOptions options;
  const absl::Status status = Parse(
      R"({"id": "a", "parameters": {"axis": 0, "temperature": 2, "binary_data_output": true},
          "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
                      "data": [[1, 2], [3, 4]]}],
          "outputs": [{"name": "OUTPUT"}]})",
      &parts, &options);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(parts.id, "a");
  EXPECT_EQ(parts.axis, 0);
  EXPECT_EQ(parts.temperature, 2.0);
  EXPECT_TRUE(options.binary_output);
  EXPECT_EQ(parts.input_count, 1);
  EXPECT_EQ(parts.input_shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(parts.requested_outputs, std::vector<std::string>{"OUTPUT"});
  ASSERT_EQ(parts.input_data.size(), 16u);
  float third;
  std::memcpy(&third, parts.input_data.data() + 8, 4);
  EXPECT_EQ(third, 3.0f);
  EXPECT_EQ(parts.data_field, "inputs[0].data");
}

TEST(KServeHttpTest, Fp16JsonIsRoundedAndBinaryDataFollowsTheHeader) {
  kserve::InferRequestParts parts;
  HttpInferOptions options;
  ASSERT_TRUE(Parse(R"({"inputs": [{"name": "x", "datatype": "FP16", "shape": [1],
                                    "data": [1.0]}]})",
                    &parts, &options)
                  .ok());
  EXPECT_EQ(parts.input_data, std::string("\x00\x3c", 2));

  const std::string header =
      R"({"inputs": [{"name": "x", "datatype": "BF16", "shape": [2],
                      "parameters": {"binary_data_size": 4}}],
          "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": true}}]})";
  kserve::InferRequestParts binary;
  HttpInferOptions binary_options;
  ASSERT_TRUE(ParseHttpInferRequest(header + "abcd", static_cast<int64_t>(header.size()),
                                    &binary, &binary_options)
                  .ok());
  EXPECT_EQ(binary.input_data, "abcd");
  EXPECT_TRUE(binary_options.binary_output);
  EXPECT_EQ(binary.data_field, "inputs[0] binary data");
}

TEST(KServeHttpTest, RefusesMalformedBodiesNamingTheField) {
  struct Case {
    std::string header;  // the JSON
    std::string binary;  // what follows it
    const char* field;
  };
  const Case cases[] = {
      {"{not json", "", "JSON"},
      {"[]", "", "JSON object"},
      {R"({"inputs": 3})", "", "inputs"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1]}]})", "", "inputs[0].data"},
      {R"({"inputs": [{"shape": [1], "data": [1]}]})", "", "inputs[0].datatype"},
      {R"({"inputs": [{"datatype": "INT8", "shape": [1], "data": [1]}]})", "",
       "inputs[0].datatype"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1.5], "data": [1]}]})", "",
       "inputs[0].shape"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": ["x"]}]})", "",
       "inputs[0].data"},
      {R"({"parameters": {"axis": 1.5}, "inputs": []})", "", "parameters.axis"},
      {R"({"parameters": {"temperature": "hot"}, "inputs": []})", "", "parameters.temperature"},
      {R"({"outputs": [{}], "inputs": []})", "", "outputs[0].name"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})", "xxxx",
       "binary_data_size"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1],
                       "parameters": {"binary_data_size": 8}}]})",
       "xxxx", "binary_data_size"},
      {R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1],
                       "parameters": {"binary_data_size": 4}}]})",
       "xxxx", "both"},
  };
  for (const Case& c : cases) {
    kserve::InferRequestParts parts;
    HttpInferOptions options;
    const absl::Status status =
        Parse(c.header + c.binary, &parts, &options, static_cast<int64_t>(c.header.size()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_NE(status.message().find(c.field), absl::string_view::npos)
        << c.header << ": " << status;
  }
  kserve::InferRequestParts parts;
  HttpInferOptions options;
  EXPECT_FALSE(ParseHttpInferRequest("{}", 3, &parts, &options).ok());
  // Nesting far beyond any rank is refused, not recursed into.
  const std::string deep = R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": )" +
                           std::string(5000, '[') + "1" + std::string(5000, ']') + "}]}";
  const absl::Status status = Parse(deep, &parts, &options);
  EXPECT_NE(status.message().find("nested deeper"), absl::string_view::npos) << status;
}

// binary_data_size must equal the bytes after the JSON header exactly: a
// smaller size would leave bytes of the body unread (or read as the tensor),
// a larger one would read past the body.
TEST(KServeHttpTest, BinaryDataSizeOtherThanTheBytesAfterTheHeaderIsRefused) {
  const std::string header =
      R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                      "parameters": {"binary_data_size": 4}}]})";
  for (const std::string& binary : std::vector<std::string>{"abcdefgh", "ab"}) {
    kserve::InferRequestParts parts;
    HttpInferOptions options;
    const absl::Status status =
        Parse(header + binary, &parts, &options, static_cast<int64_t>(header.size()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << binary.size();
    EXPECT_NE(status.message().find("inputs[0].parameters.binary_data_size: 4 bytes, but the "
                                    "body holds " + std::to_string(binary.size()) + " bytes"),
              absl::string_view::npos)
        << status;
    EXPECT_TRUE(parts.input_data.empty()) << binary.size();
  }
  kserve::InferRequestParts parts;
  HttpInferOptions options;
  ASSERT_TRUE(Parse(header + "abcd", &parts, &options, static_cast<int64_t>(header.size())).ok());
  EXPECT_EQ(parts.input_data, "abcd");
}

}  // namespace
}  // namespace softmax::server
