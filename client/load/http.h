// The HTTP transport of `softmax-client load --protocol=http`: keep-alive
// HTTP/1.1 connections to the server's KServe v2 HTTP/REST port, on libcurl.
//
// An HttpConnection is one libcurl easy handle holding one TCP connection
// (TCP_NODELAY, kept alive and reused; a new one is opened only if the server
// closed it). HTTP/1.1 has no multiplexing, so a connection carries one
// request at a time, and Post blocks its thread until the answer is read; the
// load engine runs one thread per connection. Request bodies are built once
// per payload (HttpPreparedRequest) and sent from there by reference; answers
// land in a SoftmaxResponse the caller reuses (client/load/http_wire.h).
//
// Thread-safety: an HttpPreparedRequest is immutable once built and may be
// sent by any number of connections at once. An HttpConnection is used by one
// thread at a time; distinct connections may be used concurrently.
#ifndef SOFTMAX_CLIENT_LOAD_HTTP_H_
#define SOFTMAX_CLIENT_LOAD_HTTP_H_

#include <cstdint>
#include <memory>
#include <string>

#include <curl/curl.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/load/http_wire.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// An inference request ready to send: its URL, body and HTTP headers.
// Not copyable or movable: connections send its bytes in place.
class HttpPreparedRequest {
 public:
  // `base_url` is ParseHttpTarget's "http://HOST:PORT".
  HttpPreparedRequest(const std::string& base_url, HttpInferRequest request);
  ~HttpPreparedRequest();
  HttpPreparedRequest(const HttpPreparedRequest&) = delete;
  HttpPreparedRequest& operator=(const HttpPreparedRequest&) = delete;

  const std::string& url() const { return url_; }
  const std::string& body() const { return request_.body; }

 private:
  friend class HttpConnection;
  const std::string url_;
  const HttpInferRequest request_;
  // Content-Type, Inference-Header-Content-Length, and an empty Expect (no
  // "100 Continue" round trip before a large body). Read-only once built.
  curl_slist* headers_ = nullptr;
};

struct HttpConnectionOptions {
  std::string base_url;  // "http://HOST:PORT" (ParseHttpTarget)
  // Deadline of each request; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Seconds(60);
  // Open keeps trying to reach the server until this time;
  // `connect_timeout` is what messages call it.
  absl::Time connect_deadline = absl::InfinitePast();
  absl::Duration connect_timeout = absl::Seconds(10);
  // The largest response body accepted; a larger one fails the request with
  // RESOURCE_EXHAUSTED, as a gRPC message over the limit does.
  int64_t max_response_bytes = INT32_MAX;
};

class HttpConnection {
 public:
  // Opens a connection and checks that an HTTP server answers on it
  // (GET /v2/health/live; any HTTP status will do, as a gRPC channel only
  // needs its connection). A refused connection is retried until
  // connect_deadline. UNAVAILABLE, naming the target and libcurl's
  // reason, when none answered in time or the peer does not speak HTTP/1.1
  // (a gRPC port, for instance).
  static absl::StatusOr<std::unique_ptr<HttpConnection>> Open(
      const HttpConnectionOptions& options);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Sends `request` and reads its answer into `response` (see
  // HttpResponseReader::Start: its output's buffer is reused). Returns 0 on
  // success, else a gRPC status code with `*error` saying why:
  // HttpResponseReader::Finish's for an answer that arrived,
  // DEADLINE_EXCEEDED past the timeout, RESOURCE_EXHAUSTED for a body over
  // max_response_bytes, UNAVAILABLE when the connection failed.
  int Post(const HttpPreparedRequest& request, v1::SoftmaxResponse* response,
           std::string* error);

  // Where libcurl's body callback puts what it reads.
  struct BodySink {
    HttpResponseReader* reader = nullptr;
    bool too_large = false;  // the body went past max_response_bytes
  };

 private:
  explicit HttpConnection(const HttpConnectionOptions& options);
  // curl_easy_perform with the handle's current request; the gRPC code of a
  // transfer that failed before an answer was read, else 0.
  int Perform(std::string* error);

  const HttpConnectionOptions options_;
  CURL* const curl_;
  HttpResponseReader reader_;
  BodySink sink_{&reader_};
  char error_buffer_[CURL_ERROR_SIZE] = {};
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_HTTP_H_
