// The load engine's messages for --protocol=http: the Open Inference
// Protocol's HTTP/REST inference call (POST /v2/models/{model}/infer) with
// the binary tensor data extension both ways, without gRPC or an HTTP library.
//
// A request body is a JSON header followed by the input tensor's raw bytes;
// the header's length goes in the Inference-Header-Content-Length HTTP header
// and the input's parameters.binary_data_size says how many bytes follow it.
// The request asks for binary output (parameters.binary_data_output), so the
// answer is laid out the same way: Inference-Header-Content-Length bytes of
// JSON, then the output's binary_data_size raw bytes. An error is a JSON body
// {"error": "..."} under a non-2xx status.
//
// HttpResponseReader takes a response as it arrives (header lines, then body
// chunks) and writes the tensor's bytes straight into the output string of a
// SoftmaxResponse it reuses, so a multi-megabyte answer is copied once, from
// the socket's buffer to its place, and no buffer is allocated per response
// once the string has grown.
//
// Thread-safety: HttpInferRequestOf, ParseHttpTarget and GrpcCodeOfHttpStatus
// are pure functions; an HttpResponseReader is used by one thread at a time.
#ifndef SOFTMAX_CLIENT_LOAD_HTTP_WIRE_H_
#define SOFTMAX_CLIENT_LOAD_HTTP_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// One inference request on the wire, built once per payload.
struct HttpInferRequest {
  std::string path;          // "/v2/models/softmax/infer" or ".../log_softmax/infer"
  std::string body;          // the JSON header, then the input tensor's bytes
  size_t header_length = 0;  // bytes of JSON: Inference-Header-Content-Length
};

// The request equivalent to `request` (as KserveRequestOf's for gRPC): model
// "softmax" or "log_softmax", its input as INPUT with binary_data_size, axis
// and temperature as request parameters when they differ from the defaults,
// and binary_data_output set.
HttpInferRequest HttpInferRequestOf(const v1::SoftmaxRequest& request);

// "http://HOST:PORT" for a load --target given as HOST:PORT (an IPv6 host in
// brackets) or http://HOST:PORT. INVALID_ARGUMENT, naming --target, for
// anything else: https (this client speaks plain HTTP), other schemes, a
// path, or a port outside 1..65535.
absl::StatusOr<std::string> ParseHttpTarget(absl::string_view target);

// The gRPC status code (0..16) an HTTP status stands for: the inverse of the
// server's mapping (server/rpc/kserve.cc, HttpStatus), e.g. 400
// INVALID_ARGUMENT, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED; 2xx is 0; any
// other status UNKNOWN.
int GrpcCodeOfHttpStatus(int http_status);

// Reads one HTTP response of the inference call into a SoftmaxResponse.
class HttpResponseReader {
 public:
  // Starts a response that fills `response`: it is cleared except for the
  // capacity of its output's data string, which the binary data fills.
  // `response` must outlive the Finish call.
  void Start(v1::SoftmaxResponse* response);

  // One header line as received, with or without its CRLF: the status line
  // ("HTTP/1.1 200 OK"; a new one, as after "100 Continue", starts the
  // headers afresh), "Name: value" or the blank line that ends them.
  void OnHeaderLine(absl::string_view line);

  // The next bytes of the body. false (nothing kept) when the body would
  // exceed max_body_bytes.
  bool OnBody(absl::string_view bytes);
  // The largest body accepted, for every later response; default unlimited.
  void set_max_body_bytes(int64_t bytes) { max_body_bytes_ = bytes; }

  // Decodes what arrived. Returns 0 when the response was a 2xx answer
  // carrying one output with binary data: `response` then holds it as a
  // softmax.v1 output (dtype, shape, data). Otherwise the gRPC code of the
  // failure, with `*error` saying what it was: the server's {"error"} message
  // under GrpcCodeOfHttpStatus of a non-2xx status, or INTERNAL (13) for a
  // 2xx answer that is not a well-formed binary inference response.
  int Finish(std::string* error);

  // The HTTP status of the response (0 before a status line).
  int http_status() const { return http_status_; }

 private:
  v1::SoftmaxResponse* response_ = nullptr;
  std::string* data_ = nullptr;  // response_'s output data
  std::string json_;             // the body up to header_length_ (all of it without one)
  int http_status_ = 0;
  int64_t header_length_ = -1;   // Inference-Header-Content-Length; -1 when absent
  int64_t content_length_ = -1;  // Content-Length; -1 when absent
  int64_t body_bytes_ = 0;
  int64_t max_body_bytes_ = INT64_MAX;
  bool malformed_header_ = false;  // an unparsable length header
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_HTTP_WIRE_H_
