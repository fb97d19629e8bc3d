#include "client/load/http.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace softmax::client {
namespace {

// libcurl's receive and send buffers (CURLOPT_BUFFERSIZE, default 16 KiB;
// CURLOPT_UPLOAD_BUFFERSIZE, default 64 KiB, at most 2 MiB): each recv and
// send moves up to this much, and a body is copied through the send buffer.
// 64 x 32000 bfloat16 against the echo server, 4 callers, 2 cores: 3.3 ms of
// client CPU per request (system time 0.66 s per 400) against 4.5 ms (1.16 s)
// with the defaults.
constexpr long kReceiveBufferBytes = 512 * 1024;
constexpr long kUploadBufferBytes = 512 * 1024;
// Between attempts to reach a server whose port refused the connection.
constexpr auto kConnectRetryInterval = std::chrono::milliseconds(100);

// Status codes (gRPC's numbering) for transfers that failed before an answer
// was read.
constexpr int kDeadlineExceeded = static_cast<int>(absl::StatusCode::kDeadlineExceeded);
constexpr int kResourceExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);
constexpr int kUnavailable = static_cast<int>(absl::StatusCode::kUnavailable);

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t OnHeader(char* data, size_t size, size_t count, void* reader) {
  static_cast<HttpResponseReader*>(reader)->OnHeaderLine(absl::string_view(data, size * count));
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* sink) {
  auto* body = static_cast<HttpConnection::BodySink*>(sink);
  if (!body->reader->OnBody(absl::string_view(data, size * count))) {
    body->too_large = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  return size * count;
}

long Milliseconds(absl::Duration duration) {
  return duration == absl::InfiniteDuration() ? 0L
                                              : static_cast<long>(absl::ToInt64Milliseconds(duration));
}

}  // namespace

HttpPreparedRequest::HttpPreparedRequest(const std::string& base_url, HttpInferRequest request)
    : url_(base_url + request.path), request_(std::move(request)) {
  headers_ = curl_slist_append(headers_, "Content-Type: application/octet-stream");
  headers_ = curl_slist_append(
      headers_, absl::StrCat("Inference-Header-Content-Length: ", request_.header_length).c_str());
  headers_ = curl_slist_append(headers_, "Expect:");
}

HttpPreparedRequest::~HttpPreparedRequest() { curl_slist_free_all(headers_); }

HttpConnection::HttpConnection(const HttpConnectionOptions& options)
    : options_(options), curl_((InitCurlOnce(), curl_easy_init())) {}

HttpConnection::~HttpConnection() {
  if (curl_ != nullptr) curl_easy_cleanup(curl_);
}

absl::StatusOr<std::unique_ptr<HttpConnection>> HttpConnection::Open(
    const HttpConnectionOptions& options) {
  std::unique_ptr<HttpConnection> connection(new HttpConnection(options));
  CURL* curl = connection->curl_;
  if (curl == nullptr) return absl::InternalError("libcurl: curl_easy_init failed");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXCONNECTS, 1L);
  curl_easy_setopt(curl, CURLOPT_PROXY, "");  // straight to the server, whatever http_proxy says
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, kReceiveBufferBytes);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, kUploadBufferBytes);
  const absl::Duration connect_time_left =
      std::max(absl::Milliseconds(1), options.connect_deadline - absl::Now());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, Milliseconds(connect_time_left));
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, connection->error_buffer_);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &connection->reader_);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &connection->sink_);
  connection->reader_.set_max_body_bytes(options.max_response_bytes);

  // The check: GET /v2/health/live, retried while the port refuses.
  const std::string url = options.base_url + "/v2/health/live";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, Milliseconds(connect_time_left));
  v1::SoftmaxResponse scratch;
  std::string why;
  while (true) {
    connection->reader_.Start(&scratch);
    connection->sink_.too_large = false;
    connection->error_buffer_[0] = '\0';
    const CURLcode result = curl_easy_perform(curl);
    if (result == CURLE_OK) break;
    why = connection->error_buffer_[0] != '\0' ? connection->error_buffer_
                                               : curl_easy_strerror(result);
    if (result != CURLE_COULDNT_CONNECT ||
        absl::Now() + absl::FromChrono(kConnectRetryInterval) >= options.connect_deadline) {
      return absl::UnavailableError(absl::StrCat(
          "could not reach an HTTP server at ", options.base_url, " within ",
          absl::FormatDuration(options.connect_timeout), ": ", why,
          " (with --protocol=http, --target is the server's HTTP port, its --http_address)"));
    }
    std::this_thread::sleep_for(kConnectRetryInterval);
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, Milliseconds(options.timeout));
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  return connection;
}

int HttpConnection::Perform(std::string* error) {
  sink_.too_large = false;
  error_buffer_[0] = '\0';
  const CURLcode result = curl_easy_perform(curl_);
  if (result == CURLE_OK) return 0;
  const std::string why = error_buffer_[0] != '\0' ? error_buffer_ : curl_easy_strerror(result);
  if (result == CURLE_WRITE_ERROR && sink_.too_large) {
    *error = absl::StrCat("response body larger than ", options_.max_response_bytes,
                          " bytes (--max_message_bytes)");
    return kResourceExhausted;
  }
  *error = absl::StrCat("HTTP transfer failed: ", why);
  return result == CURLE_OPERATION_TIMEDOUT ? kDeadlineExceeded : kUnavailable;
}

int HttpConnection::Post(const HttpPreparedRequest& request, v1::SoftmaxResponse* response,
                         std::string* error) {
  curl_easy_setopt(curl_, CURLOPT_URL, request.url_.c_str());
  curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, request.headers_);
  // POSTFIELDS is not copied: libcurl sends from the request's body.
  curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE,
                   static_cast<curl_off_t>(request.request_.body.size()));
  curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, request.request_.body.data());
  reader_.Start(response);
  const int failed = Perform(error);
  if (failed != 0) return failed;
  return reader_.Finish(error);
}

}  // namespace softmax::client
