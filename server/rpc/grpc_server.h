// Builds and starts the gRPC server around a service: message size limits
// derived from the tensor limit, the standard health service and server
// reflection. Shared by softmax-server's main and the in-process tests.
//
// Thread-safety: StartGrpcServer is not reentrant with itself (gRPC's global
// health/reflection switches); SetServing may be called from any thread.
#ifndef SOFTMAX_SERVER_GRPC_SERVER_H_
#define SOFTMAX_SERVER_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace softmax::server {

// The name health checks use for the softmax service.
inline constexpr char kServiceName[] = "softmax.v1.SoftmaxService";

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
};

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Starts serving `service` (which must outlive the server) with health
// (SERVING for "" and kServiceName) and reflection. UNAVAILABLE when the
// address cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(const GrpcServerOptions& options,
                                              grpc::Service* service);

// Marks "" and kServiceName SERVING or NOT_SERVING in the health service.
void SetServing(grpc::Server* server, bool serving);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_GRPC_SERVER_H_
