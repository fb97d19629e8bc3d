// Builds and starts the gRPC server around a service: message size limits
// derived from the tensor limit, the standard health service and server
// reflection. GrpcListener is that server as Server's Listener; the
// in-process tests call StartGrpcServer themselves.
//
// Thread-safety: StartGrpcServer (and GrpcListener::Start) is not reentrant
// with itself (gRPC's global health/reflection switches); SetServing may be
// called from any thread.
#ifndef SOFTMAX_SERVER_RPC_GRPC_GRPC_SERVER_H_
#define SOFTMAX_SERVER_RPC_GRPC_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/listener.h"
#include "server/rpc/grpc/reset_guard.h"

namespace softmax::server {

// The name health checks use for the softmax service.
inline constexpr char kServiceName[] = "softmax.v1.SoftmaxService";
// The Open Inference Protocol's service, which health checks also answer for.
inline constexpr char kInferenceServiceName[] = "inference.GRPCInferenceService";

// Bytes a message may carry beyond its tensor (request_id, shape, framing).
inline constexpr int64_t kMessageHeadroomBytes = 64 * 1024;

struct GrpcServerOptions {
  // host:port to listen on; port 0 picks a free port.
  std::string address = "0.0.0.0:50051";
  // Largest tensor accepted; the receive and send limits are this plus
  // kMessageHeadroomBytes (capped at INT_MAX, gRPC's own limit). Larger
  // messages fail in gRPC with RESOURCE_EXHAUSTED.
  int64_t max_tensor_bytes = int64_t{1} << 30;
  // More services on the same port (inference.GRPCInferenceService); each
  // must outlive the server.
  std::vector<grpc::Service*> additional_services;
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS advertised to every client: calls
  // one connection may have open at once. Each open call holds its reactor
  // and buffers, so this bounds what one connection can pin.
  int max_concurrent_streams = 1024;
  // Memory gRPC's transport may hold for all connections (read buffers,
  // frames not yet parsed); past it gRPC reads less. 0: gRPC's default.
  int64_t transport_memory_bytes = 0;
  // TLS: PEM files of the server's certificate chain and key; both or
  // neither (plaintext). With client_ca_file too, every client must present
  // a certificate signed by that CA (mTLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Server reflection (grpcurl and friends can list and describe services).
  bool reflection = true;
  // A connection older than this (gRPC adds +-10% jitter) is sent a GOAWAY:
  // its open calls (streams too) live on until they end, new ones go to a
  // new connection, which a client or proxy balancing over several replicas
  // may open to another replica (one added since, say). 0: connections live
  // as long as their clients keep them.
  int64_t max_connection_age_ms = 0;
  // Counts premature resets of every method whose handler does not (the
  // services' own methods count theirs); may be null. Must outlive the server.
  PrematureResetGuard* reset_guard = nullptr;
};

// Transport timeouts (no flags: the same for every deployment).
// A client that has not completed the HTTP/2 handshake (preface and
// SETTINGS) by then is disconnected: a loopback or LAN handshake takes
// milliseconds, a TLS one over a slow WAN well under a second (gRPC's
// default of 120 s lets idle sockets pile up to the fd limit).
inline constexpr int kHandshakeTimeoutMs = 5000;
// A connection with no call open for this long is closed with a GOAWAY;
// clients reconnect in one round trip when they need it again.
inline constexpr int kMaxConnectionIdleMs = 5 * 60 * 1000;
// Keepalive pings on a quiet connection every minute, and a peer that does
// not answer within 20 s is gone (a half-open connection otherwise holds
// its socket and calls until TCP gives up, hours later).
inline constexpr int kKeepaliveTimeMs = 60 * 1000;
inline constexpr int kKeepaliveTimeoutMs = 20 * 1000;

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Starts serving `service` (which must outlive the server) with health
// (SERVING for "" and kServiceName) and, unless turned off, reflection.
// INVALID_ARGUMENT for unreadable or inconsistent TLS files; UNAVAILABLE
// when the address cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(const GrpcServerOptions& options,
                                              grpc::Service* service);

// Marks "", kServiceName and kInferenceServiceName SERVING or NOT_SERVING in
// the health service.
void SetServing(grpc::Server* server, bool serving);

// The gRPC server as a Listener. StopAccepting does nothing: gRPC 1.51
// closes its port only in Shutdown, which also sends every connection its
// GOAWAY, so the port stays open (and refusals reach callers) until then.
// Shutdown(deadline) runs grpc::Server::Shutdown on a thread of its own: new
// calls are refused, calls in flight get until `deadline`, then are
// cancelled. Destroying a started listener without Shutdown shuts it down
// at once.
class GrpcListener final : public Listener {
 public:
  // `service` and options.additional_services must outlive the listener.
  GrpcListener(GrpcServerOptions options, grpc::Service* service);
  ~GrpcListener() override;

  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  const char* name() const override { return "grpc"; }
  absl::Status Start() override;
  std::string BoundAddress() const override;
  void StopAccepting() override {}
  void Shutdown(absl::Time deadline) override;
  void Wait() override;

  // The bound port (0 before Start).
  int port() const { return running_.port; }
  // Health SERVING or NOT_SERVING (SetServing above). REQUIRES: started.
  void SetServing(bool serving);

 private:
  const GrpcServerOptions options_;
  grpc::Service* const service_;
  RunningServer running_;
  std::thread shutdown_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_GRPC_SERVER_H_
