// The Open Inference Protocol over HTTP/REST (KServe v2 with Triton's binary
// tensor data, model configuration and statistics extensions), on civetweb.
//
// Endpoints: GET /v2/health/live, /v2/health/ready, /v2, /v2/models/stats,
// /v2/models/{model}[/versions/{v}], .../ready, .../config, .../stats;
// POST .../infer with JSON tensors or binary tensor data
// (Inference-Header-Content-Length, binary_data_size, binary_data_output,
// per-output binary_data). Errors are {"error": "..."} with the status of
// their code (kserve::HttpStatus): 400 invalid, 401 without a known bearer
// token, 404 unknown model or endpoint, 503 draining or overloaded.
//
// With TLS files (the gRPC port's), the port serves HTTPS only (TLS 1.2 or
// newer; see civetweb_tls.h); with a client CA, a client certificate it
// signed is required. With an authenticator, every endpoint but the health
// ones (/v2/health/live, /v2/health/ready, .../ready) needs
// `Authorization: Bearer <token>`.
//
// Each request is handled on one of civetweb's worker threads, which waits
// for the batcher's answer: at most kHttpRequestTimeout (the request's
// deadline in the batcher, which drops it after that), then 504.
//
// Thread-safety: Start/Stop and the Listener calls from one thread;
// handlers run on civetweb's.
#ifndef SOFTMAX_SERVER_RPC_HTTP_KSERVE_HTTP_H_
#define SOFTMAX_SERVER_RPC_HTTP_KSERVE_HTTP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/listener.h"
#include "server/rpc/auth.h"
#include "server/rpc/http/civetweb_tls.h"
#include "server/rpc/kserve.h"
#include "server/rpc/front_end.h"

struct mg_context;
struct mg_connection;

namespace softmax::server {

// Longest an HTTP inference request may take, queue included.
inline constexpr std::chrono::seconds kHttpRequestTimeout(60);
// civetweb worker threads: requests served at once (each waits for its
// answer on its thread); more connections wait for a free thread.
inline constexpr int kHttpThreads = 256;
// How long an idle keep-alive connection stays open (and holds its worker
// thread). civetweb's default, 500 ms (measured: closed 0.501 s after the
// last answer), made any client pausing longer connect again, with TLS a
// handshake per request, and opened a race for clients that reuse a
// connection just as it closes. 5 s is Apache's and Node.js's default. A
// stop waits up to 2 s for such a connection (civetweb looks for a stop
// between waits of at most 2 s): SIGTERM to exit 1.83 s against 0.83 s
// (2-core host).
inline constexpr int kHttpKeepAliveMs = 5000;

struct HttpServerOptions {
  // host:port; port 0 picks a free port.
  std::string address = "0.0.0.0:8000";
  std::string server_version;
  // TLS when tls.cert_file is set (with tls.key_file); plain HTTP otherwise.
  TlsFiles tls;
  // The shared-memory extensions (may be null: they answer 501). Must
  // outlive the server.
  SharedMemoryManager* shared_memory = nullptr;
};

// What an infer request asks for besides its tensor.
struct HttpInferOptions {
  // Binary output: request parameter binary_data_output, or an output's
  // binary_data. Otherwise outputs are JSON numbers.
  bool binary_output = false;
};

// Parses an infer request body: `header_length` bytes of JSON (all of it
// without Inference-Header-Content-Length), then the binary tensor data.
// Fills `parts` but model_name / model_version (from the URL), including
// parts->data_field; INVALID_ARGUMENT naming the field otherwise. What is
// checked later (BuildInferenceRequest, validation) is left to them.
absl::Status ParseHttpInferRequest(const std::string& body, int64_t header_length,
                                   kserve::InferRequestParts* parts, HttpInferOptions* options);

// The endpoint as a Listener whose stop is civetweb's (StoppedByOneCall):
// the port closes at once, and the stop returns once the handlers running
// have answered and the keep-alive connections have closed (up to
// kHttpKeepAliveMs' poll, 2 s).
class KServeHttpServer final : public StoppedByOneCall {
 public:
  // Starts nothing. `front_end`'s pointees and `statistics` must outlive
  // the server. Bodies are limited by front_end.limits.max_tensor_bytes
  // (JSON text takes more bytes per element than binary data); with
  // front_end.authenticator, requests other than health checks need one of
  // its tokens.
  KServeHttpServer(HttpServerOptions options, const FrontEnd& front_end,
                   kserve::ModelStatistics* statistics);
  ~KServeHttpServer() override;  // Stop()

  KServeHttpServer(const KServeHttpServer&) = delete;
  KServeHttpServer& operator=(const KServeHttpServer&) = delete;

  const char* name() const override { return "http"; }
  // Starts listening. UNAVAILABLE when the address cannot be bound or TLS
  // cannot be loaded; INVALID_ARGUMENT for unreadable or inconsistent TLS
  // files.
  absl::Status Start() override;
  // host:port actually bound.
  std::string BoundAddress() const override { return bound_address_; }

  // Closes the listener and waits for the handlers running. Idempotent.
  void Stop() override;

  // civetweb's request handler (public for its C callback).
  int Handle(mg_connection* connection);

 private:
  // /v2/systemsharedmemory/... and /v2/cudasharedmemory/...
  int SharedMemory(mg_connection* connection, const std::string& method,
                   const std::vector<std::string>& segments);

  const HttpServerOptions options_;
  const FrontEnd front_end_;
  kserve::ModelStatistics* const statistics_;
  mg_context* context_ = nullptr;
  std::string bound_address_;
  // Why the TLS setup failed (written by civetweb's init_ssl callback
  // during Start, on Start's thread).
  absl::Status tls_status_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_HTTP_KSERVE_HTTP_H_
