#include "client/load/http_wire.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace softmax::client {
namespace {

using Json = nlohmann::json;
using namespace std::string_literals;

v1::SoftmaxRequest SampleRequest(v1::DType dtype, std::vector<int64_t> shape, size_t bytes) {
  v1::SoftmaxRequest request;
  request.mutable_input()->set_dtype(dtype);
  for (int64_t d : shape) request.mutable_input()->add_shape(d);
  std::string data(bytes, '\0');
  // Every byte value, NUL and CR LF among them: the data is raw, not text.
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  request.mutable_input()->set_data(data);
  return request;
}

// The header of `request`'s body, parsed.
Json HeaderOf(const HttpInferRequest& request) {
  return Json::parse(request.body.substr(0, request.header_length));
}

TEST(HttpInferRequestTest, JsonHeaderThenTheTensorsBytes) {
  const v1::SoftmaxRequest request = SampleRequest(v1::DTYPE_BFLOAT16, {64, 320}, 64 * 320 * 2);
  const HttpInferRequest http = HttpInferRequestOf(request);
  EXPECT_EQ(http.path, "/v2/models/softmax/infer");
  ASSERT_LT(http.header_length, http.body.size());
  EXPECT_EQ(http.body.substr(http.header_length), request.input().data());
  const Json header = HeaderOf(http);
  ASSERT_EQ(header["inputs"].size(), 1u);
  const Json& input = header["inputs"][0];
  EXPECT_EQ(input["name"], "INPUT");
  EXPECT_EQ(input["datatype"], "BF16");
  EXPECT_EQ(input["shape"], Json::array({64, 320}));
  EXPECT_EQ(input["parameters"]["binary_data_size"], 64 * 320 * 2);
  EXPECT_FALSE(input.contains("data"));
  EXPECT_EQ(header["parameters"]["binary_data_output"], true);
  // Defaults are left to the server.
  EXPECT_FALSE(header["parameters"].contains("axis"));
  EXPECT_FALSE(header["parameters"].contains("temperature"));
}

TEST(HttpInferRequestTest, LogAxisAndTemperatureAsModelAndParameters) {
  v1::SoftmaxRequest request = SampleRequest(v1::DTYPE_FLOAT16, {3, 5}, 30);
  request.set_log(true);
  request.set_axis(0);
  request.set_temperature(0.5f);
  const HttpInferRequest http = HttpInferRequestOf(request);
  EXPECT_EQ(http.path, "/v2/models/log_softmax/infer");
  const Json header = HeaderOf(http);
  EXPECT_EQ(header["inputs"][0]["datatype"], "FP16");
  EXPECT_EQ(header["parameters"]["axis"], 0);
  EXPECT_EQ(header["parameters"]["temperature"], 0.5);
}

TEST(HttpInferRequestTest, Float32AndAnEmptyTensor) {
  const HttpInferRequest http = HttpInferRequestOf(SampleRequest(v1::DTYPE_FLOAT32, {0, 4}, 0));
  EXPECT_EQ(http.header_length, http.body.size());
  const Json header = HeaderOf(http);
  EXPECT_EQ(header["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(header["inputs"][0]["parameters"]["binary_data_size"], 0);
}

TEST(ParseHttpTargetTest, HostPortAndHttpUrls) {
  EXPECT_EQ(*ParseHttpTarget("localhost:8000"), "http://localhost:8000");
  EXPECT_EQ(*ParseHttpTarget("http://127.0.0.1:8000/"), "http://127.0.0.1:8000");
  EXPECT_EQ(*ParseHttpTarget("[::1]:8000"), "http://[::1]:8000");
}

TEST(ParseHttpTargetTest, RefusesWhatIsNotAPlainHttpHostPort) {
  for (const char* target : {"https://host:8443", "dns:///host:8000", "host", "host:0",
                             "host:70000", "host:http", ":8000", "host:8000/v2", "::1:8000",
                             "unix:/tmp/socket"}) {
    const absl::StatusOr<std::string> parsed = ParseHttpTarget(target);
    ASSERT_FALSE(parsed.ok()) << target;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("--target="), absl::string_view::npos);
  }
}

TEST(GrpcCodeOfHttpStatusTest, InvertsTheServersMapping) {
  EXPECT_EQ(GrpcCodeOfHttpStatus(200), 0);
  EXPECT_EQ(GrpcCodeOfHttpStatus(400), 3);
  EXPECT_EQ(GrpcCodeOfHttpStatus(401), 16);
  EXPECT_EQ(GrpcCodeOfHttpStatus(404), 5);
  EXPECT_EQ(GrpcCodeOfHttpStatus(500), 13);
  EXPECT_EQ(GrpcCodeOfHttpStatus(503), 14);
  EXPECT_EQ(GrpcCodeOfHttpStatus(504), 4);
  EXPECT_EQ(GrpcCodeOfHttpStatus(302), 2);
}

// A binary inference answer as the server sends it: header lines and body.
struct Wire {
  std::vector<std::string> headers;
  std::string body;
};

Wire BinaryAnswer(const std::string& data, const std::string& datatype = "BF16",
                  const Json& shape = Json::array({2, 3})) {
  const Json header = {
      {"model_name", "softmax"},
      {"model_version", "1"},
      {"outputs", Json::array({{{"name", "OUTPUT"},
                                {"datatype", datatype},
                                {"shape", shape},
                                {"parameters", {{"binary_data_size", data.size()}}}}})}};
  Wire wire;
  const std::string json = header.dump();
  wire.body = json + data;
  wire.headers = {"HTTP/1.1 200 OK\r\n", "Content-Type: application/octet-stream\r\n",
                  "Content-Length: " + std::to_string(wire.body.size()) + "\r\n",
                  "Inference-Header-Content-Length: " + std::to_string(json.size()) + "\r\n",
                  "\r\n"};
  return wire;
}

// Feeds `wire` to a reader in body chunks of `chunk` bytes.
int Read(const Wire& wire, size_t chunk, v1::SoftmaxResponse* response, std::string* error,
         HttpResponseReader* reader) {
  reader->Start(response);
  for (const std::string& line : wire.headers) reader->OnHeaderLine(line);
  for (size_t at = 0; at < wire.body.size(); at += chunk) {
    if (!reader->OnBody(absl::string_view(wire.body).substr(at, chunk))) return -1;
  }
  return reader->Finish(error);
}

TEST(HttpResponseReaderTest, SplitsTheHeaderFromTheBinaryDataAtAnyChunking) {
  const std::string data = "\r\n\0abc\r\n\r\nxyz"s;  // 12 bytes: 2 x 3 BF16
  const Wire wire = BinaryAnswer(data);
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, wire.body.size()}) {
    HttpResponseReader reader;
    v1::SoftmaxResponse response;
    std::string error;
    ASSERT_EQ(Read(wire, chunk, &response, &error, &reader), 0) << chunk << ": " << error;
    EXPECT_EQ(reader.http_status(), 200);
    EXPECT_EQ(response.output().dtype(), v1::DTYPE_BFLOAT16);
    EXPECT_EQ(std::vector<int64_t>(response.output().shape().begin(),
                                   response.output().shape().end()),
              (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(response.output().data(), data) << chunk;
  }
}

TEST(HttpResponseReaderTest, ReusesTheOutputBufferAcrossResponses) {
  HttpResponseReader reader;
  v1::SoftmaxResponse response;
  std::string error;
  const std::string big(1 << 16, 'x');
  ASSERT_EQ(Read(BinaryAnswer(big, "FP32", Json::array({1, 1 << 14})), 4096, &response, &error,
                 &reader),
            0)
      << error;
  const char* buffer = response.output().data().data();
  const std::string small(12, 'y');
  ASSERT_EQ(Read(BinaryAnswer(small, "FP16", Json::array({6})), 5, &response, &error, &reader),
            0)
      << error;
  EXPECT_EQ(response.output().data(), small);
  EXPECT_EQ(response.output().data().data(), buffer);
  EXPECT_EQ(response.output().dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(response.output().shape_size(), 1);
}

TEST(HttpResponseReaderTest, AnErrorBodyGivesItsMessageAndTheStatusCode) {
  Wire wire;
  wire.body = R"({"error":"inputs[0].shape: 3 x 5 holds 15 elements"})";
  wire.headers = {"HTTP/1.1 400 Bad Request\r\n", "Content-Type: application/json\r\n",
                  "Content-Length: " + std::to_string(wire.body.size()) + "\r\n", "\r\n"};
  HttpResponseReader reader;
  v1::SoftmaxResponse response;
  std::string error;
  EXPECT_EQ(Read(wire, 5, &response, &error, &reader), 3);  // INVALID_ARGUMENT
  EXPECT_EQ(error, "HTTP 400: inputs[0].shape: 3 x 5 holds 15 elements");
  EXPECT_TRUE(response.output().data().empty());

  wire.body = "upstream gone";
  wire.headers = {"HTTP/1.1 503 Service Unavailable\r\n", "\r\n"};
  EXPECT_EQ(Read(wire, 100, &response, &error, &reader), 14);  // UNAVAILABLE
  EXPECT_NE(error.find("HTTP 503: (no {\"error\"} in the body) upstream gone"), std::string::npos)
      << error;
}

TEST(HttpResponseReaderTest, AnInterimStatusDoesNotDescribeTheBody) {
  Wire wire = BinaryAnswer(std::string(12, 'z'));
  wire.headers.insert(wire.headers.begin(), {"HTTP/1.1 100 Continue\r\n",
                                             "Inference-Header-Content-Length: 3\r\n", "\r\n"});
  HttpResponseReader reader;
  v1::SoftmaxResponse response;
  std::string error;
  ASSERT_EQ(Read(wire, 3, &response, &error, &reader), 0) << error;
  EXPECT_EQ(response.output().data(), std::string(12, 'z'));
}

TEST(HttpResponseReaderTest, MalformedAnswersAreInternalErrors) {
  struct Case {
    const char* name;
    Wire wire;
    const char* expected;
  };
  std::vector<Case> cases;
  {
    Wire wire = BinaryAnswer(std::string(12, 'a'));
    wire.headers.erase(wire.headers.begin() + 3);  // no Inference-Header-Content-Length
    cases.push_back({"json only", wire, "no Inference-Header-Content-Length"});
  }
  {
    Wire wire = BinaryAnswer(std::string(12, 'a'));
    wire.body.pop_back();  // 11 bytes after the header, 12 announced
    cases.push_back({"short data", wire, "binary_data_size is 12, but 11 bytes"});
  }
  {
    Wire wire = BinaryAnswer(std::string(12, 'a'), "INT8");
    cases.push_back({"datatype", wire, "outputs[0].datatype"});
  }
  {
    Wire wire = BinaryAnswer(std::string(12, 'a'));
    wire.headers[3] = "Inference-Header-Content-Length: many\r\n";
    cases.push_back({"length header", wire, "Inference-Header-Content-Length: not"});
  }
  {
    Wire wire = BinaryAnswer(std::string(12, 'a'));
    wire.headers[3] = "Inference-Header-Content-Length: 100000\r\n";
    cases.push_back({"header beyond the body", wire, "Inference-Header-Content-Length is 100000"});
  }
  {
    Wire wire;
    wire.body = R"({"outputs":[{"name":"OUTPUT","datatype":"FP32","shape":[2],"data":[0.5,0.5]}]})";
    wire.headers = {"HTTP/1.1 200 OK\r\n", "\r\n"};
    cases.push_back({"json data", wire, "did not answer with binary data"});
  }
  {
    Wire wire;
    wire.headers = {"\r\n"};
    cases.push_back({"no status", wire, "no HTTP status line"});
  }
  for (const Case& c : cases) {
    HttpResponseReader reader;
    v1::SoftmaxResponse response;
    std::string error;
    EXPECT_EQ(Read(c.wire, 4, &response, &error, &reader), 13) << c.name;
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.name << ": " << error;
  }
}

TEST(HttpResponseReaderTest, RefusesABodyOverTheLimit) {
  const Wire wire = BinaryAnswer(std::string(1000, 'q'));
  HttpResponseReader reader;
  reader.set_max_body_bytes(static_cast<int64_t>(wire.body.size()) - 1);
  v1::SoftmaxResponse response;
  std::string error;
  EXPECT_EQ(Read(wire, 100, &response, &error, &reader), -1);
  reader.set_max_body_bytes(static_cast<int64_t>(wire.body.size()));
  EXPECT_EQ(Read(wire, 100, &response, &error, &reader), 0) << error;
}

}  // namespace
}  // namespace softmax::client
