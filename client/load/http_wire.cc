#include "client/load/http_wire.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/load/wire.h"

namespace softmax::client {
namespace {

using Json = nlohmann::json;

// The value of header `name` in `line` ("Name: value"), case-insensitively;
// false when the line is another header.
bool HeaderValue(absl::string_view line, absl::string_view name, absl::string_view* value) {
  if (line.size() <= name.size() || line[name.size()] != ':' ||
      !absl::EqualsIgnoreCase(line.substr(0, name.size()), name)) {
    return false;
  }
  *value = absl::StripAsciiWhitespace(line.substr(name.size() + 1));
  return true;
}

// A non-negative length header's value; -1 when it is not one.
int64_t ParseLength(absl::string_view value) {
  int64_t length = -1;
  if (!absl::SimpleAtoi(value, &length) || length < 0) return -1;
  return length;
}

// Decodes the JSON header of a 2xx answer into `response`, whose output's
// data already holds the binary bytes; an empty string when it is well
// formed, else what is wrong.
std::string DecodeOutput(const std::string& json_text, v1::SoftmaxResponse* response) {
  const Json json = Json::parse(json_text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) return "response header: not a JSON object";
  auto outputs = json.find("outputs");
  if (outputs == json.end() || !outputs->is_array() || outputs->empty()) {
    return "response header: no outputs";
  }
  const Json& output = (*outputs)[0];
  if (!output.is_object()) return "outputs[0]: not an object";
  auto datatype = output.find("datatype");
  const v1::DType dtype = datatype != output.end() && datatype->is_string()
                              ? DTypeOfKserveDatatype(datatype->get<std::string>())
                              : v1::DTYPE_UNSPECIFIED;
  if (dtype == v1::DTYPE_UNSPECIFIED) return "outputs[0].datatype: missing or not FP32/FP16/BF16";
  auto shape = output.find("shape");
  if (shape == output.end() || !shape->is_array()) return "outputs[0].shape: missing";
  std::vector<int64_t> dims;
  for (const Json& dim : *shape) {
    if (!dim.is_number_integer()) return "outputs[0].shape: not an array of integers";
    dims.push_back(dim.get<int64_t>());
  }
  int64_t binary_size = -1;
  if (auto p = output.find("parameters"); p != output.end() && p->is_object()) {
    if (auto size = p->find("binary_data_size"); size != p->end() && size->is_number_integer()) {
      binary_size = size->get<int64_t>();
    }
  }
  if (binary_size < 0) {
    return "outputs[0].parameters.binary_data_size: missing (the server did not answer with "
           "binary data)";
  }
  v1::Tensor* tensor = response->mutable_output();
  const int64_t received = static_cast<int64_t>(tensor->data().size());
  if (binary_size != received || outputs->size() != 1) {
    return absl::StrCat("outputs[0].parameters.binary_data_size is ", binary_size, ", but ",
                        received, " bytes of binary data follow the header of ",
                        outputs->size(), " output(s)");
  }
  tensor->set_dtype(dtype);
  for (int64_t d : dims) tensor->add_shape(d);
  return "";
}

}  // namespace

HttpInferRequest HttpInferRequestOf(const v1::SoftmaxRequest& request) {
  const v1::Tensor& input = request.input();
  Json parameters = {{"binary_data_output", true}};
  if (request.has_axis() && request.axis() != -1) parameters["axis"] = request.axis();
  if (request.has_temperature() && request.temperature() != 1.0f) {
    parameters["temperature"] = static_cast<double>(request.temperature());
  }
  const Json header = {
      {"inputs", Json::array({{{"name", "INPUT"},
                               {"datatype", KserveDatatype(input.dtype())},
                               {"shape", std::vector<int64_t>(input.shape().begin(),
                                                              input.shape().end())},
                               {"parameters", {{"binary_data_size", input.data().size()}}}}})},
      {"parameters", parameters}};
  HttpInferRequest http;
  http.path = absl::StrCat("/v2/models/", request.log() ? "log_softmax" : "softmax", "/infer");
  const std::string json = header.dump();
  http.body.reserve(json.size() + input.data().size());
  http.body = json;
  http.header_length = json.size();
  http.body += input.data();
  return http;
}

absl::StatusOr<std::string> ParseHttpTarget(absl::string_view target) {
  const std::string original(target);
  auto invalid = [&original](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target=", original, ": ", why,
        "; --protocol=http wants HOST:PORT of the server's HTTP port (its --http_address)"));
  };
  if (absl::StartsWithIgnoreCase(target, "https://")) {
    return invalid("this client speaks plain HTTP, not TLS");
  }
  absl::ConsumePrefix(&target, "http://");
  absl::ConsumeSuffix(&target, "/");
  if (absl::StrContains(target, '/')) return invalid("a scheme or path other than http://");
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return invalid("no HOST:PORT");
  const absl::string_view host = target.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return invalid("the port is not a number in 1..65535");
  }
  const bool bracketed = absl::StartsWith(host, "[") && absl::EndsWith(host, "]");
  if (!bracketed && absl::StrContains(host, ':')) {
    return invalid("an IPv6 host goes in brackets, e.g. [::1]:8000");
  }
  return absl::StrCat("http://", target);
}

int GrpcCodeOfHttpStatus(int http_status) {
  if (http_status >= 200 && http_status < 300) return 0;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  switch (http_status) {
    case 400: code = absl::StatusCode::kInvalidArgument; break;
    case 401: code = absl::StatusCode::kUnauthenticated; break;
    case 403: code = absl::StatusCode::kPermissionDenied; break;
    case 404: code = absl::StatusCode::kNotFound; break;
    case 409: code = absl::StatusCode::kAlreadyExists; break;
    case 429: code = absl::StatusCode::kResourceExhausted; break;
    case 499: code = absl::StatusCode::kCancelled; break;
    case 500: code = absl::StatusCode::kInternal; break;
    case 501: code = absl::StatusCode::kUnimplemented; break;
    case 503: code = absl::StatusCode::kUnavailable; break;
    case 504: code = absl::StatusCode::kDeadlineExceeded; break;
  }
  return static_cast<int>(code);
}

void HttpResponseReader::Start(v1::SoftmaxResponse* response) {
  // Clear() would free the output message and its string with it.
  std::string data;
  if (response->has_output()) data.swap(*response->mutable_output()->mutable_data());
  response->Clear();
  data.clear();
  response->mutable_output()->mutable_data()->swap(data);
  response_ = response;
  data_ = response->mutable_output()->mutable_data();
  json_.clear();
  http_status_ = 0;
  header_length_ = -1;
  content_length_ = -1;
  body_bytes_ = 0;
  malformed_header_ = false;
}

void HttpResponseReader::OnHeaderLine(absl::string_view line) {
  line = absl::StripTrailingAsciiWhitespace(line);
  if (absl::StartsWith(line, "HTTP/")) {
    // A status line: an interim answer's headers (100 Continue) do not
    // describe the final body.
    const size_t space = line.find(' ');
    int status = 0;
    http_status_ = space != absl::string_view::npos &&
                           absl::SimpleAtoi(line.substr(space + 1, 3), &status)
                       ? status
                       : 0;
    header_length_ = -1;
    content_length_ = -1;
    malformed_header_ = false;
    return;
  }
  absl::string_view value;
  if (HeaderValue(line, "Inference-Header-Content-Length", &value)) {
    header_length_ = ParseLength(value);
    malformed_header_ = malformed_header_ || header_length_ < 0;
  } else if (HeaderValue(line, "Content-Length", &value)) {
    content_length_ = ParseLength(value);
  }
}

bool HttpResponseReader::OnBody(absl::string_view bytes) {
  if (body_bytes_ + static_cast<int64_t>(bytes.size()) > max_body_bytes_) return false;
  if (body_bytes_ == 0 && content_length_ > 0 && header_length_ >= 0 &&
      content_length_ <= max_body_bytes_) {
    // A no-op once the reused string has grown to this size.
    data_->reserve(static_cast<size_t>(std::max<int64_t>(content_length_ - header_length_, 0)));
  }
  // Up to header_length_ bytes of JSON, the rest binary data (all JSON
  // without the header, as in an error answer).
  size_t to_json = bytes.size();
  if (header_length_ >= 0) {
    const int64_t json_left = std::max<int64_t>(header_length_ - body_bytes_, 0);
    to_json = static_cast<size_t>(std::min<int64_t>(json_left, bytes.size()));
  }
  json_.append(bytes.data(), to_json);
  data_->append(bytes.data() + to_json, bytes.size() - to_json);
  body_bytes_ += static_cast<int64_t>(bytes.size());
  return true;
}

int HttpResponseReader::Finish(std::string* error) {
  constexpr int kInternal = static_cast<int>(absl::StatusCode::kInternal);
  if (http_status_ == 0) {
    *error = "no HTTP status line";
    return kInternal;
  }
  if (const int code = GrpcCodeOfHttpStatus(http_status_); code != 0) {
    // The whole body is the error's JSON, whatever a length header said.
    std::string body = json_ + *data_;
    data_->clear();
    const Json json = Json::parse(body, nullptr, false);
    auto message = json.is_object() ? json.find("error") : json.end();
    *error = absl::StrCat("HTTP ", http_status_, ": ",
                          json.is_object() && message != json.end() && message->is_string()
                              ? message->get<std::string>()
                              : absl::StrCat("(no {\"error\"} in the body) ",
                                             body.substr(0, 200)));
    return code;
  }
  if (malformed_header_) {
    *error = "Inference-Header-Content-Length: not a non-negative integer";
    return kInternal;
  }
  if (header_length_ < 0) {
    *error = "no Inference-Header-Content-Length (the server did not answer with binary data)";
    return kInternal;
  }
  if (static_cast<int64_t>(json_.size()) != header_length_) {
    *error = absl::StrCat("Inference-Header-Content-Length is ", header_length_, ", but the body "
                          "has ", json_.size(), " bytes");
    return kInternal;
  }
  *error = DecodeOutput(json_, response_);
  return error->empty() ? 0 : kInternal;
}

}  // namespace softmax::client
